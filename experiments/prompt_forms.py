"""How a raw model answers a task in each prompt form: the measurement behind a recipe's choice of form and reader.

For each form (chat or plain prompts, reasoning-gym's tags or the lenient reader, the plain form cut at the
newline as a searcher with ``TBA_STOP='["\\n"]'`` cuts it) the raw model's held-out greedy accuracy and its pass@1
and pass@k over ``--samples`` completions at the searchers' temperature, on the recipe's held-out prompts, with
the evaluation every run uses (:func:`tba.model.evaluation.evaluate_checkpoint`). A form worth training on starts
low (room to climb) with a high pass@k (a signal to climb on). ``--task-options`` measures another generator or
difficulty than the profile's, to screen candidate tasks for one with headroom.

Recorded under docs/results/data/real-model/ (``experiment: prompt-forms``) and shown on the real-model page.
``python -m experiments.prompt_forms [--profile real-model] [--samples 8] [--prompts 48] [--task-options JSON]``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from experiments.records import RESULTS, provenance, record_name, write

# name -> (chat template, reader, stop strings)
FORMS: dict[str, tuple[str, str, list[str]]] = {
    "chat-tags": ("on", "tags", []),
    "chat-lenient": ("on", "lenient", []),
    "plain-first-line": ("off", "tags", ["\n"]),
    "plain-lenient": ("off", "lenient", ["\n"]),
}


def measure(work: dict[str, Any], form: str, samples: int, prompts: int, threads: int) -> dict[str, Any]:
    """One form's figures for the raw model of ``work`` (experiments.peer.recipe's shape)."""
    from tba.model.evaluation import evaluate_checkpoint
    from tba.model.importer import resolve_model

    chat, reader, stop = FORMS[form]
    options = {**work["task_options"], "reader": reader}
    result = evaluate_checkpoint(
        resolve_model(work["model"]),
        work["task"],
        prompts,
        task_options=options,
        chat_template=chat,
        threads=threads,
        samples=samples,
        pass_k=(1, samples),
        temperature=work["temperature"],
        max_new_tokens=work["max_new_tokens"],
        system_prompt=work["system_prompt"],
        stop=stop,
    )
    return {
        "form": form,
        "chat": result["chat"],
        "reader": reader,
        "stop": stop,
        "prompts": result["n_prompts"],  # a small generator may hold fewer held-out prompts than asked for
        "greedy": result["greedy_accuracy"],
        "pass_at_k": result["pass_at_k"],
        "examples": result["examples"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.prompt_forms", description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="real-model", help="the tba up profile whose model and task to measure")
    parser.add_argument("--forms", default=",".join(FORMS), help=f"comma-separated, of: {', '.join(FORMS)}")
    parser.add_argument("--samples", type=int, default=8, help="completions per prompt for pass@k (default 8)")
    parser.add_argument("--prompts", type=int, default=None, help="held-out prompts (default: the profile's)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: the idle cores)")
    parser.add_argument("--model", default=None, help="another model than the profile's")
    parser.add_argument(
        "--task-options", default=None, help="the task's options as a JSON object (default: the profile's)"
    )
    parser.add_argument("--results", type=Path, default=RESULTS, help="the results folder (the record goes to data/)")
    args = parser.parse_args(argv)
    forms = args.forms.split(",")
    unknown = [f for f in forms if f not in FORMS]
    if unknown or args.samples < 1:
        parser.error(f"--forms: no form {unknown}" if unknown else "--samples must be at least 1")
    from experiments.peer import parse_task_options, recipe, task_label

    work = recipe(args.profile)
    own_options = work["task_options"]
    if args.model:
        work["model"] = args.model
    if args.task_options is not None:
        try:
            work["task_options"] = parse_task_options(work["task"], args.task_options)
        except ValueError as e:
            parser.error(f"--task-options: {e}")
    if work["model"] is None:
        parser.error(f"--model: the profile {args.profile!r} names no base model")
    prompts = args.prompts or work["eval_prompts"]
    rows = []
    for form in forms:
        rows.append(measure(work, form, args.samples, prompts, args.threads))
        row = rows[-1]
        print(f"{form}: greedy {row['greedy']:.1%}, pass@k {row['pass_at_k']}", flush=True)
    rec = {
        **provenance(),
        "experiment": "prompt-forms",
        "profile": args.profile,
        "model": str(work["model"]),
        "task": work["task"],
        "task_options": work["task_options"],
        "prompts": prompts,
        "samples": args.samples,
        "temperature": work["temperature"],
        "max_new_tokens": work["max_new_tokens"],
        "command": f"python -m experiments.prompt_forms --profile {args.profile} --samples {args.samples}"
        + (f" --forms {args.forms}" if forms != list(FORMS) else "")
        + (f" --task-options '{args.task_options}'" if args.task_options is not None else ""),
        "forms": rows,
    }
    name = record_name(f"prompt-forms-{task_label(work['task_options'], own_options)}", None, rec)
    print(f"wrote {write('real-model', name, rec, args.results / 'data')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
