"""The trainer service: wait for the warm-up, then sample, step, report, and publish every k steps.

Versions (docs/algorithm.md §5): the base model is version 0; after u optimizer
steps the policy is version u, and the checkpoint published after step u
carries version u (so k, 2k, ... in async mode, every step in sync mode; in async
mode also any step after which no batch came within the buffer's long-poll). Each
request to the buffer carries ``trainer_version = u`` so the buffer can compute
staleness; sync mode also asks for ``only_version = u`` and waits for those
samples (the on-policy baseline). A restart resumes from the newest complete
checkpoint's state and continues numbering from there, so no version is reused.

Stopping: ``max_steps`` reached or a stop request (SIGTERM) finishes the current
step, publishes a final checkpoint if the newest step is unpublished, and
returns 0. The buffer being unreachable is never fatal; a 4xx answer (our bug
or a wrong token) stops the run with 1 after saving what was learned.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import redis

from services.trainer.batching import rows_from_batch
from services.trainer.bounds import ON_POLICY, WAIT_REASONS, ReuseBound
from services.trainer.checkpointing import (
    Announcer,
    OptimizerFile,
    ResumePoint,
    TrainerState,
    find_resume_point,
    optimizer_path,
    restore_trainer_state,
    save_checkpoint,
)
from services.trainer.client import BufferClient, BufferRequestError, StopRequested
from services.trainer.distributed import Ranks, full_state, shard
from services.trainer.learner import Learner
from services.trainer.losses import BetaSchedule, make_loss
from services.trainer.metrics import TrainerMetrics
from services.trainer.optim import LRSchedule, build_optimizer, set_step
from services.trainer.reference import TrainerReference
from tba.checkpoint_leases import CheckpointLeases
from tba.checkpoints import CheckpointStore, model_identity
from tba.health import HealthServer
from tba.keys import Keys
from tba.model.precision import compute_dtype
from tba.schemas import SampledBatch, SampleRequest
from tba.settings import SettingsError, TrainerSettings
from tba.tracking import Tracker

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)
T = TypeVar("T")
UNKNOWN_SEARCHER = "(unknown)"  # samples whose stored record names no searcher
PUBLISH_RETRY_SECONDS = 5.0  # how often a failed checkpoint write is retried while the trainer waits
WAIT_LOG_SECONDS = 10.0  # a wait for a batch longer than this is logged, with why


class Trainer:
    """One trainer run. ``run()`` returns the process exit code."""

    def __init__(self, settings: TrainerSettings, stop: threading.Event | None = None) -> None:
        self.settings = settings
        self.stop = stop or threading.Event()
        self.k = 1 if settings.mode == "sync" else settings.checkpoint_every
        self.store = CheckpointStore(settings.checkpoint_dir)
        self.metrics = TrainerMetrics(metrics_file=settings.metrics_file, max_steps=settings.max_steps)
        beta_end = settings.beta_end if settings.beta_end is not None else settings.beta_start
        self.beta_schedule = BetaSchedule(settings.beta_start, beta_end, settings.beta_anneal_steps)
        self.step = 0
        self.published = 0  # newest published version (0: the base model)
        self.beta = self.beta_schedule(1)
        self.samples_seen = 0
        self.tokens_seen = 0
        self.arrival_cursor = 0  # the last arrival the buffer served (recency_order "arrival")
        self.batch_samples = settings.prompts_per_step * settings.train_samples_per_prompt
        self.reuse = ReuseBound(settings.max_reuse if settings.mode == "async" else None)
        self.health: HealthServer | None = None
        self.reference = ""  # identity of the reference model, stated with every sample request (setup)
        self.ranks = Ranks.from_env()  # under torchrun: rank 0 runs this loop, the others follow it (follow())
        self._started = time.monotonic()
        self._retry_at = 0.0  # when a failed publish is tried again (while waiting)
        self._seconds_before = 0.0  # run time of the processes this run resumed from
        # Weights-only publishing: the newest checkpoint's optimizer file, which the next checkpoints link until
        # TBA_OPTIMIZER_STATE_SECONDS have passed since it was written (None: the next one writes its own).
        self._optimizer_file: OptimizerFile | None = None
        # Made by setup() (load_policy() on every rank, the clients on rank 0 only); None until then. The
        # properties below hand them out, so a use before setup() fails with that reason.
        self.device = "cpu"
        self._tokenizer: PreTrainedTokenizerBase | None = None
        self._learner: Learner | None = None
        self._client: BufferClient | None = None
        self._announcer: Announcer | None = None
        self._leases: CheckpointLeases | None = None  # the searchers' leases, which pruning honours

    @property
    def learner(self) -> Learner:
        return _set_up(self._learner, "learner")

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        return _set_up(self._tokenizer, "tokenizer")

    @property
    def client(self) -> BufferClient:
        return _set_up(self._client, "buffer client")

    @property
    def announcer(self) -> Announcer:
        return _set_up(self._announcer, "checkpoint announcer")

    def run_seconds(self) -> float:
        """Seconds this run has been going: this process's so far, plus those before the last restart."""
        return self._seconds_before + time.monotonic() - self._started

    # ---- set-up -------------------------------------------------------------------------------------------
    def setup(self) -> None:
        """Health server first (probes see "starting"), then the policy and optimizer, then the clients."""
        import torch
        from transformers.utils import logging as hf_logging

        from tba.redis_client import sync_client

        s = self.settings
        hf_logging.disable_progress_bar()  # per-checkpoint progress bars would drown the step lines
        if s.torch_threads:
            torch.set_num_threads(s.torch_threads)
        self.device = self.ranks.start(s.device)
        if not self.ranks.main:  # the others only compute: rank 0 talks to the buffer, Redis and Prometheus
            self.load_policy()
            return
        self.health = HealthServer(
            s.metrics_host, s.metrics_port, self.ready, self.metrics.registry, status=self.status
        ).start()
        log.info("trainer health and metrics on http://%s:%d (/status, /metrics)", s.metrics_host, self.health.port)
        # The run's settings travel with a W&B run; the token and the Redis URL (it may hold a password) do not.
        self.metrics.tracker = Tracker(
            s.tensorboard_dir,
            name="trainer",
            wandb_mode=s.wandb,
            wandb_project=s.wandb_project,
            wandb_group=s.wandb_group,
            wandb_dir=s.wandb_dir,
            config=s.public_dump(),
        )
        if s.loss == "grpo" and s.mode == "async":
            log.warning(
                "loss=grpo is an on-policy estimator: in async mode it trains on stale samples "
                "without importance weights (use mode=sync for the on-policy baseline)"
            )
        resume = self.load_policy()
        self.reference = model_identity(Path(s.model))  # the reference is the base model, in every run
        log.info("objective: temperature %g, reference model %s (%s)", s.temperature, self.reference, s.model)
        token = s.auth_token.get_secret_value() if s.auth_token else None
        self._client = BufferClient(
            s.buffer_url,
            auth_token=token,
            timeout=s.request_timeout,
            max_bytes=max(s.max_payload_bytes, 64 << 20),
            stop=self.stop,
        )
        redis_client = sync_client(s.redis_url, s.redis_cluster, timeout=5)
        self._announcer = Announcer(redis_client, Keys(s.namespace))
        self._leases = CheckpointLeases(redis_client, Keys(s.namespace))
        self.metrics.set_version(self.published)
        if resume:
            self.announcer.announce(resume.manifest)  # it may never have been announced before the crash

    def load_policy(self) -> ResumePoint | None:
        """Model, optimizer and counters from the newest complete checkpoint, else the base model."""
        import torch

        from tba.model.tokenizer import load_tokenizer

        s = self.settings
        resume = self.ranks.broadcast(find_resume_point(self.store) if self.ranks.main else None)
        if resume is None and not (Path(s.model) / "config.json").is_file():
            raise SettingsError(
                f"TBA_MODEL / --model: {s.model} holds no Hugging Face model (no config.json); "
                f"make one with `tba model init --out {s.model}`"
            )
        # A LoRA checkpoint holds the adapters only: the tokenizer is the base's.
        self._tokenizer = tokenizer = load_tokenizer(resume.directory if resume and not s.lora_rank else s.model)
        if resume is None:  # before the model: new adapters are initialised from the RNG
            torch.manual_seed(s.seed)
            random.seed(s.seed)
        model = self.load_model(resume.directory if resume else None).to(self.device)
        if self.ranks.distributed:
            if s.ref_pass == "trainer":
                raise SettingsError(
                    "TBA_REF_PASS=trainer needs one trainer process (its pass would break the ranks' lockstep): "
                    "under torchrun leave the reference pass to the searchers (TBA_REF_PASS=searcher)"
                )
            model = shard(model)
        schedule = LRSchedule.from_settings(s)
        optimizer, scheduler = build_optimizer(model, s.peak_lr, s.weight_decay, schedule, self.run_seconds)
        if resume:
            restore_trainer_state(resume.directory, model, optimizer, scheduler, self.ranks)
            st = resume.state
            self.step, self.published, self.beta = st.step, resume.manifest.version, st.beta
            self.samples_seen, self.tokens_seen = st.samples_seen, st.tokens_seen
            self.arrival_cursor = st.arrival_cursor
            self._seconds_before = st.run_seconds
            set_step(scheduler, st.step)
            log.info("resumed from %s: step %d, version %d", resume.directory.name, self.step, self.published)
        else:
            log.info("starting from the base model %s (version 0)", s.model)
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self._learner = Learner(
            model,
            optimizer,
            scheduler,
            make_loss(s.loss, s.importance_clip),
            temperature=s.temperature,
            pad_id=pad_id,
            token_budget=s.token_budget,
            grad_clip=s.grad_clip,
            compute_dtype=compute_dtype(s.dtype, torch.device(self.device).type),
            prefix_sharing=s.prefix_sharing,
            ranks=self.ranks,
            reference=TrainerReference(model, str(s.model), bool(s.lora_rank), self.device)
            if s.ref_pass == "trainer"
            else None,
        )
        return resume

    def load_model(self, checkpoint: Path | None):
        """The policy as a transformers model: the base, or the checkpoint to resume; in a LoRA run the frozen
        base with trainable adapters (new, or the checkpoint's), so the optimizer holds the adapters only."""
        import torch
        from transformers import AutoModelForCausalLM

        from tba.model.adapters import AdapterError, is_adapter, wrap_for_training

        s = self.settings
        if checkpoint is not None and is_adapter(checkpoint) != bool(s.lora_rank):
            raise SettingsError(
                f"TBA_LORA_RANK={s.lora_rank}, but the checkpoint to resume ({checkpoint}) is "
                f"{'an adapter' if is_adapter(checkpoint) else 'a full model'}: resume with the run's settings, "
                f"or start a new run in another TBA_CHECKPOINT_DIR"
            )
        if not s.lora_rank:
            return AutoModelForCausalLM.from_pretrained(str(checkpoint or s.model), dtype=torch.float32)
        base = AutoModelForCausalLM.from_pretrained(str(s.model), dtype=torch.float32)
        try:
            model = wrap_for_training(
                base, s.model, s.lora_rank, s.lora_alpha, s.lora_dropout, s.lora_target_modules, resume_from=checkpoint
            )
        except (AdapterError, ValueError) as err:  # peft: a target module the model does not have
            raise SettingsError(f"TBA_LORA_*: {err}") from err
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        total = sum(p.numel() for p in model.parameters())
        log.info(
            "LoRA rank %d on %s: %d trainable parameters of %d (%.2f%%)",
            s.lora_rank,
            ",".join(s.lora_target_modules),
            trainable,
            total,
            100 * trainable / total,
        )
        return model

    def ready(self) -> tuple[bool, str]:
        state = self.metrics.status()["state"]
        if state in ("starting", "done"):
            return False, f"trainer is {state}"
        if self._client is not None and not self._client.reachable:
            return False, f"buffer {self.settings.buffer_url} not reachable yet"
        return True, f"trainer {state} at step {self.step}"

    def status(self) -> dict:
        out = self.metrics.status()
        out.update(
            step=self.step,
            version=self.published,
            mode=self.settings.mode,
            loss_name=self.settings.loss,
            max_steps=self.settings.max_steps,
            samples_seen=self.samples_seen,
            tokens_seen=self.tokens_seen,
            run_seconds=round(self.run_seconds(), 1),
        )
        return out

    # ---- the loop -----------------------------------------------------------------------------------------
    def run(self) -> int:
        if not self.ranks.main:
            return self.follow()
        code, clean = 0, True
        try:
            self.setup()
            if not self.done():
                self.wait_for_warmup()
            while not self.done():
                batch, wait_s, reason = self.fetch()
                if self.train_on(batch, wait_s, reason) and self.step % self.k == 0:
                    self.publish()
        except StopRequested:
            log.info("stopping: saving and exiting")
        except BufferRequestError as err:
            log.error("the buffer refused our request, stopping: %s", err)
            code = 1
        except BaseException:
            clean = False
            raise
        finally:
            self.finish(publish=clean and self._learner is not None)
        return code

    def follow(self) -> int:
        """Rank > 0 under torchrun: do what rank 0 says (a step on the batch it fetched, a checkpoint, stop)."""
        self.setup()
        while True:
            command = self.ranks.broadcast()
            if command[0] == "step":
                self.learner.step(*command[1:])
            elif command[0] == "publish":
                full_state(self.learner.model, self.learner.optimizer, self.ranks, with_optimizer=command[1])
            else:
                self.ranks.stop()
                return 0

    def done(self) -> bool:
        return self.stop.is_set() or self.budget_spent()

    def budget_spent(self) -> bool:
        s = self.settings
        return (s.max_steps is not None and self.step >= s.max_steps) or (
            s.max_seconds is not None and self.run_seconds() >= s.max_seconds
        )

    def wait_for_warmup(self) -> None:
        """Block until the buffer holds ``warmup_samples`` samples (docs/algorithm.md §6).

        Sync mode has no warm-up: each step waits for its own version's samples, and the buffer's count
        of distinct samples may never reach the warm-up's while the searchers wait for the next version."""
        self.metrics.set_state("warmup")
        if self.settings.mode == "sync":
            return
        need = self.settings.warmup_samples
        start, last_log = time.monotonic(), 0.0
        while True:
            stats = self.client.stats()
            self.metrics.set_buffer_failures(self.client.failures)
            have = int(stats.get("samples", 0))
            if have >= need:
                self.reuse.start(int(stats.get("samples_ingested", 0)), self.samples_seen, self.batch_samples)
                break
            if time.monotonic() - last_log > 10:
                log.info("warm-up: the buffer holds %d of %d samples", have, need)
                last_log = time.monotonic()
            if self.stop.wait(self.settings.poll_seconds) or self.budget_spent():
                raise StopRequested
        log.info("warm-up done after %.1f s", time.monotonic() - start)

    def sample_request(self) -> SampleRequest:
        """The next batch's request: sync mode asks for this version's samples, async mode for samples within
        the staleness and reuse bounds (services/trainer/bounds.py); the buffer holds it until it can serve."""
        s = self.settings
        sync = s.mode == "sync"
        return SampleRequest(
            num_prompts=s.prompts_per_step,
            samples_per_prompt=s.train_samples_per_prompt,
            recency_prob=s.recency_prob,
            reward_inv_temp=s.reward_inv_temp,
            recency_draw=s.recency_draw,
            trainer_version=self.step,
            recent_versions=s.recent_versions or self.k,
            max_staleness=None if sync else s.max_staleness,
            only_version=self.step if sync else None,
            min_samples_generated=None if sync else self.reuse.min_generated(self.samples_seen, self.batch_samples),
            after_arrival=self.arrival_cursor if not sync and s.recency_order == "arrival" else None,
            wait_seconds=s.sample_wait_seconds,
            seed=None if s.sample_seed is None else s.sample_seed + self.step,
            temperature=s.temperature,
            reference=self.reference,
        )

    def fetch(self) -> tuple[SampledBatch, float, str | None]:
        """The next batch, how long it took to come and why the trainer waited for it (None: it did not).

        While the buffer cannot serve it (sync mode: this version's samples are not generated yet; async
        mode: a bound binds), the trainer waits in state "waiting", inside the buffer's long-poll, so the
        batch comes as soon as its samples arrive."""
        sync = self.settings.mode == "sync"
        start = last_log = mark = time.monotonic()
        reason: str | None = None
        while True:
            self.announcer.flush()
            answer = self.client.sample(self.sample_request())
            self.metrics.set_buffer_failures(self.client.failures)
            now = time.monotonic()
            if isinstance(answer, SampledBatch):
                self.reuse.read(answer.samples_generated)
                if answer.arrival_cursor is not None:
                    self.arrival_cursor = answer.arrival_cursor
                self.metrics.add_wait(now - mark, reason)
                return answer, now - start, reason
            reason = ON_POLICY if sync else WAIT_REASONS.get(answer.code, answer.code)
            self.metrics.add_wait(now - mark, reason)  # counted as it goes: a long wait shows while it lasts
            mark = now
            self.metrics.set_waiting(reason)
            if answer.code == "reuse_bound":  # the counter, in case the buffer's Redis started afresh
                self.reuse.read(int(self.client.stats().get("samples_ingested", 0)))
            if time.monotonic() - last_log > WAIT_LOG_SECONDS:
                log.info("waiting %.0f s for a batch (%s): %s", time.monotonic() - start, reason, answer.message)
                last_log = time.monotonic()
            if self.published < self.step and time.monotonic() >= self._retry_at:
                # No batch within the long-poll: the steps not published yet go out now, since what the trainer
                # waits for may wait for them. Sync mode waits for samples of version `step`, generated only once
                # its checkpoint is out; searchers paced to a batch per version (TBA_MAX_BATCHES_PER_VERSION)
                # wait for a newer one while the trainer, between two checkpoints, waits for their samples.
                self.publish()
                if self.published < self.step:  # the write failed (disk full): tried again in a while
                    self._retry_at = time.monotonic() + PUBLISH_RETRY_SECONDS
            if self.settings.sample_wait_seconds == 0:  # no long-poll: wait here between requests
                self.stop.wait(self.settings.poll_seconds)
            if self.stop.is_set() or self.budget_spent():
                raise StopRequested

    def train_on(self, batch: SampledBatch, wait_s: float = 0.0, wait_reason: str | None = None) -> bool:
        """One optimizer step on the batch's valid groups; False (no step) when none is valid."""
        rows, problems = rows_from_batch(
            batch, self.learner.vocab_size, self.learner.max_length, computes_ref=self.learner.reference is not None
        )
        for problem in problems:
            log.warning("dropped from the batch: %s", problem)
        self.metrics.dropped_groups.inc(len(problems))
        if not rows:
            log.warning("the whole batch was invalid; sampling again")
            return False
        self.metrics.set_state("training")
        beta = self.beta_schedule(self.step + 1)
        self.ranks.broadcast(("step", rows, beta))
        result = self.learner.step(rows, beta)
        self.step += 1
        self.beta = beta
        self.samples_seen += result.samples
        self.tokens_seen += result.tokens
        by_searcher = Counter(row.searcher_id or UNKNOWN_SEARCHER for row in rows)
        self.metrics.record(
            self.step, beta, result, wait_s, wait_reason, self.reuse.ratio(self.samples_seen), by_searcher
        )
        return True

    # ---- checkpoints --------------------------------------------------------------------------------------
    def publish(self, final: bool = False) -> None:
        """Commit a checkpoint of version ``step``, announce it, prune old ones.

        A failed write (disk full, say) is logged and retried at the next checkpoint, except the final one.
        """
        s = self.settings
        start = time.perf_counter()
        state = TrainerState(
            step=self.step,
            beta=self.beta,
            samples_seen=self.samples_seen,
            tokens_seen=self.tokens_seen,
            arrival_cursor=self.arrival_cursor,
            run_seconds=self.run_seconds(),
            settings=s.public_dump(),
        )
        link = self._optimizer_file
        if final or (link is not None and time.monotonic() - link.written_at >= s.optimizer_state_seconds):
            link = None
        self.ranks.broadcast(("publish", link is None))
        model_state, optimizer_state = full_state(
            self.learner.model, self.learner.optimizer, self.ranks, with_optimizer=link is None
        )
        if link is not None:
            state.optimizer_step = link.step
        try:
            manifest = save_checkpoint(
                self.store,
                self.learner.model,
                self.tokenizer,
                self.learner.optimizer,
                self.learner.scheduler,
                state,
                model_state=model_state,
                optimizer_state=optimizer_state,
                optimizer_file=None if link is None else link.path,
            )
        except OSError as err:
            self._optimizer_file = None  # the next checkpoint writes the optimizer's state (links may not work)
            if final:
                raise
            then = (
                f"retrying every {PUBLISH_RETRY_SECONDS:.0f} s (sync mode: the searchers need it)"
                if s.mode == "sync"
                else f"training goes on, next try in {self.k} steps"
            )
            log.error("could not write checkpoint v%d (%s); %s", self.step, err, then)
            return
        self.published = manifest.version
        path = optimizer_path(self.store.resolve(manifest))
        self._optimizer_file = link._replace(path=path) if link else OptimizerFile(path, self.step, time.monotonic())
        self.metrics.set_version(manifest.version)
        self.announcer.announce(manifest)
        deleted = self.prune()
        seconds = time.perf_counter() - start
        self.metrics.published(seconds)
        log.info(
            "published checkpoint v%d in %.2f s%s", manifest.version, seconds, f" (pruned {deleted})" if deleted else ""
        )

    def prune(self) -> list[int]:
        """Delete the checkpoints retention lets go and no searcher holds a lease on (tba/checkpoint_leases.py);
        none while the leases cannot be read (the next publish tries again)."""
        s = self.settings
        try:
            return self.store.prune(
                s.keep_checkpoints, s.checkpoint_grace_seconds, s.max_checkpoints_on_disk, leases=self._leases
            )
        except redis.RedisError as err:
            log.warning("pruning no checkpoint: the searchers' leases cannot be read (%s)", err)
            return []

    def finish(self, publish: bool) -> None:
        why = "stop requested" if self.stop.is_set() else "budget reached" if self.budget_spent() else "error"
        log.info("stopping at step %d (%s)", self.step, why)
        try:
            if publish and self.step > self.published:
                self.publish(final=True)
            if self._announcer is not None:
                self._announcer.flush()
        finally:
            self.metrics.set_state("done")
            if publish:  # a clean stop: the other ranks wait for the next command. After a failure, torchrun
                self.ranks.broadcast(("stop",))  # stops them (they may be inside a collective of the failed step)
            self.ranks.stop(clean=publish)
            if self._client is not None:
                self._client.close()
            if self.health is not None:
                self.health.stop()
            if self.metrics.tracker is not None:
                self.metrics.tracker.close()


def run_trainer(settings: TrainerSettings, stop: threading.Event | None = None) -> int:
    return Trainer(settings, stop).run()


def _set_up(thing: T | None, name: str) -> T:
    if thing is None:
        raise RuntimeError(f"the trainer's {name} is made by setup(), which has not run")
    return thing
