"""Evaluation benchmark: the batched KV-cache greedy decoder of ``tba eval`` against transformers' own.

Greedy-decodes the 200 held-out arithmetic prompts with the tiny model (default spec, random weights,
exactly 8 new tokens per prompt so every method does the same work) three ways:

- ours: :func:`tba.model.generate.generate` (left padding, explicit positions, KV cache, one batch);
- baseline: ``model.generate`` of transformers on the same left-padded batch (the library's path);
- bare: ``model.generate`` one prompt at a time (what a first script does).

Rounds alternate the methods so load from other processes hits all alike; the median round counts.
One torch thread: the development machines share two cores between several processes.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import Figure

PART = "eval"
N_PROMPTS, NEW_TOKENS, ROUNDS = 200, 8, 3


def settings(model: Path | None = None, quick: bool = False) -> dict[str, Any]:
    """What the part runs with, for its record: the tiny model, random weights, always."""
    return {
        "task": "arithmetic",
        "prompts": N_PROMPTS,
        "new_tokens": NEW_TOKENS,
        "repeats": ROUNDS,
        "statistic": "median",
        "torch_threads": 1,
    }


def _setup(tmp: Path):
    import torch

    from tba.model.evaluation import load_model
    from tba.model.tiny import init_model
    from tba.model.tokenizer import encode_prompt
    from tba.tasks import make_task

    torch.set_num_threads(1)
    model, tok = load_model(init_model(tmp / "tiny", seed=0))
    prompts = [encode_prompt(tok, p.text) for p in make_task("arithmetic").eval_prompts(N_PROMPTS)]
    return model, tok, prompts


def _ours(model, tok, prompts) -> None:
    from tba.model.generate import generate

    out = generate(model, prompts, max_new_tokens=NEW_TOKENS, eos_id=-1, pad_id=tok.pad_token_id)
    assert all(len(c) == NEW_TOKENS for c in out)


def _hf(model, tok, prompts, batched: bool) -> None:
    import torch

    from tba.model.batches import pad

    groups = [prompts] if batched else [[p] for p in prompts]
    with torch.inference_mode():
        for group in groups:
            ids, mask = pad(group, tok.pad_token_id, left=True)
            out = model.generate(
                ids,
                attention_mask=mask,
                max_new_tokens=NEW_TOKENS,
                min_new_tokens=NEW_TOKENS,
                do_sample=False,
                pad_token_id=tok.pad_token_id,
                eos_token_id=tok.eos_token_id,
            )
            assert out.shape[1] == ids.shape[1] + NEW_TOKENS


def main() -> list[Figure]:
    with tempfile.TemporaryDirectory() as tmp:
        model, tok, prompts = _setup(Path(tmp))
        methods = {
            "ours": lambda: _ours(model, tok, prompts),
            "hf_batched": lambda: _hf(model, tok, prompts, True),
            "hf_single": lambda: _hf(model, tok, prompts, False),
        }
        for run in methods.values():  # warm-up
            run()
        times: dict[str, list[float]] = {name: [] for name in methods}
        for _ in range(ROUNDS):
            for name, run in methods.items():
                t0 = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - t0)
    rate = {name: N_PROMPTS / statistics.median(ts) for name, ts in times.items()}
    for name, r in rate.items():
        print(f"[bench] eval: {name:10s} {r:8.1f} prompts/s (greedy, {NEW_TOKENS} tokens)", flush=True)
    return [
        Figure(
            PART,
            "greedy eval vs transformers generate (batched)",
            rate["ours"],
            "prompts/s",
            rate["hf_batched"],
            "about 1 (same algorithm, exact sampling control)",
        ),
        Figure(
            PART,
            "greedy eval vs generate one prompt at a time",
            rate["ours"],
            "prompts/s",
            rate["hf_single"],
            "much faster",
        ),
    ]


if __name__ == "__main__":
    main()
