"""Searcher benchmark: end-to-end throughput against bare ``LLM.generate``, and the reload pause.

1. Throughput. One vLLM engine on the tiny model; the same prompts (the searcher's own seeded stream)
   and the same ``SamplingParams`` go through (a) bare ``LLM.generate`` and (b) the whole searcher loop
   (generate, reference log-probs, rewards, msgpack, XADD to a redis-server this benchmark starts,
   final flush included). Rounds alternate a and b so load from other processes hits both alike.
   Measured twice: at the base weights (where the reference log-probs are vLLM's own) and after a
   reload, where every batch also pays a reference pass (the prefix-sharing forward on the spare core,
   overlapped with the next batch's generation). The random tiny weights make this the hard case: no
   completion ends early (32 tokens each) and none shares more than the prompt, so the reference pass
   costs about as much as generating. Target: searcher / bare >= 0.9 in samples/s and tokens/s. Then
   once more on what a run actually generates: the arithmetic SFT base after a reload (short answers,
   many repeated, which the reference pass scores once each).
2. Reload pause: how long generation stops for an in-place reload (``collective_rpc("reload_weights")``
   plus the prefix-cache reset), for the tiny model and for a ~100M-parameter model, against what
   the alternative costs (starting a fresh engine on the new weights), measured in the same run.
   The content-hash check runs on the watcher thread, off the generation path; reported beside it.
3. Generation's dtype: bare ``LLM.generate`` on the arithmetic SFT base with a run's batch (8 prompts x 8
   completions, up to 16 tokens), an engine in bfloat16 (what ``TBA_GENERATION_DTYPE=auto`` picks on a CPU
   with bf16 arithmetic) against one in float32, the same prompts, rounds alternating between them.
4. ``--model M`` (``python -m benchmarks.run --model M searcher``): the same figures at a pretrained model
   instead of the tiny one (:func:`model_figures`). Prompts are the arithmetic task in chat form through
   the model's chat template (the scorer's prompt format, which the bare side encodes with too);
   P=8 S=8, up to 64 new tokens, max_model_len 512. Throughput at base, then the reload pause (two
   published checkpoints that are copies of the model directory: same weights, other directories)
   against the engine's own start, then throughput after the reload, where every batch pays the
   reference pass, and the reference pass alone. Fewer batches per round than the tiny model (a batch
   takes seconds): each searcher round ends with one reference pass that no generation overlaps, which
   weighs more in a round of 4 batches than in a searcher that runs for hours; the steady-state figure
   (tokens over the intervals between consecutive publications, against the bare batches' tokens/s)
   leaves out the start and the drain of each round. ``--quick``: two batches per phase, a smoke run whose figures mean
   nothing.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

from benchmarks import Figure
from tba.keys import Keys

PART = "searcher"
ROUNDS = 3
BATCHES_PER_ROUND = 6
# The SFT base's batches take about 0.2 s: 24 of them per round, so the loop's fixed start and stop
# (watcher thread, the last batch's scoring, the final flush: about 0.3 s) weigh as little as they do
# in a searcher that runs for hours (6 per round measured 0.73 where 24 measured 0.79, same run).
REALISTIC_BATCHES_PER_ROUND = 24
RELOADS = 5
SPEC_100M = dict(hidden_size=768, num_layers=14, num_heads=12, intermediate_size=2048)
# --model: a pretrained model's settings (chat prompts, longer answers). SmolLM2-135M generates about 90 tokens/s
# here (a batch of 64 completions takes ~15 s, its reference pass ~10 s): one warm-up batch, 2 rounds of 4
# batches per phase, one timed reference pass, so that the part takes about 12 minutes.
MODEL_SETTINGS = dict(
    prompts_per_batch=8,
    completions_per_prompt=8,
    max_new_tokens=64,
    max_model_len=512,
    temperature=0.7,
    chat_template="on",
)
MODEL_ROUNDS, MODEL_BATCHES_PER_ROUND, MODEL_RELOADS, MODEL_REF_REPEATS = 2, 4, 5, 1
# The tiny model's searcher settings (the SFT base's phase generates up to 16 tokens instead).
TINY_SETTINGS = dict(
    prompts_per_batch=16,
    completions_per_prompt=8,
    max_new_tokens=32,
    max_model_len=128,
    temperature=0.7,
    kv_cache_gib=1,
)
SFT_MAX_NEW = 16


def settings(model: Path | None = None, quick: bool = False) -> dict[str, Any]:
    """What the part runs with, for its record."""
    if model is None:
        return TINY_SETTINGS | {
            "repeats": ROUNDS,
            "batches_per_repeat": BATCHES_PER_ROUND,
            "sft_base_batches_per_repeat": REALISTIC_BATCHES_PER_ROUND,
            "sft_base_max_new_tokens": SFT_MAX_NEW,
            "reloads": RELOADS,
            "spec_100m": SPEC_100M,
        }
    repeats, batches, reloads, ref_repeats = _model_counts(quick)
    return MODEL_SETTINGS | {
        "repeats": repeats,
        "batches_per_repeat": batches,
        "reloads": reloads,
        "reference_pass_repeats": ref_repeats,
    }


def _model_counts(quick: bool) -> tuple[int, int, int, int]:
    """With ``--model``: repeats, batches per repeat, reloads, reference-pass repeats (``--quick``: a smoke run)."""
    return (1, 2, 2, 1) if quick else (MODEL_ROUNDS, MODEL_BATCHES_PER_ROUND, MODEL_RELOADS, MODEL_REF_REPEATS)


def _settings(model: Path, work: Path, redis_url: str, **kw):
    from tba.settings import SearcherSettings

    base = dict(
        model=model,
        redis_url=redis_url,
        namespace="bench",
        checkpoint_dir=work / "ckpt",
        spill_dir=work / "spill",
        searcher_id="bench-0",
        max_batches=BATCHES_PER_ROUND,
        **TINY_SETTINGS,
    )
    return SearcherSettings(**(base | kw))


def _bare_round(engine, scorer, prompts, params) -> tuple[float, int, int, list[tuple[float, int]]]:
    """Bare ``LLM.generate`` over the given prompt batches, encoded as the searcher encodes them (the scorer's
    prompt format: plain, or the chat template): (seconds, samples, tokens, (seconds, tokens) per batch)."""
    from vllm.inputs import TokensPrompt

    t0 = time.perf_counter()
    samples = tokens = 0
    per_batch = []
    for batch in prompts:
        t, before = time.perf_counter(), tokens
        inputs = [TokensPrompt(prompt_token_ids=scorer.prompt_format.encode(scorer.tokenizer, p.text)) for p in batch]
        for out in engine.llm.generate(inputs, params, use_tqdm=False):
            samples += len(out.outputs)
            tokens += sum(len(c.token_ids) for c in out.outputs)
        per_batch.append((time.perf_counter() - t, tokens - before))
    return time.perf_counter() - t0, samples, tokens, per_batch


def _searcher_round(settings, engine, scorer, redis_url: str) -> tuple[float, int, int, list[tuple[float, int]], dict]:
    """The whole searcher loop for ``max_batches`` batches, the final flush included: (seconds, samples, tokens,
    (seconds since the previous batch's publication, tokens) for batches 2..N, its final status)."""
    from services.searcher.loop import Searcher
    from tba.redis_client import sync_client

    client = sync_client(redis_url)
    client.flushdb()
    searcher = Searcher(settings, engine, scorer)
    try:
        t0 = time.perf_counter()
        searcher.run()
        seconds = time.perf_counter() - t0
        status = searcher.status()
    finally:
        searcher.close()
    entries = client.xrange(Keys("bench").trajectories)
    if len(entries) != status["groups_published"] or status["spilled"]:
        raise RuntimeError(f"searcher lost groups: {len(entries)} on the stream, status {status}")
    return (
        seconds,
        status["samples_published"],
        status["tokens_generated"],
        _publish_intervals(entries, settings.prompts_per_batch, settings.max_batches),
        status,
    )


def _publish_intervals(entries, groups_per_batch: int, batches: int) -> list[tuple[float, int]]:
    """(seconds since the previous batch's publication, completion tokens) for batches 2..N, read off the
    stream entries (Redis stamps each id with its arrival in ms; a batch is published when its last group
    is). Empty unless every batch published all its groups."""
    from tba.codec import decode
    from tba.keys import STREAM_FIELD
    from tba.schemas import ScoredGroup

    if len(entries) != groups_per_batch * batches:
        return []
    stamps = [int(entry_id.split(b"-")[0]) / 1e3 for entry_id, _ in entries]
    tokens = [
        sum(len(s.completion_ids) for s in decode(fields[STREAM_FIELD.encode()], ScoredGroup).samples)
        for _, fields in entries
    ]
    done = [max(stamps[i : i + groups_per_batch]) for i in range(0, len(stamps), groups_per_batch)]
    per_batch = [sum(tokens[i : i + groups_per_batch]) for i in range(0, len(tokens), groups_per_batch)]
    return [(b - a, n) for (a, b), n in zip(pairwise(done), per_batch[1:], strict=True)]


def throughput(
    engine, scorer, settings, redis_url: str, phase: str, rounds: int = ROUNDS, warmup: int = 2
) -> list[Figure]:
    from itertools import islice

    from services.searcher.loop import replica_seed

    params = engine.sampling_params(settings.completions_per_prompt, settings.temperature, settings.max_new_tokens)
    # The searcher's own prompt stream: both sides see exactly the same prompts, batch by batch.
    stream = scorer.task.train_prompts(replica_seed(settings.seed, settings.searcher_id))
    batches = [list(islice(stream, settings.prompts_per_batch)) for _ in range(settings.max_batches)]
    _bare_round(engine, scorer, batches[:warmup], params)  # warm-up (the first generate is slow)
    bare = [0.0, 0, 0]
    ours = [0.0, 0, 0]
    bare_batches: list[tuple[float, int]] = []  # (seconds, tokens) of batches 2..N of each round, bare
    intervals: list[tuple[float, int]] = []  # (seconds since our previous publication, tokens), batches 2..N
    for r in range(rounds):
        bare_round = _bare_round(engine, scorer, batches, params)
        our_round = _searcher_round(settings, engine, scorer, redis_url)
        for acc, result in ((bare, bare_round), (ours, our_round)):
            for i, v in enumerate(result[:3]):
                acc[i] += v
        bare_batches.extend(bare_round[3][1:])
        intervals.extend(our_round[3])
        print(
            f"[bench] searcher {phase} round {r + 1}: bare {bare[1] / bare[0]:.0f} samples/s, "
            f"searcher {ours[1] / ours[0]:.0f} samples/s (cumulative)",
            flush=True,
        )
    label = f"P={settings.prompts_per_batch} S={settings.completions_per_prompt} T={settings.max_new_tokens}"
    figures = [
        Figure(
            PART,
            f"samples/s {phase} ({label}) vs bare LLM.generate",
            ours[1] / ours[0],
            "samples/s",
            bare[1] / bare[0],
            ">= 0.9",
        ),
        Figure(
            PART, f"tokens/s {phase}, vs bare LLM.generate", ours[2] / ours[0], "tokens/s", bare[2] / bare[0], ">= 0.9"
        ),
    ]
    if intervals:
        # A searcher runs for hours: between its first and last publication every batch's scoring overlaps
        # the next batch's generation. The whole-round figures above also hold the start (nothing to
        # overlap yet) and the drain (the last batch's scoring alone), which weigh more the fewer batches
        # a round has. Both sides here cover the same batches (2..N of each round), in tokens/s: the two
        # sides sample different completions, whose lengths (and so generation times) differ by batch.
        def rate(pairs: list[tuple[float, int]]) -> float:
            return sum(n for _, n in pairs) / sum(t for t, _ in pairs)

        figures.append(
            Figure(
                PART,
                f"tokens/s {phase}, steady state (publication intervals)",
                rate(intervals),
                "tokens/s",
                rate(bare_batches),
                ">= 0.9",
            )
        )
    return figures


def _checkpoints(work: Path, name: str, spec) -> tuple:
    """Two published checkpoints of the given size (different weights) to reload back and forth."""
    from tba.checkpoints import CheckpointStore
    from tba.model.tiny import init_model

    store = CheckpointStore(work / f"ckpt-{name}")
    manifests = []
    for v in (1, 2):
        tmp = store.new_tmp_dir()
        init_model(tmp, spec, seed=v)
        manifests.append(store.commit(tmp, version=v, step=v))
    return store, manifests


def _timed_engine(settings, weights: Path, version: int):
    from services.searcher.engine import Engine

    t0 = time.perf_counter()
    engine = Engine(settings, weights, version=version, seed=0)
    return engine, time.perf_counter() - t0


def reload_pause(engine, start_s: float, store, manifests, name: str, reloads: int = RELOADS) -> list[Figure]:
    """Median in-place reload pause, against starting a fresh engine (``start_s``, same run)."""
    from tba.model.tokenizer import load_tokenizer

    size_mb = sum(f.stat().st_size for f in store.resolve(manifests[0]).iterdir()) / 1e6
    ids = [load_tokenizer(store.resolve(manifests[0]))("1+1=")["input_ids"]]
    engine.generate(ids, engine.sampling_params(1, 0.7, 4))  # warm-up
    # The process's first reload also allocates what every later one reuses (~1 s for 540 MB); a searcher
    # reloads hundreds of times in a run, so that one is not counted.
    engine.reload(store.resolve(manifests[0]), manifests[0].version)
    pauses, verifies = [], []
    for i in range(reloads):
        m = manifests[(i + 1) % 2]
        t = time.perf_counter()
        store.verify(m)  # what the watcher thread does before it offers a checkpoint
        verifies.append(time.perf_counter() - t)
        pauses.append(engine.reload(store.resolve(m), m.version))
        engine.generate(ids, engine.sampling_params(1, 0.7, 4))
    pause_ms, verify_ms = statistics.median(pauses) * 1e3, statistics.median(verifies) * 1e3
    print(
        f"[bench] reload {name} ({size_mb:.0f} MB): pause {pause_ms:.0f} ms, hash {verify_ms:.0f} ms, "
        f"fresh engine {start_s:.1f} s",
        flush=True,
    )
    return [
        Figure(
            PART,
            f"reload pause, {name} ({size_mb:.0f} MB fp32) vs fresh engine start",
            pause_ms,
            "ms",
            start_s * 1e3,
            "<< engine start",
        ),
        Figure(PART, f"checkpoint hash check, {name} (watcher thread, not a pause)", verify_ms, "ms"),
    ]


def realistic_throughput(work: Path, redis_url: str) -> list[Figure]:
    """Throughput on what a run generates: the arithmetic SFT base (cached, or built now) reloaded from a
    checkpoint copy, so the reference pass runs; its completions are short and often repeat, which the
    searcher scores once per distinct (prompt, completion) pair (the share is in the label)."""
    from services.searcher.scorer import Scorer
    from tba.model.sft import ensure_base_model
    from tba.tasks import make_task

    base = ensure_base_model(task="arithmetic")
    policy = work / "policy-v1"
    shutil.copytree(base, policy)  # the same weights from another directory: treated as a trained policy
    settings = _settings(base, work, redis_url, max_new_tokens=SFT_MAX_NEW, max_batches=REALISTIC_BATCHES_PER_ROUND)
    engine, _ = _timed_engine(settings, base, version=0)
    scorer = Scorer(settings, make_task("arithmetic"), settings.searcher_id)
    try:
        engine.reload(policy, 1)
        figures = throughput(engine, scorer, settings, redis_url, "arithmetic SFT base after reload")
        figures.append(reference_share(scorer, "arithmetic SFT base"))
        return figures + reference_pass(engine, scorer, settings, "SFT base")
    finally:
        engine.close()


def generation_dtype_speedup(work: Path, redis_url: str, rounds: int = ROUNDS) -> Figure:
    """Samples/s of bare generation in bfloat16 against float32 on the arithmetic SFT base (section 3)."""
    from itertools import islice

    from services.searcher.scorer import Scorer
    from tba.model.sft import ensure_base_model
    from tba.tasks import make_task

    base = ensure_base_model(task="arithmetic")
    engines = {}
    try:
        for dtype in ("float32", "bfloat16"):
            options = dict(prompts_per_batch=8, max_new_tokens=16, generation_dtype=dtype, ref_pass="trainer")
            settings = _settings(base, work, redis_url, **options)
            engines[dtype] = _timed_engine(settings, base, version=0)[0]
        scorer = Scorer(settings, make_task("arithmetic"), settings.searcher_id)  # the prompts' encoding only
        stream = scorer.task.train_prompts(settings.seed)
        batches = [list(islice(stream, settings.prompts_per_batch)) for _ in range(REALISTIC_BATCHES_PER_ROUND)]
        params = engines["float32"].sampling_params(settings.completions_per_prompt, settings.temperature, 16)
        totals = {dtype: [0.0, 0] for dtype in engines}
        for engine in engines.values():
            _bare_round(engine, scorer, batches[:2], params)  # warm-up
        for _ in range(rounds):
            for dtype, engine in engines.items():
                seconds, samples, _, _ = _bare_round(engine, scorer, batches, params)
                totals[dtype][0] += seconds
                totals[dtype][1] += samples
    finally:
        for engine in engines.values():
            engine.close()
    rate = {dtype: samples / seconds for dtype, (seconds, samples) in totals.items()}
    print(f"[bench] generation: bfloat16 {rate['bfloat16']:.0f} samples/s, float32 {rate['float32']:.0f}", flush=True)
    return Figure(
        PART,
        "samples/s generating in bfloat16 vs float32 (arithmetic SFT base, P=8 S=8 T=16)",
        rate["bfloat16"],
        "samples/s",
        rate["float32"],
        "> 1 on a CPU with bf16 arithmetic",
    )


def reference_share(scorer, name: str) -> Figure:
    """How many of the (prompt, completion) pairs asked for the reference pass scored (the rest repeat)."""
    share = scorer.ref_pairs_scored / max(1, scorer.ref_pairs_total)
    print(f"[bench] reference pass scored {share:.0%} of the pairs (the rest repeat)", flush=True)
    return Figure(PART, f"share of (prompt, completion) pairs the reference scored, {name}", share * 100, "%")


def reference_pass(engine, scorer, settings, name: str, repeats: int = RELOADS) -> list[Figure]:
    """The reference pass alone on one batch's distinct pairs: prefix trees against the trainer's padded rows
    (the same model, pairs and token budget, on this thread with the scoring thread's torch threads)."""
    import torch

    from services.searcher.loop import replica_seed
    from tba.model.batches import token_budget_chunks
    from tba.model.logprobs import sequence_logprobs, shared_prefix_logprobs_chunked

    stream = scorer.task.train_prompts(replica_seed(settings.seed, "reference-pass"))
    prompt_ids = [
        scorer.prompt_format.encode(scorer.tokenizer, next(stream).text) for _ in range(settings.prompts_per_batch)
    ]
    params = engine.sampling_params(settings.completions_per_prompt, settings.temperature, settings.max_new_tokens)
    pairs = list(
        dict.fromkeys(
            (tuple(p), tuple(c.token_ids))
            for p, group in zip(prompt_ids, engine.generate(prompt_ids, params), strict=True)
            for c in group
        )
    )
    prompts, completions = [list(p) for p, _ in pairs], [list(c) for _, c in pairs]
    model, T, pad, budget = scorer.reference.model, settings.temperature, scorer.pad_id, settings.ref_token_budget

    def padded_rows() -> None:
        for chunk in token_budget_chunks([len(p) + len(c) for p, c in pairs], budget):
            sequence_logprobs(model, [prompts[i] for i in chunk], [completions[i] for i in chunk], T, pad)

    def timed(fn) -> float:
        with torch.inference_mode():
            fn()  # warm-up
            t0 = time.perf_counter()
            for _ in range(repeats):
                fn()
        return (time.perf_counter() - t0) / repeats * 1e3

    tree_ms = timed(lambda: shared_prefix_logprobs_chunked(model, prompts, completions, T, pad, budget))
    rows_ms = timed(padded_rows)
    print(
        f"[bench] reference pass on {name}, {len(pairs)} distinct pairs: prefix trees {tree_ms:.0f} ms, "
        f"padded rows {rows_ms:.0f} ms",
        flush=True,
    )
    return [
        Figure(
            PART,
            f"reference pass, one batch on {name} ({len(pairs)} distinct pairs) vs padded rows",
            tree_ms,
            "ms",
            rows_ms,
            "< padded rows",
        )
    ]


def _copied_checkpoints(work: Path, model_dir: Path) -> tuple:
    """Two published checkpoints of a pretrained model: copies of its directory. The weights are the same, the
    directories differ: a reload reads and loads every byte either way, and the engine then serves a policy
    that is not the reference's directory, so every batch pays the reference pass."""
    from tba.checkpoints import CheckpointStore

    store = CheckpointStore(work / "ckpt-model")
    manifests = []
    for v in (1, 2):
        tmp = store.new_tmp_dir()
        for f in model_dir.iterdir():
            if f.is_file():
                shutil.copyfile(f, tmp / f.name)
        manifests.append(store.commit(tmp, version=v, step=v))
    return store, manifests


def model_figures(model_dir: Path, work: Path, redis_url: str, quick: bool = False) -> list[Figure]:
    """Throughput at base and after a reload, the reload pause and the reference pass, at a pretrained model,
    on the chat-form arithmetic task through the model's chat template (:data:`MODEL_SETTINGS`)."""
    from benchmarks import model_label
    from services.searcher.scorer import Scorer
    from tba.tasks import make_task

    name = model_label(model_dir)
    rounds, batches, reloads, repeats = _model_counts(quick)
    settings = _settings(model_dir, work, redis_url, max_batches=batches, **MODEL_SETTINGS)
    store, manifests = _copied_checkpoints(work, model_dir)
    engine, start_s = _timed_engine(settings, model_dir, version=0)
    try:
        scorer = Scorer(settings, make_task(settings.task, settings.task_options, chat=True), settings.searcher_id)
        figures = throughput(engine, scorer, settings, redis_url, f"{name} at base (ref reused)", rounds, warmup=1)
        figures += reload_pause(engine, start_s, store, manifests, name, reloads)  # serves a checkpoint copy after
        figures += throughput(engine, scorer, settings, redis_url, f"{name} after reload (ref pass)", rounds, warmup=1)
        figures.append(reference_share(scorer, name))
        return figures + reference_pass(engine, scorer, settings, name, repeats)
    finally:
        engine.close()


def main(model: Path | None = None, quick: bool = False) -> list[Figure]:
    """The tiny model's figures; with ``model``, that pretrained model's (:func:`model_figures`)."""
    from services.searcher.scorer import Scorer
    from tba.model.tiny import TinyModelSpec, init_model
    from tba.redis_server import RedisServer
    from tba.tasks import make_task

    work = Path(tempfile.mkdtemp(prefix="tba-bench-searcher-"))
    redis = RedisServer(work / "redis", appendonly=False).start()
    redis_url = redis.url
    try:
        if model is not None:
            return model_figures(Path(model), work, redis_url, quick)
        model = init_model(work / "tiny", seed=0)
        settings = _settings(model, work, redis_url)
        store, manifests = _checkpoints(work, "tiny", TinyModelSpec())
        engine, start_s = _timed_engine(settings, model, version=0)
        try:
            scorer = Scorer(settings, make_task(settings.task, settings.task_options), settings.searcher_id)
            # At the base weights (version 0, the warm-up) the reference log-probs are vLLM's own ...
            figures = throughput(engine, scorer, settings, redis_url, "at base (ref reused)")
            figures += reload_pause(engine, start_s, store, manifests, "tiny")
            # ... after a reload every batch also pays a reference pass.
            figures += throughput(engine, scorer, settings, redis_url, "after reload (ref pass)")
            figures += reference_pass(engine, scorer, settings, "tiny random weights")
        finally:
            engine.close()
        figures += realistic_throughput(work, redis_url)
        figures.append(generation_dtype_speedup(work, redis_url))
        big = TinyModelSpec(**SPEC_100M)
        n_params = big.num_layers * (4 * big.hidden_size**2 + 3 * big.hidden_size * big.intermediate_size)
        store, manifests = _checkpoints(work, "100M", big)
        engine, start_s = _timed_engine(settings, store.resolve(manifests[0]), version=1)
        try:
            figures += reload_pause(engine, start_s, store, manifests, f"{n_params / 1e6:.0f}M params")
        finally:
            engine.close()
        return figures
    finally:
        redis.stop(kill=True)  # a throwaway server: nothing to flush
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    import argparse

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from benchmarks import format_table
    from tba.model.importer import resolve_model

    parser = argparse.ArgumentParser(prog="python -m benchmarks.searcher", description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model directory or packaged model name (default: the tiny model)")
    parser.add_argument("--quick", action="store_true", help="with --model: a smoke run; figures mean nothing")
    args = parser.parse_args()
    if args.quick and not args.model:
        parser.error("--quick needs --model")
    print(format_table(main(resolve_model(args.model) if args.model else None, args.quick)))
