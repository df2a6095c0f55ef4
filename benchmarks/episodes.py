"""Multi-turn episodes: what the environment loop costs a searcher.

One vLLM engine on the calculator task's SFT base (a model that calls the calculator), after a reload (so
every batch pays the reference pass, as in a run). (a) The whole searcher loop on the calculator task:
episodes (a generate call per turn, the calculator's answers tokenized into the context), the reference
pass over the trajectories (model tokens only), rewards, XADD to a redis-server this benchmark starts.
(b) Bare single-turn ``LLM.generate`` of the same prompts and the same number of samples, each completion
forced to the mean length of (a)'s trajectories (``min_tokens = max_tokens``): the same total tokens in
one call per batch. Rounds alternate (a) and (b). Figures: trajectories/s and tokens/s (a trajectory's
tokens are the model's and the environment's), against (b) in completions/s and tokens/s, and the mean
model turns per episode. Part of ``make bench`` (``python -m benchmarks.run episodes``).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from itertools import islice
from pathlib import Path
from typing import Any

from benchmarks import Figure
from benchmarks.searcher import _searcher_round, _settings, _timed_engine

PART = "episodes"
ROUNDS = 3
BATCHES_PER_ROUND = 12
PROMPTS_PER_BATCH = 8


def settings(model: Path | None = None, quick: bool = False) -> dict[str, Any]:
    """What the part runs with, for its record: the calculator task's SFT base, always."""
    return {
        "task": "calculator",
        "model": "the calculator task's SFT base",
        "prompts_per_batch": PROMPTS_PER_BATCH,
        "batches_per_repeat": BATCHES_PER_ROUND,
        "repeats": ROUNDS,
    }


def _bare_round(engine, scorer, batches, params) -> tuple[float, int, int]:
    """Single-turn ``LLM.generate`` of the batches: (seconds, completions, tokens)."""
    t0 = time.perf_counter()
    completions = tokens = 0
    for batch in batches:
        ids = [scorer.prompt_format.encode(scorer.tokenizer, p.text) for p in batch]
        for group in engine.generate(ids, params):
            completions += len(group)
            tokens += sum(len(c.token_ids) for c in group)
    return time.perf_counter() - t0, completions, tokens


def main() -> list[Figure]:
    from services.searcher.loop import replica_seed
    from services.searcher.scorer import Scorer
    from tba.model.sft import ensure_base_model
    from tba.redis_server import RedisServer
    from tba.tasks import make_task

    work = Path(tempfile.mkdtemp(prefix="tba-bench-episodes-"))
    redis = RedisServer(work / "redis", appendonly=False).start()
    redis_url = redis.url
    try:
        model = ensure_base_model(task="calculator")
        settings = _settings(
            model,
            work,
            redis_url,
            task="calculator",
            prompts_per_batch=PROMPTS_PER_BATCH,
            max_batches=BATCHES_PER_ROUND,
        )
        task = make_task("calculator")
        engine, _ = _timed_engine(settings, model, version=0)
        try:
            # A copy of the base as version 1: after the reload the reference pass runs on every batch.
            engine.reload(shutil.copytree(model, work / "v1"), version=1)
            scorer = Scorer(settings, task, settings.searcher_id)
            stream = task.train_prompts(replica_seed(settings.seed, settings.searcher_id))
            batches = [list(islice(stream, settings.prompts_per_batch)) for _ in range(BATCHES_PER_ROUND)]
            ours, bare, turns = [0.0, 0, 0], [0.0, 0, 0], 0
            for r in range(ROUNDS):
                seconds, samples, tokens, _, status = _searcher_round(settings, engine, scorer, redis_url)
                turns += status["episode_turns"]
                length = max(1, round(tokens / samples))
                params = engine.sampling_params(settings.completions_per_prompt, settings.temperature, length)
                params.min_tokens = length
                b = _bare_round(engine, scorer, batches, params)
                for acc, result in ((ours, (seconds, samples, tokens)), (bare, b)):
                    for i, v in enumerate(result):
                        acc[i] += v
                print(
                    f"[bench] episodes round {r + 1}: {samples / seconds:.0f} trajectories/s ({length} tokens), "
                    f"single-turn {b[1] / b[0]:.0f} completions/s",
                    flush=True,
                )
        finally:
            engine.close()
        label = f"calculator, P={settings.prompts_per_batch} S={settings.completions_per_prompt}"
        return [
            Figure(
                PART,
                f"trajectories/s ({label}) vs single-turn completions of the same length",
                ours[1] / ours[0],
                "samples/s",
                bare[1] / bare[0],
            ),
            Figure(
                PART,
                "tokens/s, model and environment, vs single-turn",
                ours[2] / ours[0],
                "tokens/s",
                bare[2] / bare[0],
            ),
            Figure(PART, "model turns per trajectory", turns / max(ours[1], 1), "turns"),
        ]
    finally:
        redis.stop(kill=True)  # a throwaway server: nothing to flush
        shutil.rmtree(work, ignore_errors=True)
