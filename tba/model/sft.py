"""``tba model sft``: a short supervised warm-up, so RL starts from a weak but non-zero policy.

TB (like any RL from a sparse 0/1 reward) learns nothing from a policy that is
never right, and the paper's runs start from SFT checkpoints (docs/algorithm.md §6).
The tiny model is taught the task's supervised targets (``Task.sft_target``)
with the loss on completion tokens and EOS only, and stops as soon as its
greedy accuracy on held-out prompts reaches a target (about 30% on two-digit
addition): weak enough that RL has room to climb, strong enough that it gets
reward signal.

:func:`ensure_base_model` caches the result keyed on everything that
determines it, and builds it atomically, so the demo, the tests and concurrent
callers share one build and never see half a model.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tba.model.cache import default_cache_root
from tba.model.tiny import TinyModelSpec
from tba.model.tokenizer import CHAT_MODES, load_tokenizer, uses_chat

HELP = (
    "Supervised warm-up on a task's targets until held-out greedy accuracy reaches a target. "
    "Without --out: build the cached base model once (later calls find it) and print its path."
)

# Bump whenever a change to this module, the tokenizer or the tiny model alters
# the model ensure_base_model builds: it is part of the cache key.
CODE_VERSION = 2  # 2: keep the evaluated weights closest to the target
RESULT_FILE = "sft.json"  # written last: its presence marks a complete model directory


@dataclass(frozen=True)
class SFTConfig:
    """Hyper-parameters of the warm-up; tuned so two-digit addition lands at 20-50% within minutes."""

    lr: float = 5e-4  # 1e-3 took ~1.5-2x the steps, 2e-3 stalled below 10% (two-digit addition)
    batch_size: int = 64
    warmup_steps: int = 20
    weight_decay: float = 0.0
    max_steps: int = 4000
    eval_every: int = 10  # accuracy can jump 15 points in 25 steps: check often to stop near the target
    eval_prompts: int = 200
    target_accuracy: float = 0.3
    max_minutes: float = 15.0  # a guard: on an idle 2-core machine the target comes in about 2-3 minutes
    seed: int = 0

    def __post_init__(self) -> None:
        if self.lr <= 0 or self.batch_size < 1 or self.max_steps < 1 or self.eval_every < 1:
            raise ValueError("SFT needs lr > 0, batch_size >= 1, max_steps >= 1, eval_every >= 1")
        if not 0 < self.target_accuracy <= 1 or self.max_minutes <= 0 or self.eval_prompts < 1:
            raise ValueError("SFT needs 0 < target_accuracy <= 1, max_minutes > 0, eval_prompts >= 1")


@dataclass
class SFTResult:
    accuracy: float
    steps: int
    seconds: float
    reached_target: bool
    history: list[dict[str, float]] = field(default_factory=list)


Log = Callable[[str], None]


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _example(tokenizer: Any, task: Any, prompt: Any) -> tuple[list[int], list[int]]:
    """(prompt ids as the policy sees them: plain, or through the chat template for a task in chat form;
    target ids + EOS)."""
    from tba.model.evaluation import prompt_format_for

    target = tokenizer(task.sft_target(prompt), add_special_tokens=False)["input_ids"]
    return prompt_format_for(task).encode(tokenizer, prompt.text), list(target) + [tokenizer.eos_token_id]


def _batch(examples: list[tuple[list[int], list[int]]], pad_id: int) -> tuple[Any, Any, Any]:
    """Right-padded input ids, attention mask and labels (-100 outside completion + EOS), each (B, L)."""
    from tba.model.batches import pad_batch

    input_ids, attention_mask, completion = pad_batch([p for p, _ in examples], [c for _, c in examples], pad_id)
    return input_ids, attention_mask, input_ids.masked_fill(~completion, -100)


def _loss(model: Any, input_ids: Any, attention_mask: Any, labels: Any) -> Any:
    """Mean cross-entropy of the completion tokens (and EOS) given everything before them."""
    import torch.nn.functional as F

    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1]  # (B, L-1, V)
    targets = labels[:, 1:]  # token t+1 is predicted at position t
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100)


def train_sft(
    base_dir: str | Path,
    out_dir: str | Path,
    task: Any,
    config: SFTConfig | None = None,
    log: Log = _stderr,
    threads: int = 0,
) -> SFTResult:
    """Fine-tune ``base_dir`` on ``task`` and write the result to ``out_dir`` (atomically; must not exist).

    ``threads``: torch CPU threads (0: the idle cores, see :mod:`tba.model.threads`).
    """
    from tba.model.threads import torch_threads

    out_dir = Path(out_dir)
    if out_dir.exists():
        raise FileExistsError(f"{out_dir} already exists; remove it or choose another output directory")
    with torch_threads(threads) as n:
        log(f"sft: {n} torch thread(s)")
        return _train(Path(base_dir), out_dir, task, config or SFTConfig(), log)


def _train(base_dir: Path, out_dir: Path, task: Any, config: SFTConfig, log: Log) -> SFTResult:
    import torch

    from tba.model.evaluation import greedy_accuracy, load_model

    torch.manual_seed(config.seed)
    model, tokenizer = load_model(base_dir)
    eval_set = task.eval_prompts(config.eval_prompts)
    if not eval_set:
        raise ValueError(f"task {task.name!r} has no held-out prompts to evaluate on")
    max_new_tokens = max(len(_example(tokenizer, task, p)[1]) for p in eval_set) + 1
    stream = task.train_prompts(config.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr, betas=(0.9, 0.98), weight_decay=config.weight_decay)
    start, step = time.monotonic(), 0
    result = SFTResult(
        accuracy=greedy_accuracy(model, tokenizer, task, eval_set, max_new_tokens),
        steps=0,
        seconds=0.0,
        reached_target=False,
    )
    log(
        f"sft: {task.name}, {len(eval_set)} held-out prompts, start accuracy {result.accuracy:.1%}, "
        f"target {config.target_accuracy:.0%} within {config.max_minutes:g} min"
    )
    # Accuracy of a tiny model can jump 30 points between two checks: the weights of the check
    # closest to the target are kept, from below as well as above, so the base lands near it.
    below = (result.accuracy, _snapshot(model))
    model.train()
    while step < config.max_steps and result.accuracy < config.target_accuracy:
        if time.monotonic() - start > 60 * config.max_minutes:
            log(f"sft: time limit of {config.max_minutes:g} min reached")
            break
        step += 1
        for group in opt.param_groups:
            group["lr"] = config.lr * min(1.0, step / max(1, config.warmup_steps))
        batch = _batch(
            [_example(tokenizer, task, next(stream)) for _ in range(config.batch_size)], tokenizer.pad_token_id
        )
        loss = _loss(model, *batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % config.eval_every == 0:
            result.accuracy = greedy_accuracy(model, tokenizer, task, eval_set, max_new_tokens)
            seconds = time.monotonic() - start
            result.history.append(
                {"step": step, "seconds": round(seconds, 2), "loss": round(loss.item(), 4), "accuracy": result.accuracy}
            )
            if step % (5 * config.eval_every) == 0 or result.accuracy >= config.target_accuracy:
                log(
                    f"sft: step {step:5d}  {seconds:6.1f}s  loss {loss.item():.3f}  "
                    f"held-out greedy accuracy {result.accuracy:.1%}"
                )
            if result.accuracy < config.target_accuracy:
                below = (result.accuracy, _snapshot(model))
    result.reached_target = result.accuracy >= config.target_accuracy
    if result.reached_target and result.accuracy - config.target_accuracy > config.target_accuracy - below[0]:
        model.load_state_dict(below[1])
        log(f"sft: overshot to {result.accuracy:.1%}; keeping the last check below the target ({below[0]:.1%})")
    result.accuracy = greedy_accuracy(model, tokenizer, task, eval_set, max_new_tokens)
    result.steps, result.seconds = step, round(time.monotonic() - start, 2)
    _save(
        model,
        tokenizer,
        out_dir,
        {
            "result": asdict(result),
            "config": asdict(config),
            "task": task.name,
            "chat": task.chat,
            "base": str(base_dir),
        },
    )
    log(
        f"sft: final held-out greedy accuracy {result.accuracy:.1%} after {step} steps, {result.seconds:.0f}s"
        + ("" if result.reached_target else " (target NOT reached)")
    )
    return result


def _snapshot(model: Any) -> dict[str, Any]:
    """A copy of the weights (a few MB for the tiny model)."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _save(model: Any, tokenizer: Any, out_dir: Path, record: dict[str, Any]) -> None:
    """Write model, tokenizer and generation config into a temporary sibling, then rename it into place."""
    from transformers import GenerationConfig

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".tmp-{out_dir.name}-{uuid.uuid4().hex[:8]}"
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        GenerationConfig(
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        ).save_pretrained(tmp)
        (tmp / RESULT_FILE).write_text(json.dumps(record, indent=2))
        os.rename(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def cache_key(task: str, options: dict[str, Any], spec: TinyModelSpec, seed: int, config: SFTConfig) -> str:
    """Hash of everything that determines the model ensure_base_model builds."""
    from tba.model.tokenizer import CHARACTERS, SPECIAL_TOKENS

    spec_fields = {
        "task": task,
        "options": options,
        "spec": asdict(spec),
        "init_seed": seed,
        "sft": asdict(config),
        "code": CODE_VERSION,
        "vocab": SPECIAL_TOKENS + [CHARACTERS],
    }
    return hashlib.sha256(json.dumps(spec_fields, sort_keys=True, default=str).encode()).hexdigest()[:16]


def ensure_base_model(
    cache_root: str | Path | None = None,
    task: str = "arithmetic",
    options: dict[str, Any] | None = None,
    *,
    spec: TinyModelSpec | None = None,
    seed: int = 0,
    config: SFTConfig | None = None,
    log: Log = _stderr,
    threads: int = 0,
) -> Path:
    """The SFT base model for ``task``: from the cache when built before, else built now (minutes).

    Concurrent callers wait on a file lock for one build; the directory appears
    by rename only when complete.
    """
    from tba.tasks import make_task

    options = dict(options or {})
    spec, config = spec or TinyModelSpec(), config or SFTConfig()
    root = Path(cache_root).expanduser() if cache_root is not None else default_cache_root()
    final = root / f"{task}-{cache_key(task, options, spec, seed, config)}"
    if (final / RESULT_FILE).is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".lock-{final.name}", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released by the OS if this process dies
        if (final / RESULT_FILE).is_file():
            return final
        for stale in root.glob(f".tmp-{final.name}-*"):  # a crashed builder's leftovers (we hold the lock)
            shutil.rmtree(stale, ignore_errors=True)
        init_dir = root / f".tmp-{final.name}-init"
        try:
            from tba.model.tiny import init_model

            log(f"sft: building the {task} base model in {final} (cached for later runs)")
            init_model(init_dir, spec, seed=seed)
            train_sft(init_dir, final, make_task(task, options), config, log=log, threads=threads)
        finally:
            shutil.rmtree(init_dir, ignore_errors=True)
    return final


def read_result(model_dir: str | Path) -> dict[str, Any]:
    """The record an SFT run left in its output directory (accuracy, steps, config)."""
    return json.loads((Path(model_dir) / RESULT_FILE).read_text())


def _config_from_args(args: argparse.Namespace) -> SFTConfig:
    return SFTConfig(
        lr=args.lr,
        batch_size=args.batch_size,
        max_steps=args.max_steps,
        eval_every=args.eval_every,
        eval_prompts=args.eval_prompts,
        target_accuracy=args.target_accuracy,
        max_minutes=args.max_minutes,
        seed=args.seed,
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = SFTConfig()
    parser.add_argument("--base", type=Path, help="Model to start from (default: a fresh tiny model; needs --out).")
    parser.add_argument(
        "--out",
        type=Path,
        help="Output directory (must not exist). Default: the shared cache (~/.cache/tba/models, or TBA_CACHE_DIR).",
    )
    parser.add_argument("--task", default="arithmetic", help="Task whose supervised targets to learn.")
    parser.add_argument("--task-options", default="{}", help="Task options as JSON, e.g. '{\"digits\": 2}'.")
    parser.add_argument(
        "--chat-template",
        choices=CHAT_MODES,
        default="auto",
        help="Prompts through the model's chat template, as the searchers' TBA_CHAT_TEMPLATE: on, off, or auto "
        "(when the --base model has one).",
    )
    parser.add_argument(
        "--target-accuracy",
        type=float,
        default=d.target_accuracy,
        help="Stop when held-out greedy accuracy reaches this.",
    )
    parser.add_argument("--max-minutes", type=float, default=d.max_minutes, help="Stop after this long anyway.")
    parser.add_argument("--max-steps", type=int, default=d.max_steps, help="Stop after this many steps anyway.")
    parser.add_argument("--lr", type=float, default=d.lr, help="Peak learning rate (AdamW, linear warm-up).")
    parser.add_argument("--batch-size", type=int, default=d.batch_size, help="Examples per step.")
    parser.add_argument("--eval-every", type=int, default=d.eval_every, help="Steps between accuracy checks.")
    parser.add_argument("--eval-prompts", type=int, default=d.eval_prompts, help="Held-out prompts per check.")
    parser.add_argument("--seed", type=int, default=d.seed, help="Seed of the data stream and of training.")
    parser.add_argument("--threads", type=int, default=0, help="Torch CPU threads (0: the idle cores).")


def _train_to(base: Path | None, out: Path, task: Any, config: SFTConfig, seed: int, threads: int) -> None:
    """``tba model sft --out``: from ``base``, or from a fresh tiny model initialised with ``seed``."""
    if out.exists():
        raise FileExistsError(f"{out} already exists; remove it or choose another output directory")
    if base is not None:
        train_sft(base, out, task, config, log=print, threads=threads)
        return
    from tba.model.tiny import init_model

    init_dir = out.parent / f".tmp-{out.name}-init"
    try:
        init_model(init_dir, seed=seed)
        train_sft(init_dir, out, task, config, log=print, threads=threads)
    finally:
        shutil.rmtree(init_dir, ignore_errors=True)


def _chat(base: Path | None, mode: str) -> bool:
    """Whether the warm-up's prompts go through the chat template: as a searcher decides for the same model."""
    if base is None:  # a fresh tiny model: its tokenizer has no template
        if mode == "on":
            raise ValueError("--chat-template on needs a --base model with a chat template")
        return False
    return uses_chat(load_tokenizer(base), mode)


def main(args: argparse.Namespace) -> int:
    try:
        options = json.loads(args.task_options)
        config = _config_from_args(args)
    except ValueError as err:
        print(f"tba model sft: {err}", file=sys.stderr)
        return 2
    from tba.tasks import make_task

    if args.out is None and args.base is not None:
        print(
            "tba model sft: --base needs --out (the cache holds only models built from a fresh init)", file=sys.stderr
        )
        return 2
    try:
        task = make_task(args.task, options, chat=_chat(args.base, args.chat_template))
        if args.out is None:
            out = ensure_base_model(
                task=args.task, options=options, seed=args.seed, config=config, log=print, threads=args.threads
            )
        else:
            out = args.out
            _train_to(args.base, out, task, config, args.seed, args.threads)
    except (ValueError, OSError) as err:
        print(f"tba model sft: {err}", file=sys.stderr)
        return 2
    rec = read_result(out)["result"]
    print(
        f"model: {out}\nheld-out greedy accuracy: {rec['accuracy']:.1%} ({rec['steps']} steps, {rec['seconds']:.0f}s)"
    )
    return 0
