"""``tba eval``: a model or checkpoint on a task's held-out prompts (tba/model/evaluation.py computes it)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from tba.model.evaluation import evaluate_checkpoint

HELP = "Evaluate a model or checkpoint on a task's held-out prompts: greedy pass@1, pass@k, distinct answers."


def format_table(result: dict[str, Any]) -> str:
    """The result as a small table for people."""
    from io import StringIO

    from rich.console import Console
    from rich.table import Table

    table = Table()
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("pass@1 (greedy)", f"{result['greedy_accuracy']:.1%}")
    for k, v in result["pass_at_k"].items():
        table.add_row(f"pass@{k} (n={result['samples']}, T={result['temperature']})", f"{v:.1%}")
    if result["sampled_reward"] is not None:
        table.add_row("mean sampled reward", f"{result['sampled_reward']:.3f}")
    if result["distinct_correct"] is not None:
        table.add_row(
            f"distinct correct answers / prompt (of {result['samples']})", f"{result['distinct_correct']:.2f}"
        )
    table.add_row("seconds", f"{result['eval_seconds']:.1f}")
    buf = StringIO()
    console = Console(file=buf, width=100)
    form = "chat" if result.get("chat") else "plain"
    console.print(
        f"{result['task']} ({form} prompts): {result['n_prompts']} held-out prompts, model {result.get('model', '?')}",
        soft_wrap=True,
        highlight=False,
    )
    console.print(table)
    return buf.getvalue()


def _ks(text: str) -> list[int]:
    try:
        ks = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--pass-k must be comma-separated integers, got {text!r}") from None
    if not ks or min(ks) < 1:
        raise argparse.ArgumentTypeError(f"--pass-k values must be >= 1, got {text!r}")
    return ks


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "checkpoint", type=Path, help="Model or LoRA adapter directory, or checkpoint root (its LATEST is used)."
    )
    parser.add_argument(
        "--base",
        type=Path,
        default=None,
        help="Base model of a LoRA adapter (default: the directory the adapter records).",
    )
    parser.add_argument("--task", default="arithmetic", help="Task name (arithmetic, countdown, gsm8k, reward-model).")
    parser.add_argument("--task-options", default="{}", help="Task options as JSON, e.g. '{\"digits\": 2}'.")
    parser.add_argument("--n-prompts", type=int, default=200, help="Held-out prompts to evaluate.")
    parser.add_argument("--samples", type=int, default=16, help="n: samples per prompt for pass@k (0: greedy only).")
    parser.add_argument("--pass-k", type=_ks, default=[1, 4, 16], help="k values of pass@k, comma-separated.")
    parser.add_argument("--temperature", type=float, default=0.7, help="Sampling temperature T.")
    parser.add_argument("--max-new-tokens", type=int, default=16, help="Largest completion length.")
    parser.add_argument(
        "--chat-template",
        choices=["auto", "on", "off"],
        default="auto",
        help="Ask prompts through the model's chat template: auto (when it has one), on, off.",
    )
    parser.add_argument("--system-prompt", default=None, help="System message before each chat prompt.")
    parser.add_argument(
        "--stop",
        default="[]",
        help="Stop strings as a JSON list, as TBA_STOP: a completion ends with the token that completes one, "
        "keeping it, as the searchers' do (e.g. '[\"\\n\"]').",
    )
    parser.add_argument("--seed", type=int, default=0, help="Sampling seed.")
    parser.add_argument("--threads", type=int, default=0, help="Torch CPU threads (0: the idle cores).")
    parser.add_argument("--json", action="store_true", help="Print the result as JSON (for scripts).")


def main(args: argparse.Namespace) -> int:
    try:
        options = json.loads(args.task_options)
    except ValueError:
        print(f"tba eval: --task-options is not valid JSON: {args.task_options!r}", file=sys.stderr)
        return 2
    try:
        stop = json.loads(args.stop)
    except ValueError:
        stop = None
    if not isinstance(stop, list) or not all(isinstance(x, str) and x for x in stop):
        print(f"tba eval: --stop must be a JSON list of non-empty strings, got {args.stop!r}", file=sys.stderr)
        return 2
    if args.n_prompts < 1 or args.samples < 0 or args.temperature <= 0 or args.max_new_tokens < 1:
        print(
            "tba eval: need --n-prompts >= 1, --samples >= 0, --temperature > 0, --max-new-tokens >= 1", file=sys.stderr
        )
        return 2
    ks = [k for k in args.pass_k if k <= args.samples] if args.samples else []
    if args.samples and len(ks) < len(args.pass_k):
        print(f"tba eval: dropping pass@k with k > --samples ({args.samples})", file=sys.stderr)
    from tba.checkpoints import CheckpointError
    from tba.tasks import make_task

    try:
        make_task(args.task, options)  # a bad name or option fails before the model loads
        result = evaluate_checkpoint(
            args.checkpoint,
            args.task,
            args.n_prompts,
            task_options=options,
            chat_template=args.chat_template,
            samples=args.samples,
            pass_k=ks,
            temperature=args.temperature,
            max_new_tokens=args.max_new_tokens,
            seed=args.seed,
            threads=args.threads,
            system_prompt=args.system_prompt,
            stop=stop,
            base=args.base,
        )
    except (ValueError, OSError, CheckpointError) as err:
        print(f"tba eval: {err}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2) if args.json else format_table(result))
    return 0
