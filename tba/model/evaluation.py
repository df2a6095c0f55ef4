"""How good is a model on a task's held-out prompts: the evaluation that SFT, ``tba eval``, ``tba up``'s
evaluations and the experiments share.

Three figures, all on the fixed held-out set (``Task.eval_prompts``), which no
searcher ever trains on:

- pass@1 (greedy): fraction of prompts whose greedy completion is correct;
- pass@k (sampled at temperature T): the unbiased estimator of Chen et al.
  2021 (arXiv 2107.03374) from n samples per prompt, c of them correct,
  ``1 - C(n-c, k) / C(n, k)``;
- for multi-answer tasks (countdown), the mean number of distinct correct
  answers (``Task.answer_key``) among the n samples of a prompt.

A completion is correct when its reward is positive (binary tasks: reward 1).
Decoding is transformers with a KV cache (:mod:`tba.model.generate`), so SFT,
this command and the end-to-end report evaluate in-process without a vLLM
engine. Prompts are asked as the searchers ask them: in chat form through the
model's chat template when the task is (``--chat-template``, as ``TBA_CHAT_TEMPLATE``),
and a completion ends where a searcher's would: at EOS, or with the token that completes
one of the stop strings (``--stop``, as ``TBA_STOP``), which it keeps (:func:`cut_at_stop`),
so the answer reader sees the text the searchers' reward sees.
:func:`evaluate_checkpoint` is the entry point for scripts; the command is tba/local/evaluate.py.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (Chen et al. 2021)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def resolve_model_dir(path: str | Path) -> Path:
    """A model or adapter directory as is; a checkpoint root through its verified LATEST manifest."""
    from tba.checkpoints import CheckpointStore
    from tba.model.adapters import is_adapter

    path = Path(path)
    if (path / "config.json").is_file() or is_adapter(path):
        return path
    store = CheckpointStore(path)
    manifest = store.read_manifest()
    if manifest is None:
        raise ValueError(f"{path} is neither a model directory (no config.json) nor a checkpoint root (no LATEST)")
    return store.verify(manifest)


def load_model(model_dir: str | Path, device: str = "cpu", base: str | Path | None = None) -> tuple[Any, Any]:
    """(model in eval mode, tokenizer) of a Hugging Face directory, fp32; a LoRA adapter directory is merged
    into its base model (``base``, or the one the adapter records), with the base's tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM

    from tba.model.adapters import base_of, is_adapter, load_for_inference
    from tba.model.tokenizer import load_tokenizer

    if is_adapter(model_dir):
        return load_for_inference(model_dir, base, device), load_tokenizer(base_of(model_dir, base))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model = model.to(device).eval()  # type: ignore[arg-type]  # transformers types .to as an unbound wrapper
    return model, load_tokenizer(model_dir)


def cut_at_stop(ids: Sequence[int], tokenizer: Any, stops: Sequence[str]) -> tuple[list[int], bool]:
    """``ids`` up to and including the first token whose decode completes one of ``stops``, and whether one did.

    This is vLLM's stop-string rule with the stop string kept in the output (the searchers' setting): the
    engine checks the detokenized text after every token and ends the completion at the token that made a
    stop string appear, so its ids may carry a few characters past the stop string, and so do these."""
    ids = list(ids)
    if stops:
        for k in range(len(ids)):
            text = tokenizer.decode(ids[: k + 1])
            if any(s in text for s in stops):
                return ids[: k + 1], True
    return ids, False


def complete(
    model: Any,
    tokenizer: Any,
    texts: Sequence[str],
    *,
    max_new_tokens: int = 16,
    temperature: float = 0.0,
    seed: int | None = None,
    prompt_format: Any = None,
    stop: Sequence[str] = (),
) -> list[str]:
    """Completion texts (EOS removed) of prompt texts, each ending at EOS or at the first of ``stop``
    (:func:`cut_at_stop`); greedy when ``temperature`` is 0."""
    from tba.model.generate import eos_ids, generate, strip_eos
    from tba.model.tokenizer import PLAIN

    fmt = prompt_format or PLAIN
    eos = eos_ids(model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    ids = generate(
        model,
        [fmt.encode(tokenizer, t) for t in texts],
        max_new_tokens=max_new_tokens,
        eos_id=eos,
        pad_id=pad,
        temperature=temperature,
        seed=seed,
    )
    return [tokenizer.decode(strip_eos(cut_at_stop(c, tokenizer, stop)[0], eos), skip_special_tokens=True) for c in ids]


def prompt_format_for(task: Any, system_prompt: str | None = None) -> Any:
    """How the task's prompts are encoded: through the chat template when the task is in chat form."""
    from tba.model.tokenizer import PromptFormat

    return PromptFormat(chat=task.chat, system_prompt=system_prompt)


def attempts(
    model: Any,
    tokenizer: Any,
    task: Any,
    prompts: Sequence[Any],
    *,
    samples: int = 1,
    max_new_tokens: int = 16,
    temperature: float = 0.0,
    seed: int | None = None,
    prompt_format: Any = None,
    stop: Sequence[str] = (),
) -> tuple[list[str], list[float]]:
    """``samples`` attempts at each prompt (prompt-major): their texts and rewards. An attempt at a single-turn
    task is a completion; at a multi-turn task (:class:`~tba.tasks.MultiTurnTask`) an episode, its turns
    decoded the same way (:mod:`tba.model.episodes`), its text the whole trajectory's. ``stop``: the
    searchers' stop strings (``TBA_STOP``), which end a completion or, with the task's own, a turn."""
    from tba.tasks import MultiTurnTask

    fmt = prompt_format or prompt_format_for(task)
    if not isinstance(task, MultiTurnTask):
        texts = complete(
            model,
            tokenizer,
            [p.text for p in prompts for _ in range(samples)],
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            seed=seed,
            prompt_format=fmt,
            stop=stop,
        )
        rewards = [r for i, p in enumerate(prompts) for r in task.rewards(p, texts[i * samples : (i + 1) * samples])]
        return texts, rewards
    from tba.model.episodes import run_episodes

    turns = _turns(model, tokenizer, [*stop, *task.turn_stop], temperature, seed)
    ids = [fmt.encode(tokenizer, p.text) for p in prompts]
    groups = run_episodes(turns, task, tokenizer, prompts, ids, samples, max_new_tokens, task.max_episode_tokens)
    texts, rewards = [], []
    for prompt, group in zip(prompts, groups, strict=True):
        for t in group:
            text = tokenizer.decode(t.token_ids, skip_special_tokens=True)
            texts.append(text)
            if t.failure is not None:
                rewards.append(0.0)
            else:
                rewards.append(t.reward if t.reward is not None else task.reward(prompt, text))
    return texts, rewards


def _turns(model: Any, tokenizer: Any, stops: Sequence[str], temperature: float, seed: int | None) -> Any:
    """Episode turns (:data:`tba.model.episodes.GenerateTurns`) decoded by :func:`tba.model.generate.generate`:
    each ends at EOS, at the first of ``stops`` or at its budget. Decoding is causal, so cutting a longer
    decode there gives the tokens a decode stopped there would (no behaviour log-probs: NaN)."""
    from tba.model.generate import eos_ids, generate

    eos = set(eos_ids(model, tokenizer))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos)

    def cut(ids: list[int], budget: int) -> tuple[list[int], float, str]:
        ids, stopped = cut_at_stop(ids[:budget], tokenizer, stops)
        for k, token in enumerate(ids):
            if token in eos:
                return ids[: k + 1], math.nan, "stop"
        return ids, math.nan, "stop" if stopped else "length"

    def turns(contexts: list[list[int]], n: int, budgets: list[int]) -> list[list[tuple[list[int], float, str]]]:
        flat = [c for c in contexts for _ in range(n)]
        out = generate(
            model, flat, max_new_tokens=max(budgets), eos_id=eos, pad_id=pad, temperature=temperature, seed=seed
        )
        return [[cut(out[i * n + j], b) for j in range(n)] for i, b in enumerate(budgets)]

    return turns


def greedy_accuracy(
    model: Any, tokenizer: Any, task: Any, prompts: Sequence[Any], max_new_tokens: int = 16, stop: Sequence[str] = ()
) -> float:
    """pass@1 with greedy decoding: the figure SFT stops on and the end-to-end run reports."""
    if not prompts:
        raise ValueError("no evaluation prompts")
    _, rewards = attempts(model, tokenizer, task, prompts, max_new_tokens=max_new_tokens, stop=stop)
    return sum(task.success(r) for r in rewards) / len(prompts)


def score_samples(
    task: Any,
    prompts: Sequence[Any],
    completions: Sequence[Sequence[str]],
    ks: Sequence[int],
    rewards: Sequence[Sequence[float]] | None = None,
) -> dict[str, Any]:
    """pass@k, mean reward and distinct correct answers from n sampled completions per prompt (their
    ``rewards``, or the task's rewards of their texts)."""
    pass_k = {k: 0.0 for k in ks}
    reward_sum, n_total, distinct = 0.0, 0, []
    for i, (prompt, group) in enumerate(zip(prompts, completions, strict=True)):
        group_rewards = task.rewards(prompt, list(group)) if rewards is None else list(rewards[i])
        reward_sum, n_total = reward_sum + sum(group_rewards), n_total + len(group)
        correct = [t for t, r in zip(group, group_rewards, strict=True) if task.success(r)]
        for k in ks:
            pass_k[k] += pass_at_k(len(group), len(correct), k)
        if task.multi_answer:
            distinct.append(len({task.answer_key(prompt, t) for t in correct} - {None}))
    n = len(prompts)
    return {
        "pass_at_k": {str(k): v / n for k, v in pass_k.items()},
        "sampled_reward": reward_sum / n_total,
        "distinct_correct": sum(distinct) / n if task.multi_answer else None,
    }


def _sampled_metrics(
    model: Any,
    tokenizer: Any,
    task: Any,
    prompts: Sequence[Any],
    samples: int,
    ks: Sequence[int],
    temperature: float,
    max_new_tokens: int,
    seed: int,
    prompt_format: Any,
    stop: Sequence[str],
) -> dict[str, Any]:
    texts, rewards = attempts(
        model,
        tokenizer,
        task,
        prompts,
        samples=samples,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        seed=seed,
        prompt_format=prompt_format,
        stop=stop,
    )
    per_prompt = [slice(i * samples, (i + 1) * samples) for i in range(len(prompts))]
    return score_samples(task, prompts, [texts[s] for s in per_prompt], ks, [rewards[s] for s in per_prompt])


def evaluate_model(
    model: Any,
    tokenizer: Any,
    task: Any,
    *,
    n_prompts: int = 200,
    samples: int = 16,
    pass_k: Sequence[int] = (1, 4, 16),
    temperature: float = 0.7,
    max_new_tokens: int = 16,
    seed: int = 0,
    system_prompt: str | None = None,
    stop: Sequence[str] = (),
) -> dict[str, Any]:
    """Every figure of this module for a loaded model; ``samples=0`` measures greedy pass@1 only. ``stop``: the
    searchers' stop strings, so that a completion is read where theirs ends."""
    ks = sorted(set(pass_k))
    if samples and any(not 1 <= k <= samples for k in ks):
        raise ValueError(f"every pass@k needs 1 <= k <= samples ({samples}), got {ks}")
    prompts = task.eval_prompts(n_prompts)
    if not prompts:
        raise ValueError(f"task {task.name!r} has no held-out prompts")
    fmt = prompt_format_for(task, system_prompt)
    start = time.monotonic()
    greedy, greedy_rewards = attempts(
        model, tokenizer, task, prompts, max_new_tokens=max_new_tokens, prompt_format=fmt, stop=stop
    )
    out: dict[str, Any] = {
        "task": task.name,
        "n_prompts": len(prompts),
        "greedy_accuracy": sum(task.success(r) for r in greedy_rewards) / len(prompts),
        "greedy_reward": sum(greedy_rewards) / len(prompts),
        "chat": task.chat,
        "samples": samples,
        "temperature": temperature,
        "stop": list(stop),
        "pass_at_k": {},
        "sampled_reward": None,
        "distinct_correct": None,
        "examples": [{"prompt": p.text, "greedy": t} for p, t in zip(prompts[:3], greedy[:3], strict=True)],
    }
    if samples:
        out.update(
            _sampled_metrics(model, tokenizer, task, prompts, samples, ks, temperature, max_new_tokens, seed, fmt, stop)
        )
    out["eval_seconds"] = round(time.monotonic() - start, 3)
    return out


def evaluate_checkpoint(
    model_dir: str | Path,
    task: Any,
    n_prompts: int = 200,
    *,
    task_options: dict[str, Any] | None = None,
    chat_template: str = "auto",
    device: str = "cpu",
    threads: int = 0,
    base: str | Path | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """Load ``model_dir`` (a model or LoRA adapter directory, or a checkpoint root) and evaluate it on ``task``.

    ``task`` is a :class:`~tba.tasks.Task` or a registered name (with ``task_options``, in chat form
    as ``chat_template`` and the model's tokenizer decide); ``threads`` torch CPU threads (0: the idle
    cores); ``base`` the base model of an adapter (default: the one it records); ``kwargs`` go to
    :func:`evaluate_model` (samples, pass_k, temperature, max_new_tokens, seed,
    system_prompt, stop).
    """
    from tba.model.threads import torch_threads
    from tba.model.tokenizer import uses_chat
    from tba.tasks import make_task

    directory = resolve_model_dir(model_dir)
    with torch_threads(threads):
        model, tokenizer = load_model(directory, device, base)
        if isinstance(task, str):
            task = make_task(task, task_options, chat=uses_chat(tokenizer, chat_template))
        result = evaluate_model(model, tokenizer, task, n_prompts=n_prompts, **kwargs)
    return {"model": str(directory), **result}
