"""The generation loop: prompts -> vLLM -> score -> publish, with reloads between batches.

The main thread only generates: between two ``generate`` calls it loads the
newest verified checkpoint (the pause the reload itself takes, nothing more)
and hands the finished batch to a worker thread that scores it (rewards,
reference log-probs) and publishes it while the next batch is generated.
Every group carries the policy version its batch was generated with, so a
reload while the worker still scores the previous batch labels nothing wrong.

Stopping: the first SIGTERM/SIGINT finishes the batch in progress, the second
abandons it; either way the worker scores and publishes what was generated,
the spill queue is flushed (what Redis does not take stays on disk for the
next start) and :meth:`Searcher.run` returns 0.
"""

from __future__ import annotations

import hashlib
import logging
import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis
from prometheus_client import CollectorRegistry

from services.searcher.cpus import lower_thread_priority, pinned, spare_cpus
from services.searcher.engine import Completion, Engine, EngineStopped, ReloadError, finish_reason
from services.searcher.lag import LagTally, VersionLag
from services.searcher.metrics import RateWindow, StatusCollector, reload_histogram
from services.searcher.pacing import POLICY, Pacer
from services.searcher.publisher import Publisher
from services.searcher.scorer import GeneratedBatch, Scorer
from services.searcher.spill import SpillQueue
from services.searcher.startup import completion_budget
from services.searcher.watcher import CheckpointWatcher
from tba.checkpoints import CheckpointStore
from tba.keys import SAMPLES_DUPLICATE, SAMPLES_SERVED, SAMPLES_TAKEN_IN, Keys
from tba.model.episodes import Turn, run_episodes
from tba.redis_client import sync_client
from tba.schemas import SearcherState
from tba.settings import SearcherSettings
from tba.tasks import MultiTurnTask, Prompt

log = logging.getLogger(__name__)
SIGNAL_GRACE_SECONDS = 2.0
PACE_POLL_SECONDS = 0.1  # how often a paced searcher, waiting for a newer checkpoint, looks for a stop


class AbandonBatch(Exception):
    """Raised by the second stop signal to cut the batch being generated short."""


class StopControl:
    """The stop policy: the first signal finishes the batch in progress, the second abandons it."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.generating = False

    @property
    def requested(self) -> bool:
        return self.event.is_set()

    def on_signal(self, signum: int, _frame=None) -> None:
        if not self.event.is_set():
            log.warning("signal %d: stopping after the current batch (send it again to abandon the batch)", signum)
            self.event.set()
        elif self.generating:
            raise AbandonBatch()


def distinct_prompts(stream: Iterator[Prompt], n: int) -> Iterator[Prompt]:
    """The stream's prompts without repeats, for one batch of ``n``: a repeat would only merge into the same
    prompt's group in the buffer, and leave an on-policy trainer short of prompts. After ``10 n`` repeats (a
    task with fewer prompts than a batch) repeats are let through."""
    seen: set[str] = set()
    repeats = 0
    for prompt in stream:
        if prompt.prompt_id in seen and repeats < 10 * n:
            repeats += 1
            continue
        seen.add(prompt.prompt_id)
        yield prompt


def replica_seed(seed: int, searcher_id: str) -> int:
    """A per-replica seed: replicas with different ids explore different prompts and samples."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{searcher_id}".encode()).digest()[:4], "big")


def redis_for(settings: SearcherSettings):
    """The searcher's Redis client (one Redis or a cluster), failing fast: callers own the retries."""
    return sync_client(settings.redis_url, settings.redis_cluster, timeout=settings.redis_timeout_seconds, retry=False)


def build_watcher(settings: SearcherSettings, version: int) -> CheckpointWatcher:
    return CheckpointWatcher(
        lambda: redis_for(settings),
        Keys(settings.namespace),
        CheckpointStore(settings.checkpoint_dir),
        settings.reload_poll_seconds,
        current_version=version,
        holder=settings.searcher_id,
        lease_seconds=settings.checkpoint_lease_seconds,
        lag=VersionLag(settings.max_staleness, settings.lag_seconds, time.monotonic),
    )


class Searcher:
    def __init__(
        self,
        settings: SearcherSettings,
        engine: Engine,
        scorer: Scorer,
        *,
        watcher: CheckpointWatcher | None = None,
        spill: SpillQueue | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.settings = settings
        self.engine = engine
        self.scorer = scorer
        self.searcher_id = settings.searcher_id
        self.prompts = scorer.task.train_prompts(replica_seed(settings.seed, settings.searcher_id))
        self.params = engine.sampling_params(
            settings.completions_per_prompt, settings.temperature, settings.max_new_tokens
        )
        self.spill = spill if spill is not None else SpillQueue(settings.spill_dir, settings.spill_max_bytes)
        self.publisher = Publisher(
            redis_for(settings),
            Keys(settings.namespace),
            self.spill,
            max_payload_bytes=settings.max_payload_bytes,
        )
        self.watcher = watcher if watcher is not None else build_watcher(settings, engine.version)
        self.watcher.current_version = engine.version
        self.watcher.lag.serving(engine.version)
        self.registry = registry or CollectorRegistry()
        self.registry.register(StatusCollector(self.status))
        self.reload_seconds = reload_histogram(self.registry)
        self.rates = RateWindow()
        self._reference_dir = Path(settings.model).resolve()
        self.state = SearcherState.STARTING
        self.batches = self.groups_generated = self.samples_generated = self.tokens_generated = 0
        self.reloads = self.skipped_prompts = self.reload_failures = 0
        self.clock = time.monotonic  # the clock of the lag rule and of a reload's timeout
        self.reloading: tuple[int, float] | None = None  # (version, start on the clock) of the reload under way
        self.lag_tally = LagTally(settings.max_staleness)  # the version lag of what was generated
        # A multi-turn task's episodes: the trajectory's token budget, and the episodes that ended early, by
        # what failed (the environment's start or step, or a generation), which are not trained on.
        task = scorer.task
        self.multi_turn = task if isinstance(task, MultiTurnTask) else None
        self.completion_tokens = completion_budget(settings, task)
        self.episode_failures: dict[str, int] = {}
        self.episodes = self.episode_turns = self.env_tokens = 0  # episodes run, model turns, observation tokens
        self.reload_ms_last: float | None = None
        # Where a batch's time goes (sums over the run, seconds): the engine's generate call, the worker's
        # scoring and publishing, and the reloads' pauses. Their means state a synchronous cycle's parts.
        self.generate_seconds = self.score_seconds = self.reload_seconds_total = 0.0
        self._started = time.monotonic()
        self.stop = StopControl()
        # Samples handed to the scoring thread, and those of them it has published: the difference is what the
        # buffer has not seen yet, for the ahead rule.
        self._samples_handed = self._samples_done = 0
        self.pacer = Pacer(
            settings.max_batches_per_version,
            settings.pace_max_wait_seconds,
            max_samples_ahead=settings.max_samples_ahead,
            samples_ahead=self.samples_ahead,
        )
        self._queue: queue.Queue[GeneratedBatch | None] = queue.Queue(maxsize=1)
        self._worker_error: BaseException | None = None
        self._worker: threading.Thread | None = None

    # --- control ---
    def request_stop(self) -> None:
        self.stop.event.set()

    # --- the loop ---
    def run(self) -> int:
        """Generate until stopped (or ``max_batches``); returns 0 once everything generated is published or spilled.

        On a CPU host the loop's threads run on the cores the generation worker leaves (cpus.py)."""
        with pinned(spare_cpus() if self.engine.on_cpu else ()):
            return self._run()

    def _run(self) -> int:
        self.watcher.poll_once()  # a late joiner catches up before its first batch
        self.watcher.start()
        worker = self._worker = threading.Thread(target=self._work, name="score-publish", daemon=True)
        worker.start()
        self.state = SearcherState.RUNNING
        try:
            while not self.stop.requested:
                if self.settings.max_batches is not None and self.batches >= self.settings.max_batches:
                    break
                self._raise_worker_error()
                if not self.maybe_reload():
                    break  # the engine stopped during a reload: shutting down
                if self.spill.full():
                    self.state = SearcherState.PAUSED_SPILL_FULL
                    self.stop.event.wait(0.5)
                    continue
                pause = self.pacer.should_wait(self.engine.version)
                if pause:
                    self.state = (
                        SearcherState.PAUSED_FOR_POLICY if pause == POLICY else SearcherState.PAUSED_FOR_TRAINER
                    )
                    t0 = time.monotonic()
                    self.watcher.wait_ready(PACE_POLL_SECONDS)  # wakes the moment one is verified
                    self.pacer.waited(time.monotonic() - t0)
                    continue
                self.state = SearcherState.RUNNING
                batch = self._generate()
                if batch is None:
                    break
                self._hand_over(batch)
                self._samples_handed += batch.samples
                self.pacer.generated(batch.version)
                self.batches += 1
        finally:
            self.state = SearcherState.STOPPING
            while worker.is_alive():  # a dead worker no longer takes from the queue
                try:
                    self._queue.put(None, timeout=0.5)
                    break
                except queue.Full:
                    continue
            worker.join()
            self.watcher.stop()
            self.state = SearcherState.STOPPED
        self._raise_worker_error()
        return 0

    def samples_ahead(self) -> int | None:
        """Samples generated and not yet trained on, over every searcher: those the buffer took in and has not
        served, those still in the trajectory stream (groups not yet taken in, at this searcher's samples per
        group), and this searcher's own still being scored or published. None while Redis cannot be read.

        The buffer's counters count repeats (duplicates taken in, samples served again), so their difference is
        generation's lead over training in samples, whatever the buffer's sampling rule replays. Until the
        trainer's first draw the duplicates are left out: its warm-up waits for samples stored, which a cap
        counting duplicates could hold back."""
        keys = self.publisher.keys
        pipe = self.publisher.client.pipeline(transaction=False)
        pipe.hmget(keys.stats, [SAMPLES_TAKEN_IN, SAMPLES_DUPLICATE, SAMPLES_SERVED])
        pipe.xlen(keys.trajectories)
        pipe.xinfo_groups(keys.trajectories)  # an error until the stream exists
        try:
            counters, length, groups = pipe.execute(raise_on_error=False)
        except redis.RedisError:
            return None
        if isinstance(counters, Exception) or isinstance(length, Exception):
            return None
        taken, duplicate, served = (int(v or 0) for v in counters)
        in_stream = int(length)  # no consumer group yet: the buffer has taken in none of the stream's groups
        for group in groups if isinstance(groups, list) else []:
            if group.get("name") in (keys.ingest_group, keys.ingest_group.encode()):
                in_stream = int(group.get("pending") or 0) + int(group.get("lag") or 0)
        own = self._samples_handed - self._samples_done
        lead = taken - served if served else taken - duplicate
        return lead + in_stream * self.settings.completions_per_prompt + own

    def maybe_reload(self) -> bool:
        """Load the newest verified checkpoint, if there is one newer than the engine's weights.

        False when a shutdown signal reached the engine core during the reload: the loop then stops
        (exit 0, everything generated still published or spilled). An engine that dies without a stop
        request is a failure and raises."""
        ckpt = self.watcher.take()
        if ckpt is None:
            return True
        self.state = SearcherState.RELOADING
        old, previous = self.engine.version, self.engine.weights_dir
        self.reloading = (ckpt.version, self.clock())
        try:
            pause = self.engine.reload(ckpt.path, ckpt.version, stopping=lambda: self.stop.requested)
        except ReloadError as err:
            self.reload_failures += 1
            self.watcher.current_version = self.engine.version  # still the weights it served
            self.watcher.reject(ckpt, str(err))
            self.state = SearcherState.RUNNING
            return True
        except EngineStopped as err:
            # A signal sent to the process group reaches the engine core and this process about together;
            # give ours a moment to arrive before calling the engine's death a failure.
            if self.stop.requested or self.stop.event.wait(SIGNAL_GRACE_SECONDS):
                log.warning("shutdown during the reload to v%d: %s", ckpt.version, err)
                return False
            raise
        finally:
            self.reloading = None
        self.watcher.loaded(ckpt, previous)
        self.reloads += 1
        self.reload_ms_last = pause * 1000
        self.reload_seconds_total += pause
        self.reload_seconds.observe(pause)
        log.info("reloaded v%d -> v%d in place (generation paused %.0f ms)", old, ckpt.version, pause * 1000)
        return True

    def _generate(self) -> GeneratedBatch | None:
        prompts: list[Prompt] = []
        ids: list[list[int]] = []
        limit = self.settings.max_model_len - self.completion_tokens
        candidates = distinct_prompts(self.prompts, self.settings.prompts_per_batch)
        while len(prompts) < self.settings.prompts_per_batch:
            prompt = next(candidates)
            prompt_ids = self.scorer.prompt_format.encode(self.scorer.tokenizer, prompt.text)
            if len(prompt_ids) > limit:
                self.skipped_prompts += 1
                log.warning(
                    "skipping prompt %r: %d tokens + %d new exceed TBA_MAX_MODEL_LEN=%d",
                    prompt.prompt_id,
                    len(prompt_ids),
                    self.completion_tokens,
                    self.settings.max_model_len,
                )
                continue
            prompts.append(prompt)
            ids.append(prompt_ids)
        version = self.engine.version
        self.stop.generating = True
        started = time.monotonic()
        try:
            completions = self._complete(prompts, ids)
            self.generate_seconds += time.monotonic() - started
        except AbandonBatch:
            log.warning("abandoned a batch of %d prompts on the second stop signal", len(prompts))
            return None
        except Exception:
            if not self.stop.requested:
                raise
            # Ctrl-C reaches vLLM's engine processes too: a batch cut short by shutdown is abandoned.
            log.warning("the engine stopped during shutdown; abandoned a batch of %d prompts", len(prompts))
            return None
        finally:
            self.stop.generating = False
        return GeneratedBatch(prompts, ids, completions, version, ref_is_policy=self._serving_reference())

    def _complete(self, prompts: list[Prompt], ids: list[list[int]]) -> list[list[Completion]]:
        """The batch's completions: one generate call, or a multi-turn task's episodes (a call per turn)."""
        if self.multi_turn is None:
            return self.engine.generate(ids, self.params)
        s = self.settings
        groups = run_episodes(
            self._turns,
            self.multi_turn,
            self.scorer.tokenizer,
            prompts,
            ids,
            s.completions_per_prompt,
            s.max_new_tokens,
            self.completion_tokens,
        )
        out = []
        for group in groups:
            for t in group:
                self.episodes += 1
                self.episode_turns += t.turns
                self.env_tokens += sum(end - start for start, end in t.env_spans)
                if t.failure_kind is not None:
                    self.episode_failures[t.failure_kind] = self.episode_failures.get(t.failure_kind, 0) + 1
            out.append(
                [
                    Completion(
                        t.token_ids,
                        t.logprob_sum,
                        finish_reason(t.finish_reason),
                        env_spans=t.env_spans or None,
                        reward=t.reward,
                        failure=t.failure,
                    )
                    for t in group
                ]
            )
        return out

    def _turns(self, contexts: list[list[int]], n: int, budgets: list[int]) -> list[list[Turn]]:
        """One turn of each live episode, by the engine (:data:`tba.model.episodes.GenerateTurns`)."""
        assert self.multi_turn is not None
        stop = self.multi_turn.turn_stop
        params = [self.engine.sampling_params(n, self.settings.temperature, b, stop=stop) for b in budgets]
        groups = self.engine.generate(contexts, params)
        return [[(c.token_ids, c.logprob_sum, c.finish_reason) for c in group] for group in groups]

    def _serving_reference(self) -> bool:
        """True while the engine's weights are the reference model's own (the base, before any reload), in
        the reference's dtype (log-probs from bf16 generation are not the float32 reference's)."""
        return (
            self.settings.ref_reuse_at_base
            and self.engine.dtype == self.settings.dtype
            and self.engine.adapter is None
            and self.engine.weights_dir.resolve() == self._reference_dir
        )

    def _hand_over(self, batch: GeneratedBatch) -> None:
        while True:
            try:
                self._queue.put(batch, timeout=0.5)
                return
            except queue.Full:
                self._raise_worker_error()
                if self._worker is not None and not self._worker.is_alive():
                    log.warning(
                        "the scoring thread stopped during shutdown; abandoned a batch of %d prompts",
                        len(batch.prompts),
                    )
                    return

    def _work(self) -> None:
        """Worker thread: score and publish batches in order; replay spilled groups when idle."""
        if self.engine.on_cpu:  # background work (on the spare cores, as run() placed it): below generation
            lower_thread_priority(self.settings.ref_nice)
        try:
            while True:
                try:
                    batch = self._queue.get(timeout=0.5)
                except queue.Empty:
                    self.publisher.pump()
                    continue
                if batch is None:
                    break
                started = time.monotonic()
                groups = self.scorer.score(batch)
                self.publisher.publish(groups)
                self._samples_done += batch.samples
                self.score_seconds += time.monotonic() - started
                samples = sum(len(g.samples) for g in groups)
                self.lag_tally.add(samples, self.watcher.newest_seen - batch.version)
                tokens = sum(len(s.completion_ids) for g in groups for s in g.samples)
                self.groups_generated += len(groups)
                self.samples_generated += samples
                self.tokens_generated += tokens
                self.rates.add(len(groups), samples, tokens)
        except BaseException as err:  # surfaced by the main thread, which stops the loop
            self._worker_error = err
            self.stop.event.set()
            log.exception("scoring/publishing failed")
        finally:
            self.publisher.flush(self.settings.flush_timeout_seconds)

    def _raise_worker_error(self) -> None:
        if self._worker_error is not None:
            raise RuntimeError(f"the scoring/publishing thread failed: {self._worker_error}") from self._worker_error

    # --- reporting ---
    def ready(self) -> tuple[bool, str]:
        """Ready while the engine generates and keeps up: not while a reload hangs, nor while lagging."""
        if not self.state.serving:
            return False, self.state
        warning = self.warning()
        if warning is not None:
            return False, warning[1]
        return True, f"engine loaded, version {self.engine.version}"

    def warning(self, now: float | None = None) -> tuple[str, str, float] | None:
        """(kind, reason, seconds it has held) when the searcher does not keep up: a reload that has not returned
        within TBA_RELOAD_TIMEOUT_SECONDS ("reload_hung"), or a served version more than TBA_MAX_STALENESS behind
        the newest announced for longer than TBA_LAG_SECONDS ("lagging"); None when it does."""
        now = self.clock() if now is None else now
        s, reloading = self.settings, self.reloading
        if reloading is not None and now - reloading[1] > s.reload_timeout_seconds:
            held = now - reloading[1]
            reason = (
                f"the reload to v{reloading[0]} has not returned after {held:.0f} s "
                f"(TBA_RELOAD_TIMEOUT_SECONDS={s.reload_timeout_seconds:g})"
            )
            return "reload_hung", reason, held
        lag = self.watcher.lag.state(now)
        if lag.lagging:
            reason = (
                f"serving v{lag.served}, {lag.behind} versions behind the newest announced v{lag.newest} "
                f"(more than TBA_MAX_STALENESS={s.max_staleness}) for {lag.over_seconds:.0f} s "
                f"(TBA_LAG_SECONDS={s.lag_seconds:g})"
            )
            return "lagging", reason, lag.over_seconds
        return None

    def status(self) -> dict:
        groups_per_s, samples_per_s, tokens_per_s = self.rates.rates()
        pub = self.publisher.stats
        now = self.clock()
        lag = self.watcher.lag.state(now)
        warning = self.warning(now)
        tally = self.lag_tally
        return {
            "searcher_id": self.searcher_id,
            "state": self.state,
            "version": self.engine.version,
            "newest_seen_version": self.watcher.newest_seen,
            "version_lag": lag.behind,
            "lag_over_bound_s": round(lag.over_seconds, 3),
            "lagging": int(warning is not None and warning[0] == "lagging"),
            "reload_hung": int(warning is not None and warning[0] == "reload_hung"),
            "warning": None if warning is None else warning[1],
            "warning_kind": None if warning is None else warning[0],
            "warning_seconds": None if warning is None else round(warning[2], 3),
            "version_lag_mean": None if tally.lag_mean is None else round(tally.lag_mean, 3),
            "version_lag_max": tally.lag_max,
            "samples_too_stale": tally.too_stale,
            "max_staleness": self.settings.max_staleness,
            "batches": self.batches,
            "groups_generated": self.groups_generated,
            "samples_generated": self.samples_generated,
            "tokens_generated": self.tokens_generated,
            "groups_published": pub.groups_published,
            "samples_published": pub.samples_published,
            "groups_per_s": round(groups_per_s, 3),
            "samples_per_s": round(samples_per_s, 3),
            "tokens_per_s": round(tokens_per_s, 3),
            "reloads": self.reloads,
            "reload_ms_last": None if self.reload_ms_last is None else round(self.reload_ms_last, 3),
            "generate_seconds": round(self.generate_seconds, 3),
            "score_seconds": round(self.score_seconds, 3),
            "reload_seconds": round(self.reload_seconds_total, 3),
            "time": self.time_split(),
            "rejected_checkpoints": self.watcher.rejected,
            "reload_failures": self.reload_failures,
            "vanished_checkpoints": self.watcher.vanished,
            "lost_checkpoints": self.watcher.lost,
            "watcher_errors": self.watcher.errors,
            "watcher_last_error": self.watcher.last_error,
            "watcher_alive": int(self.watcher.alive),
            "leases_held": len(self.watcher.leases.held),
            "lease_errors": self.watcher.leases.errors,
            "spilled": len(self.spill),
            "spill_bytes": self.spill.nbytes,
            "spilled_total": pub.groups_spilled_total,
            "dropped_samples": self.scorer.dropped,
            "episodes": self.episodes,
            "episode_turns": self.episode_turns,
            "env_tokens": self.env_tokens,
            "episode_failures": dict(self.episode_failures),
            "ref_pairs_total": self.scorer.ref_pairs_total,
            "ref_pairs_scored": self.scorer.ref_pairs_scored,
            "skipped_prompts": self.skipped_prompts,
            "paced_seconds": round(self.pacer.waited_seconds, 3),
            "samples_ahead": self.pacer.ahead,
            "max_samples_ahead": self.settings.max_samples_ahead,
            "redis_up": int(pub.redis_ok),
            "redis_error": pub.last_error,
            "ready": int(self.ready()[0]),
            "uptime_s": round(time.monotonic() - self._started, 3),
        }

    def time_split(self) -> dict[str, Any]:
        """Where the generating thread's time went since the loop started (seconds): generating, reloads'
        pauses, paced waits, and the rest (handing batches to the scoring thread, drawing prompts); the scoring
        thread's own time beside it (it overlaps generation); the fraction of the wall spent generating."""
        wall = time.monotonic() - self._started
        parts = {
            "generate": self.generate_seconds,
            "reload": self.reload_seconds_total,
            "paced": self.pacer.waited_seconds,
        }
        parts["other"] = max(0.0, wall - sum(parts.values()))
        return {
            "wall_s": round(wall, 3),
            "seconds": {k: round(v, 3) for k, v in parts.items()},
            "score_thread_s": round(self.score_seconds, 3),
            "generating_fraction": round(self.generate_seconds / max(wall, 1e-9), 4),
        }

    def close(self) -> None:
        """Release the spill directory lock and the Redis connections (the engine belongs to the caller)."""
        self.spill.close()
        self.publisher.client.close()
