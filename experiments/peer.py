"""The peer on the same work: TRL's ``GRPOTrainer`` (PyPI ``trl``) on a task of ours, under a wall-clock budget.

The same model, the same training prompts (the task's seeded stream), the same reward (the task's answer
reader), and the same held-out evaluation as ``tba up`` runs (:func:`tba.model.evaluation.attempts`:
greedy, the prompts asked in the same form, read where the searchers' completions end), on the same cores,
so that a run of this module and a run of ``tba up`` compare side by side. TRL's own loop: it generates
with transformers' ``generate`` and trains on its own samples, exactly on-policy, one process.

Configuration (:data:`GRPO`, every field written into the run's ``summary.json``): P=8 prompts x G=8
completions per step (64 samples, as the TBA recipe's step), the searchers' temperature over the full
distribution (top_k 0), the searchers' completion length, AdamW at a constant 1e-5, KL coefficient beta 0.05
(TRL's k3 estimator against the initial weights), TRL's default loss (``dapo``) and group-scaled advantages,
gradients clipped at 1, on the CPU in the precision the recipe's trainer computes in there (bf16 autocast over
float32 weights where the profile sets ``TBA_DTYPE=bfloat16`` and the CPU does bf16 arithmetic, else float32:
:func:`tba.model.precision.compute_dtype`). The work itself (model, task and options, completion length,
system prompt, temperature, held-out prompts) comes from a ``tba up`` profile (``--profile``, default
``real-model``), so that the peer and the recipe cannot drift apart.

Time runs from the start of training; the held-out evaluation (every ``--eval-every`` seconds of training,
and at the start and the end) pauses the clock, as ``tba up``'s evaluation runs beside the trainer without
holding it up. ``summary.json`` holds ``evaluations`` (``t``, ``step``, ``accuracy``) in the shape of a
``tba up`` run's, so the experiments' time-to-target functions read both.

``python -m experiments.peer --minutes 20 --seed 0 --out runs/peer-0`` (``--profile``; ``--model``, ``--task``,
``--task-options`` override the profile's, as ``tba up`` takes them).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# TRL's GRPOConfig as this peer runs it; the run's summary records the whole resolved configuration.
GRPO: dict[str, Any] = dict(
    per_device_train_batch_size=64,  # completions per step: P=8 prompts x num_generations
    num_generations=8,
    gradient_accumulation_steps=1,
    max_completion_length=64,
    temperature=0.7,
    top_k=0,
    learning_rate=1e-5,
    lr_scheduler_type="constant",
    warmup_steps=0,
    beta=0.05,
    max_grad_norm=1.0,
    use_cpu=True,
    bf16=False,
    fp16=False,
    logging_steps=1,
    save_strategy="no",
    report_to="none",
    disable_tqdm=True,
    dataloader_num_workers=0,
    max_steps=1_000_000,  # the wall-clock budget ends the run
)
TRAIN_PROMPTS = 50_000  # more than a run of any budget here draws (8 per step)


class Clock:
    """Seconds of training: wall time since :meth:`start`, less the time spent evaluating."""

    def __init__(self, now: Callable[[], float] = time.monotonic) -> None:
        self.now = now
        self.t0: float | None = None
        self.paused = 0.0

    def start(self) -> None:
        self.t0 = self.now()

    def elapsed(self) -> float:
        return 0.0 if self.t0 is None else self.now() - self.t0 - self.paused

    def pause_while(self, fn: Callable[[], Any]) -> Any:
        started = self.now()
        try:
            return fn()
        finally:
            self.paused += self.now() - started


def completion_text(completion: Any) -> str:
    """A TRL completion as text: a string (plain prompts) or the assistant's messages (conversational)."""
    if isinstance(completion, str):
        return completion
    return "".join(m.get("content", "") for m in completion if isinstance(m, dict))


def make_reward(task: Any, prompts: dict[str, Any]) -> Callable[..., list[float]]:
    """TRL's reward function for ``task``: the dataset's ``prompt_id`` column names the prompt to score against."""

    def reward(completions: list[Any], prompt_id: list[str], **_: Any) -> list[float]:
        return [task.reward(prompts[i], completion_text(c)) for c, i in zip(completions, prompt_id, strict=True)]

    reward.__name__ = f"{task.name}_reward"
    return reward


def train_dataset(task: Any, seed: int, n: int, system_prompt: str | None) -> tuple[Any, dict[str, Any]]:
    """The task's first ``n`` training prompts of ``seed`` as a TRL dataset (conversational in chat form),
    and the prompts by id for the reward."""
    from datasets import Dataset

    rows, by_id = [], {}
    stream = task.train_prompts(seed=seed)
    while len(rows) < n:
        p = next(stream)
        by_id[p.prompt_id] = p
        if task.chat:
            messages = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + [
                {"role": "user", "content": p.text}
            ]
            rows.append({"prompt": messages, "prompt_id": p.prompt_id})
        else:
            rows.append({"prompt": p.text, "prompt_id": p.prompt_id})
    return Dataset.from_list(rows), by_id


def run(
    model: Path,
    task_name: str,
    task_options: dict[str, Any],
    minutes: float,
    seed: int,
    out: Path,
    *,
    eval_prompts: int = 48,
    eval_every: float = 30.0,
    chat_template: str = "auto",
    system_prompt: str | None = None,
    threads: int = 0,
    overrides: dict[str, Any] | None = None,
    train_prompts: int = TRAIN_PROMPTS,
) -> dict[str, Any]:
    """One TRL GRPO run of ``minutes`` of training; its summary (also written to ``out/summary.json``), each
    evaluation appended to ``out/evals.jsonl`` and each step's TRL metrics to ``out/steps.jsonl`` as they come.
    ``overrides``: fields of :data:`GRPO` to change."""
    import torch
    import transformers
    import trl
    from transformers import AutoModelForCausalLM, TrainerCallback

    from tba.model.evaluation import attempts, prompt_format_for
    from tba.model.tokenizer import load_tokenizer, uses_chat
    from tba.tasks import make_task

    if threads:
        torch.set_num_threads(threads)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = load_tokenizer(model)
    task = make_task(task_name, task_options, chat=uses_chat(tokenizer, chat_template))
    held_out = task.eval_prompts(eval_prompts)
    fmt = prompt_format_for(task, system_prompt)
    settings = {**GRPO, **(overrides or {})}
    evaluations: list[dict[str, Any]] = []
    clock = Clock()

    def evaluate(policy: Any, step: int) -> None:
        def measure() -> float:
            training = policy.training
            policy.eval()
            try:
                with torch.no_grad():
                    _, rewards = attempts(
                        policy,
                        tokenizer,
                        task,
                        held_out,
                        max_new_tokens=settings["max_completion_length"],
                        prompt_format=fmt,
                    )
            finally:
                policy.train(training)
            return sum(task.success(r) for r in rewards) / len(held_out)

        t = clock.elapsed()
        accuracy = clock.pause_while(measure)
        evaluations.append({"t": t, "step": step, "accuracy": accuracy})
        print(f"[peer] t={t:.0f}s step {step}: held-out greedy accuracy {accuracy:.1%}", flush=True)
        with (out / "evals.jsonl").open("a") as f:
            f.write(json.dumps(evaluations[-1]) + "\n")

    class Budget(TrainerCallback):
        """Evaluates every ``eval_every`` seconds of training and stops the run when its time is up."""

        next_eval = eval_every

        def on_train_begin(self, args, state, control, **kwargs):
            clock.start()

        def on_log(self, args, state, control, logs=None, **kwargs):
            with (out / "steps.jsonl").open("a") as f:
                f.write(json.dumps({"t": clock.elapsed(), "step": state.global_step, **(logs or {})}) + "\n")

        def on_step_end(self, args, state, control, model=None, **kwargs):
            done = clock.elapsed() >= minutes * 60
            if done or clock.elapsed() >= self.next_eval:
                evaluate(model, state.global_step)
                self.next_eval = (clock.elapsed() // eval_every + 1) * eval_every
            control.should_training_stop = done
            return control

    policy = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32)
    evaluate(policy, 0)  # the raw model: every time to a target counts from here
    dataset, by_id = train_dataset(task, seed, train_prompts, system_prompt)
    with tempfile.TemporaryDirectory(prefix="tba-peer-") as work:
        config = trl.GRPOConfig(output_dir=work, seed=seed, **settings)
        trainer = trl.GRPOTrainer(
            model=policy,
            reward_funcs=make_reward(task, by_id),
            args=config,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[Budget()],
        )
        trainer.remove_callback(transformers.PrinterCallback)  # each step's metrics go to steps.jsonl instead
        started = time.time()
        trainer.train()
        steps = trainer.state.global_step
        resolved = {k: v for k, v in config.to_dict().items() if isinstance(v, str | int | float | bool | type(None))}
    summary = {
        "arm": "trl-grpo",
        "seed": seed,
        "budget_s": minutes * 60,
        "model": str(model),
        "task": task_name,
        "task_options": task_options,
        "chat": task.chat,
        "eval_prompts": len(held_out),
        "evaluations": evaluations,
        "steps": steps,
        "samples_trained": steps * settings["per_device_train_batch_size"],
        "wall_s": time.time() - started,
        "settings": resolved,
        "versions": {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__},
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def recipe(profile_name: str) -> dict[str, Any]:
    """The work a ``tba up`` profile describes, as this peer takes it: the model, the task and its options, the
    completion length, the system prompt and the sampling temperature the searchers use, the held-out prompts."""
    from tba.local.checks import profile_env
    from tba.local.profile import Profile
    from tba.settings import ModelSettings, SearcherSettings, load_settings

    profile = Profile.load(profile_name)
    task = os.environ.get("TBA_TASK") or profile.run.get("task", "arithmetic")
    with profile_env(profile.settings("searcher", None)):
        s = load_settings(SearcherSettings, task=task)
    with profile_env(profile.settings("trainer", None)):
        dtype = load_settings(ModelSettings, task=task).dtype  # the trainer's TBA_DTYPE, as tba up resolves it
    return {
        "model": profile.run.get("base-model"),
        "task": task,
        "task_options": s.task_options,
        "eval_prompts": profile.run.get("eval-prompts", 48),
        "max_new_tokens": s.max_new_tokens,
        "system_prompt": s.system_prompt,
        "chat_template": s.chat_template,
        "temperature": s.temperature,
        "dtype": dtype,
    }


def parse_task_options(task: str, text: str) -> dict[str, Any]:
    """A ``--task-options`` value read and checked against ``task`` before any model is loaded: ValueError with
    what is wrong with it otherwise."""
    from tba.tasks import make_task

    try:
        options = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON ({e}): {text!r}") from None
    if not isinstance(options, dict):
        raise ValueError(f"not a JSON object: {text!r}")
    try:
        make_task(task, options)
    except ImportError as e:
        raise ValueError(str(e)) from None
    return options


def task_label(options: dict[str, Any], own: dict[str, Any]) -> str:
    """What a record of this work measures, for its name: the generator (``chain-sum``), with a digest of the
    options where they are not the profile's own, so that records of several difficulties of one generator
    keep apart."""
    from experiments.records import slug

    name = slug(str(options.get("dataset", "task")))
    if options == own:
        return name
    return f"{name}-{hashlib.sha256(json.dumps(options, sort_keys=True).encode()).hexdigest()[:6]}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.peer", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--profile",
        default="real-model",
        help="the tba up profile whose work this peer does: model, task and options, completion length, system "
        "prompt, temperature and held-out prompts (default: real-model); the flags below override it",
    )
    parser.add_argument("--model", default=None, help="model directory or packaged model name")
    parser.add_argument("--task", default=None)
    parser.add_argument("--task-options", default=None, help="task options as JSON")
    parser.add_argument(
        "--minutes", type=float, default=20.0, help="training budget (wall clock, evaluations excluded)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-prompts", type=int, default=None)
    parser.add_argument("--eval-every", type=float, default=30.0, help="seconds of training between evaluations")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--out", type=Path, required=True, help="run directory (summary.json, evals.jsonl)")
    args = parser.parse_args(argv)
    from tba.local.profile import ProfileError
    from tba.settings import SettingsError

    try:
        work = recipe(args.profile)
    except (ProfileError, SettingsError) as err:
        parser.error(f"--profile: {err}")
    for name in ("model", "task", "eval_prompts"):
        if getattr(args, name) is not None:
            work[name] = getattr(args, name)
    if args.task_options is not None:
        try:
            work["task_options"] = parse_task_options(work["task"], args.task_options)
        except ValueError as e:
            parser.error(f"--task-options: {e}")
    if args.minutes <= 0 or args.eval_every <= 0 or work["eval_prompts"] < 1:
        parser.error("need --minutes > 0, --eval-every > 0 and --eval-prompts >= 1")
    if work["model"] is None:
        parser.error(f"--model: the profile {args.profile!r} names no base model")
    from tba.model.importer import resolve_model
    from tba.model.precision import compute_dtype

    run(
        resolve_model(work["model"]),
        work["task"],
        work["task_options"],
        args.minutes,
        args.seed,
        args.out,
        eval_prompts=work["eval_prompts"],
        eval_every=args.eval_every,
        chat_template=work["chat_template"],
        system_prompt=work["system_prompt"],
        threads=args.threads,
        overrides={
            "max_completion_length": work["max_new_tokens"],
            "temperature": work["temperature"],
            "bf16": compute_dtype(work["dtype"], "cpu") == "bfloat16",
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
