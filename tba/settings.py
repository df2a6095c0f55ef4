"""Settings of every service: environment variables ``TBA_*`` and matching CLI flags.

One base (:class:`CommonSettings`) holds what every service reads; each service
derives its own. Every field has a one-line description: it is the ``--help``
text and docs/configuration.md's table. A bad value stops start-up with a message naming
the variable (:class:`SettingsError`). Each service writes what it resolved where
``TBA_SETTINGS_FILE`` says (``tba up``: the run directory). This module imports no ML
library, so ``tba --help`` stays instant.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import typing
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from pydantic_settings import SettingsError as SourceError

ENV_PREFIX = "TBA_"
# The modules that get LoRA adapters unless TBA_LORA_TARGET_MODULES says otherwise: the Llama family's linear
# layers (Llama, Mistral, Qwen2, SmolLM2, the tiny model), every projection of attention and MLP.
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# Bounded asynchrony's defaults, chosen by measurement (docs/results/decoupling.md).
DEFAULT_MAX_STALENESS: int | None = 8
DEFAULT_MAX_REUSE: float | None = 1.0
S = TypeVar("S", bound="CommonSettings")
log = logging.getLogger(__name__)


class SettingsError(ValueError):
    """Invalid configuration; the message names the variable and the flag."""


def off_to_none(value: Any) -> Any:
    """A setting with a default switched off by name (``off`` or ``none``): None; anything else unchanged."""
    return None if isinstance(value, str) and value.strip().lower() in ("off", "none") else value


def redact_url(url: str) -> str:
    """``url`` with its password (and user name) replaced by ``***``: the one form in which a URL that may carry
    credentials (``redis://:password@host``, ``https://user:token@host``) is logged, written or answered."""
    if "@" not in url:
        return url
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rsplit("@", 1)[1]))


class CommonSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", validate_default=True)

    redis_url: str = Field("redis://127.0.0.1:6379/0", description="Redis URL (redis:// or rediss://).")
    redis_cluster: bool = Field(False, description="Redis is a Redis Cluster; redis_url names any of its nodes.")
    namespace: str = Field("tba", pattern=r"^[A-Za-z0-9_.-]+$", description="Prefix of every Redis key.")
    auth_token: SecretStr | None = Field(None, description="Shared bearer token for writes and sampling.")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", description="Log level.")
    log_json: bool = Field(False, description="Structured JSON logs instead of console lines.")
    max_payload_bytes: int = Field(8 * 1024 * 1024, ge=1024, description="Largest accepted message in bytes.")
    task: str = Field(
        "arithmetic",
        description="Task: arithmetic, countdown, sums, gsm8k, reward-model, redteam, calculator (multi-turn, "
        "a tool), reasoning-gym, verifiers, openenv (docs/environments.md), or package.module:Class of your own.",
    )
    task_options: dict[str, Any] = Field(default_factory=dict, description='Task options as JSON, e.g. {"digits": 2}.')
    temperature: float = Field(0.7, gt=0.0, le=10.0, description="Sampling temperature T; log-probs use logits/T.")
    settings_file: Path | None = Field(
        None, description="Where the service writes the settings it resolved at start (JSON, secrets left out)."
    )

    def public_dump(self) -> dict[str, Any]:
        """These settings as JSON values with no secret in them: the auth token left out, the password of every
        URL redacted. What a service writes to disk, a tracker or an answer (checkpoints' trainer state, the
        TensorBoard and W&B config) goes through here, and only this."""
        dumped = self.model_dump(mode="json", exclude={"auth_token"})
        return {k: redact_url(v) if isinstance(v, str) and "://" in v else v for k, v in dumped.items()}

    def write_resolved(self, service: str) -> None:
        """Write these settings (:meth:`public_dump`) to ``settings_file``, if set: what this service runs with,
        every default resolved, for the run's record."""
        from tba.atomic import write_text

        if self.settings_file is not None:
            write_text(self.settings_file, json.dumps({"service": service, "settings": self.public_dump()}, indent=1))

    @field_validator("redis_url")
    @classmethod
    def _redis_scheme(cls, v: str) -> str:
        if not v.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must start with redis://, rediss:// or unix://")
        return v


class BufferSettings(CommonSettings):
    host: str = Field("127.0.0.1", description="Address the buffer's HTTP server binds.")
    port: int = Field(8400, ge=0, le=65535, description="Port of the buffer's HTTP server.")
    consumer_name: str = Field(default_factory=socket.gethostname, description="This replica's consumer name.")
    per_prompt_capacity: int = Field(100, ge=1, description="Samples kept per prompt (oldest version evicted).")
    global_capacity: int = Field(1_000_000, ge=1, description="Samples kept in all (oldest evicted).")
    ingest_batch: int = Field(256, ge=1, le=10_000, description="Stream entries read per XREADGROUP call.")
    claim_idle_ms: int = Field(30_000, ge=100, description="Reclaim entries of a consumer idle this long (ms).")
    ingest_enabled: bool = Field(True, description="Consume the trajectory stream (off: an HTTP-only replica).")
    ingest_block_ms: int = Field(1000, ge=1, le=60_000, description="Longest wait of one XREADGROUP call (ms).")
    trim_interval_seconds: float = Field(5.0, gt=0.0, description="How often acknowledged stream entries are trimmed.")
    dedup_window_seconds: float = Field(
        3600.0,
        gt=0.0,
        le=30 * 86400.0,
        description="How long a group id is remembered to refuse a resent group. Costs about 550 bytes of "
        "Redis memory per group (group rate x window: 10 groups/s for an hour, 20 MB), beyond the "
        "capacities; a group resent later than this (a searcher's spill replayed after a longer "
        "outage) is stored again.",
    )
    max_sample_wait_seconds: float = Field(
        30.0,
        ge=0.0,
        le=60.0,
        description="Longest the buffer holds a sample request open (long-poll), whatever the request asks.",
    )
    dead_letter_maxlen: int = Field(100_000, ge=1, description="Dead-letter stream length kept (oldest trimmed).")
    dead_letter_payload_bytes: int = Field(65_536, ge=0, description="Bytes of a bad payload kept in its dead letter.")


class ModelSettings(CommonSettings):
    """What the trainer and the searchers share about the policy model."""

    model: Path = Field(Path("models/base"), description="Base (and reference) model directory, HF format.")
    checkpoint_dir: Path = Field(Path("checkpoints"), description="Shared directory of published checkpoints.")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32",
        description="Weights dtype (bf16 on GPUs). A CPU trainer set to bfloat16 computes under bf16 autocast on a "
        "CPU with bf16 arithmetic (AMX or AVX512-BF16), else in float32.",
    )
    seed: int = Field(0, description="Random seed.")
    metrics_host: str = Field("127.0.0.1", description="Address of the health/metrics HTTP server.")
    metrics_port: int = Field(0, ge=0, le=65535, description="Port of the health/metrics server (0: any free).")
    ref_pass: Literal["searcher", "trainer"] = Field(
        "searcher",
        description="Where log pi_ref(y|x) is computed: on the searchers (each loads the base model "
        "beside its engine) or on the trainer (the base model, or the LoRA policy with its adapters off; "
        "one trainer process), which leaves the searchers only generation and rewards. Set it alike "
        "on both services.",
    )
    lora_rank: int = Field(
        0,
        ge=0,
        le=512,
        description="LoRA rank r: the trainer trains adapters of this rank on the "
        "frozen base and publishes adapter-only checkpoints, the searchers serve them (0: full "
        "fine-tuning).",
    )


class ProcessSettings(BaseModel):
    """Where the trainer runs and how it talks to the buffer: device, processes, budgets, waits."""

    SECTION: ClassVar[str] = "trainer: process, budgets and waits"

    buffer_url: str = Field("http://127.0.0.1:8400", description="Base URL of the buffer service.")
    device: str = Field("cpu", description="Torch device (cpu, cuda, cuda:0).")
    torch_threads: int = Field(0, ge=0, description="CPU threads for torch (0: torch's default).")
    trainer_procs: int = Field(
        1,
        ge=1,
        le=1024,
        description="Trainer processes on this host: above 1, `tba trainer` "
        "runs itself under torchrun as that many FSDP2 ranks (on GPUs: one per GPU).",
    )
    warmup_samples: int = Field(64, ge=0, description="Samples the buffer must hold before training starts.")
    max_steps: int | None = Field(None, ge=1, description="Stop after this many steps (unset: run forever).")
    max_seconds: float | None = Field(
        None,
        gt=0.0,
        description="Stop after this many seconds of running, warm-up included and summed over "
        "restarts (unset: no limit). LR schedules decay towards the nearer limit.",
    )
    poll_seconds: float = Field(0.5, gt=0.0, le=60.0, description="Wait between checks of the warm-up.")
    sample_wait_seconds: float = Field(
        2.0,
        ge=0.0,
        le=60.0,
        description="Longest the buffer holds one sample request open while its batch cannot be served yet "
        "(a long-poll: it answers as soon as the samples arrive).",
    )
    request_timeout: float = Field(30.0, gt=0.0, description="Timeout of one buffer HTTP request in seconds.")


class LossSettings(BaseModel):
    """The objective: which loss, in which mode, and its KL coefficient beta."""

    SECTION: ClassVar[str] = "trainer: loss and mode"

    loss: Literal["tb", "grpo"] = Field("tb", description="Loss: tb (Trajectory Balance) or grpo (on-policy baseline).")
    mode: Literal["async", "sync"] = Field(
        "async", description="async: off-policy replay; sync: current version only, a checkpoint every step."
    )
    beta_start: float = Field(0.05, gt=0.0, description="KL coefficient beta at step 1.")
    beta_end: float | None = Field(
        None,
        gt=0.0,
        description="KL coefficient beta after the anneal (unset: beta_start).",
    )
    beta_anneal_steps: int = Field(0, ge=0, description="Steps of the linear beta anneal (0: constant).")
    importance_clip: float | None = Field(
        None,
        gt=0.0,
        lt=1.0,
        description="TB only: weight each sample's squared residual (and its share of log Z) by its importance "
        "ratio pi_theta(y|x) / mu(y|x) to the policy that generated it, clipped to [1 - eps, 1 + eps] with this "
        "eps (FlowRL's correction for stale samples; unset: every sample counts once, TB needing no ratio).",
    )


class OptimizerSettings(BaseModel):
    """The optimizer and its schedule, and how a batch becomes micro-batches."""

    SECTION: ClassVar[str] = "trainer: optimizer"

    lr: float | None = Field(
        None, gt=0.0, description="Peak learning rate (AdamW) of either mode; unset: the mode's own."
    )
    lr_async: float = Field(
        2e-5,
        gt=0.0,
        description="Peak learning rate of the asynchronous trainer (TBA_MODE=async) unless TBA_LR is set; it "
        "takes about twice the steps per second of the synchronous one, on samples a few versions old.",
    )
    lr_sync: float = Field(
        6e-5,
        gt=0.0,
        description="Peak learning rate of the synchronous trainer (TBA_MODE=sync) unless TBA_LR is set.",
    )
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW weight decay.")
    lr_schedule: Literal["constant", "linear", "wsd"] = Field("constant", description="LR schedule after warmup.")
    lr_warmup_steps: int = Field(0, ge=0, description="Linear LR warmup steps.")
    lr_decay_fraction: float = Field(
        0.1, gt=0.0, le=1.0, description="wsd: final fraction of the run (max_steps or max_seconds) that decays."
    )
    lr_decay_start_samples: int | None = Field(
        25_000,
        ge=0,
        le=10**12,
        description="The rate also decays after this many samples trained, linearly over TBA_LR_DECAY_SAMPLES down "
        "to TBA_LR_MIN_RATIO of the peak and held there, below the schedule's own decay: the same rate after the "
        "same data, whatever the budget or the trainer's speed (off: no such decay).",
    )
    lr_decay_samples: int = Field(40_000, ge=1, le=10**12, description="Samples trained over that decay.")
    lr_min_ratio: float = Field(0.3, ge=0.0, le=1.0, description="The rate after that decay, a fraction of the peak.")
    grad_clip: float | None = Field(1.0, gt=0.0, description="Gradient-norm clip (unset: none).")
    token_budget: int = Field(16384, ge=64, description="Padded tokens per micro-batch (gradient accumulation).")
    prefix_sharing: bool = Field(
        True,
        description="Compute each prompt and each shared completion prefix once per "
        "micro-batch (a 4D attention mask; models with sdpa or eager attention), else one "
        "padded row per sample. Same sums and gradients either way.",
    )

    @field_validator("lr_decay_start_samples", mode="before")
    @classmethod
    def _data_decay_off(cls, v: Any) -> Any:
        """``TBA_LR_DECAY_START_SAMPLES=off`` (or ``none``): no decay tied to the data."""
        return off_to_none(v)


class DrawSettings(BaseModel):
    """What the trainer asks the buffer for: the batch, the sampling rule and the bounds of bounded asynchrony."""

    SECTION: ClassVar[str] = "trainer: buffer draw and bounded asynchrony"

    prompts_per_step: int = Field(8, ge=1, le=512, description="P: prompts per optimizer step.")
    train_samples_per_prompt: int = Field(
        8, ge=2, le=128, description="K: samples per prompt in a training batch (log Z needs at least 2)."
    )
    recency_prob: float = Field(0.95, ge=0.0, le=1.0, description="m: probability of the recency branch.")
    reward_inv_temp: float = Field(0.0, ge=0.0, description="Inverse temperature of the reward branch.")
    recency_draw: Literal["distinct", "as_generated"] = Field(
        "as_generated",
        description="How the recency branch draws a prompt's K samples: uniformly among its distinct completions, "
        "or as generated (a completion generated c times counts c times, as the policy's own distribution).",
    )
    recency_order: Literal["arrival", "newest"] = Field(
        "arrival",
        description="How the recency branch picks among the prompts holding the newest recent_versions versions "
        "(async mode): in the order their groups arrived, each arrival once (arrival), or uniformly (newest).",
    )
    recent_versions: int | None = Field(
        None, ge=1, description="Versions the recency branch counts as 'since the last sync' (unset: k)."
    )
    max_staleness: int | None = Field(
        DEFAULT_MAX_STALENESS,
        ge=0,
        le=2**21 - 1,
        description="Staleness bound (async mode): train only on samples at most this many versions older than "
        "the trainer's policy, waiting for fresh ones when too few are left (off: no bound). The searchers read "
        "it too, to tell when they lag.",
    )
    max_reuse: float | None = Field(
        DEFAULT_MAX_REUSE,
        gt=0.0,
        le=1e6,
        description="Reuse bound (async mode): samples trained on per sample generated, the update-to-data "
        "ratio; the trainer waits for the searchers when it would exceed it (off: no bound).",
    )
    sample_seed: int | None = Field(None, description="Seed the buffer's draws with this + step (reproducible runs).")

    @field_validator("max_staleness", "max_reuse", mode="before")
    @classmethod
    def _bound_off(cls, v: Any) -> Any:
        """A bound with a default is switched off by name: ``TBA_MAX_STALENESS=off`` (or ``none``)."""
        return off_to_none(v)


class PublishSettings(BaseModel):
    """Publishing checkpoints: how often, and how many stay on disk."""

    SECTION: ClassVar[str] = "trainer: publishing checkpoints"

    checkpoint_every: int = Field(2, ge=1, description="k: publish a checkpoint every k steps (sync mode: 1).")
    keep_checkpoints: int = Field(3, ge=1, description="Published checkpoints kept on disk.")
    checkpoint_grace_seconds: float = Field(
        60.0,
        ge=0.0,
        description="Never delete a checkpoint younger than this, unless max_checkpoints_on_disk are kept "
        "(one a searcher holds a lease on is never deleted, whatever its age).",
    )
    max_checkpoints_on_disk: int = Field(
        16,
        ge=1,
        description="Bound on checkpoints on disk, young ones included: "
        "publishing every step would otherwise keep a grace period's worth.",
    )
    optimizer_state_seconds: float = Field(
        30.0,
        ge=0.0,
        le=86_400.0,
        description="Write the optimizer's state (the bulk of the resume state: twice the weights) into a "
        "checkpoint at most this often (0: into every one); the checkpoints between hard-link the last one "
        "written, so each stays resumable with exact weights and optimizer moments at most this old.",
    )


class TrackingSettings(BaseModel):
    """Where the trainer's figures go besides /metrics: a JSON-lines file, TensorBoard, W&B."""

    SECTION: ClassVar[str] = "trainer: tracking"

    metrics_file: Path | None = Field(None, description="Append one JSON line of metrics per step to this file.")
    tensorboard_dir: Path | None = Field(
        None,
        description="Write each step's figures as TensorBoard events here "
        "(tba up: <run dir>/tensorboard; unset: none).",
    )
    wandb: Literal["off", "offline", "online"] = Field(
        "off",
        description="Weights & Biases: off, offline (no account; `wandb sync` uploads later) or online "
        "(WANDB_API_KEY from the environment); needs pip install 'tba[wandb]'.",
    )
    wandb_project: str = Field("tba", min_length=1, max_length=128, description="W&B project.")
    wandb_group: str | None = Field(
        None,
        max_length=128,
        description="W&B group: one system run's trainer and evaluation runs (tba up: the run directory's name).",
    )
    wandb_dir: Path | None = Field(None, description="Where W&B writes its files (unset: the working directory).")


class AdapterSettings(BaseModel):
    """LoRA adapters when TBA_LORA_RANK is above 0."""

    SECTION: ClassVar[str] = "trainer: LoRA adapters"

    lora_alpha: float = Field(16.0, gt=0.0, le=1e6, description="LoRA alpha (adapters scale by alpha / r).")
    lora_dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout on the adapters' input while training.")
    lora_target_modules: list[str] = Field(
        default_factory=lambda: list(DEFAULT_TARGETS),
        description="Module names (JSON list) that get adapters; the default is every attention and MLP projection.",
    )


class TrainerSettings(
    ModelSettings,
    ProcessSettings,
    LossSettings,
    OptimizerSettings,
    DrawSettings,
    PublishSettings,
    TrackingSettings,
    AdapterSettings,
):
    """Every setting of the trainer: the model's (ModelSettings) and the groups above."""

    @property
    def peak_lr(self) -> float:
        """The peak learning rate: ``lr`` when set, else the mode's own (``lr_async``, ``lr_sync``)."""
        if self.lr is not None:
            return self.lr
        return self.lr_async if self.mode == "async" else self.lr_sync

    @model_validator(mode="after")
    def _trainer_cross_checks(self) -> TrainerSettings:
        if self.beta_anneal_steps == 0 and self.beta_end is not None and self.beta_end != self.beta_start:
            raise ValueError(
                f"TBA_BETA_END ({self.beta_end}) differs from TBA_BETA_START ({self.beta_start}) but "
                "TBA_BETA_ANNEAL_STEPS is 0: set the anneal length, or leave TBA_BETA_END unset"
            )
        if self.lr_schedule != "constant" and self.max_steps is None and self.max_seconds is None:
            raise ValueError(
                f"TBA_LR_SCHEDULE={self.lr_schedule} decays towards TBA_MAX_STEPS or TBA_MAX_SECONDS, both unset: "
                "set one of them or use TBA_LR_SCHEDULE=constant"
            )
        if self.max_steps is not None and self.lr_warmup_steps > self.max_steps:
            raise ValueError(f"TBA_LR_WARMUP_STEPS ({self.lr_warmup_steps}) exceeds TBA_MAX_STEPS ({self.max_steps})")
        if self.importance_clip is not None and self.loss != "tb":
            raise ValueError(
                f"TBA_IMPORTANCE_CLIP={self.importance_clip} weights the TB loss; TBA_LOSS={self.loss} takes no "
                "importance weights: leave TBA_IMPORTANCE_CLIP unset"
            )
        if self.lora_rank and not self.lora_target_modules:
            raise ValueError("TBA_LORA_TARGET_MODULES is empty: name the modules that get adapters")
        return self


# The trainer's settings in the groups people think in, in the order docs/configuration.md lists them;
# TrainerSettings is all of them, and every variable keeps its flat name (TBA_LR, TBA_CHECKPOINT_EVERY, ...).
TRAINER_GROUPS: tuple[type[BaseModel], ...] = (
    LossSettings,
    OptimizerSettings,
    DrawSettings,
    PublishSettings,
    ProcessSettings,
    TrackingSettings,
    AdapterSettings,
)


class SearcherSettings(ModelSettings):
    searcher_id: str = Field(
        default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}",
        description="This replica's id (also seeds its prompt stream).",
    )
    completions_per_prompt: int = Field(8, ge=1, description="S: completions generated per prompt.")
    prompts_per_batch: int = Field(16, ge=1, description="Prompts per generation batch.")
    max_new_tokens: int = Field(16, ge=1, le=1 << 20, description="Largest completion length.")
    max_model_len: int = Field(128, ge=16, le=1 << 24, description="vLLM max model length.")
    chat_template: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Ask the task's prompts as chat messages through the model's chat template: auto "
        "(when its tokenizer has one), on (required), off (plain text). Sets how answers are read too.",
    )
    system_prompt: str | None = Field(
        None, description="System message before each chat prompt (unset: the template's own default, if any)."
    )
    stop: list[str] = Field(
        default_factory=list,
        description="Stop strings (JSON list) that end a completion "
        "besides the model's EOS tokens; the completion keeps the stop string.",
    )
    generation_dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="The generation engine's weights dtype (the reference pass keeps TBA_DTYPE): auto is "
        "bfloat16 on a CPU that computes it natively (AMX or AVX512-BF16), where it generates "
        "faster (services/searcher/README.md), else TBA_DTYPE.",
    )
    kv_cache_gib: float = Field(1.0, gt=0.0, description="vLLM CPU KV-cache space in GiB.")
    tensor_parallel_size: int = Field(1, ge=1, description="vLLM tensor parallel size.")
    gpu_memory_utilization: float = Field(0.85, gt=0.0, le=1.0, description="vLLM GPU memory fraction.")
    spill_dir: Path = Field(Path("spill"), description="On-disk queue for groups Redis could not take.")
    spill_max_bytes: int = Field(1 << 30, ge=1024, description="Spill queue bound in bytes.")
    reload_poll_seconds: float = Field(5.0, gt=0.0, description="Fallback check of the latest manifest.")
    max_staleness: int | None = Field(
        DEFAULT_MAX_STALENESS,
        ge=0,
        le=2**21 - 1,
        description="The trainer's staleness bound, set alike on both: a searcher serving a version more than "
        "this behind the newest announced generates samples too stale to train on (off: no bound, never lagging).",
    )
    lag_seconds: float = Field(
        60.0,
        gt=0.0,
        le=86_400.0,
        description="How long a searcher may serve a version more than TBA_MAX_STALENESS behind the newest "
        "announced before /readyz answers 503 (lagging); a healthy one catches up at its next reload, within "
        "seconds.",
    )
    reload_timeout_seconds: float = Field(
        120.0,
        gt=0.0,
        le=86_400.0,
        description="A reload that has not returned after this long (a stuck filesystem or engine call) makes "
        "/readyz answer 503 until it does.",
    )
    checkpoint_lease_seconds: float = Field(
        60.0,
        ge=1.0,
        le=86_400.0,
        description="Length of a searcher's lease on a checkpoint it verifies, loads or serves, renewed every "
        "quarter of it; the trainer prunes none a live lease holds, and those of a searcher that died once its "
        "leases expire.",
    )
    max_batches_per_version: int | None = Field(
        None,
        ge=1,
        description="Pause generation after this many batches with one policy version until a newer "
        "checkpoint arrives (unset: never, the paper's free-running searchers; set it where searchers and the "
        "trainer share cores).",
    )
    max_samples_ahead: int | None = Field(
        None,
        ge=1,
        le=2**31 - 1,
        description="Pause generation while the samples generated and not yet trained on (over every searcher: "
        "taken in by the buffer minus served, or stored before the trainer's first draw, plus those still in the "
        "trajectory stream and this searcher's own being scored) number at least this "
        "many (unset or off: never). One training batch keeps the trainer fed without generating what it never "
        "trains on. Not for the exactly on-policy trainer (TBA_MODE=sync), which never draws older versions' samples: "
        "pace its searchers by version instead (`tba up --mode sync` turns this off).",
    )
    pace_max_wait_seconds: float = Field(
        30.0,
        gt=0.0,
        description="Longest pause of a paced searcher before it generates one more batch anyway, unless twice the "
        "trainer's last interval between versions is longer: then that.",
    )
    enforce_eager: bool | None = Field(None, description="vLLM eager mode (unset: on for the CPU, off on GPUs).")
    worker_spin_seconds: float = Field(
        0.01,
        ge=0.0,
        le=10.0,
        description="CPU hosts: how long vLLM's processes "
        "(engine cores, workers) busy-wait on their queues before they sleep (vLLM's "
        "own: 1 s, taken from other services).",
    )
    ref_device: str = Field("cpu", description="Torch device of the reference pass (cpu, cuda, cuda:0).")
    ref_token_budget: int = Field(16384, ge=64, description="Padded tokens per reference forward pass.")
    ref_reuse_at_base: bool = Field(
        True,
        description="While the engine serves the base weights, reuse its "
        "log-probs as the reference ones (same model) instead of a second pass.",
    )
    ref_threads: int | None = Field(
        None,
        ge=1,
        description="Torch threads of the reference pass on the CPU "
        "(unset: one per core the generation worker leaves free, at least one).",
    )
    ref_nice: int = Field(
        19,
        ge=0,
        le=19,
        description="CPU hosts: niceness of the scoring thread (reference pass, "
        "rewards, publishing), so that generation's steps never wait behind it (0: equal).",
    )
    per_token_logprobs: bool = Field(False, description="Also publish per-token behaviour log-probs.")
    redis_timeout_seconds: float = Field(2.0, gt=0.0, description="Redis socket timeout (slower: unreachable).")
    flush_timeout_seconds: float = Field(30.0, ge=0.0, description="Time to publish spilled groups at shutdown.")
    max_batches: int | None = Field(None, ge=1, description="Stop after this many batches (unset: run forever).")

    @field_validator("max_staleness", "max_samples_ahead", mode="before")
    @classmethod
    def _bound_off(cls, v: Any) -> Any:
        """``TBA_MAX_STALENESS=off`` (or ``none``), as the trainer reads it; ``TBA_MAX_SAMPLES_AHEAD=off`` frees
        a searcher that a profile paces."""
        return off_to_none(v)

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, v: list[str]) -> list[str]:
        if len(v) > 64 or any(not s or len(s) > 256 for s in v):
            raise ValueError("at most 64 stop strings, each 1 to 256 characters")
        return v


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _names(name: str) -> str:
    """A setting as people give it: its variable and its flag."""
    return f"{ENV_PREFIX}{name.upper()} / {_flag(name)}"


def setting_sections(cls: type[CommonSettings]) -> list[tuple[str, list[str]]]:
    """``cls``'s fields in the sections people look for them in, each with its title: what every service
    shares, the model, the trainer's groups (:data:`TRAINER_GROUPS`), then the service's own. The ``--help``
    of each service and docs/configuration.md list them so."""
    parts: list[tuple[str, type[BaseModel]]] = [("every service", CommonSettings)]
    if issubclass(cls, ModelSettings):
        parts.append(("the model (trainer and searchers)", ModelSettings))
    if issubclass(cls, TrainerSettings):
        parts += [(group.SECTION, group) for group in TRAINER_GROUPS]  # type: ignore[attr-defined]
    sections, seen = [], set()
    for title, part in [*parts, (f"{cls.__name__.removesuffix('Settings').lower()}", cls)]:
        names = [n for n in part.model_fields if n not in seen and n in cls.model_fields]
        seen.update(names)
        if names:
            sections.append((title, names))
    return sections


def add_settings_arguments(parser: argparse.ArgumentParser, cls: type[CommonSettings]) -> None:
    """One ``--flag`` per settings field, in sections; the env variable is named in its help."""
    for title, names in setting_sections(cls):
        group = parser.add_argument_group(f"settings: {title} (flag or environment variable)")
        for name in names:
            field = cls.model_fields[name]
            default = field.get_default(call_default_factory=False)
            shown = "(secret)" if name == "auth_token" else default
            help_text = f"{field.description} [env {ENV_PREFIX}{name.upper()}; default {shown}]"
            group.add_argument(_flag(name), dest=f"setting__{name}", default=None, metavar="VALUE", help=help_text)


def _json_valued(cls: type[CommonSettings], name: str) -> bool:
    """Fields given as JSON on the command line, as in the environment (lists and dicts)."""
    return typing.get_origin(cls.model_fields[name].annotation) in (list, dict)


def load_settings(cls: type[S], args: argparse.Namespace | None = None, **overrides: Any) -> S:
    """Build settings from env, then CLI flags, then keyword overrides; explain any bad value."""
    values: dict[str, Any] = {}
    if args is not None:
        for key, val in vars(args).items():
            if key.startswith("setting__") and val is not None:
                name = key.removeprefix("setting__")
                if _json_valued(cls, name):
                    try:
                        val = json.loads(val)
                    except ValueError:
                        raise SettingsError(f"{_flag(name)}: not valid JSON ({val!r})") from None
                values[name] = val
    values.update({k: v for k, v in overrides.items() if v is not None})
    try:
        settings = cls(**values)
    except SourceError as err:  # a JSON-valued variable (e.g. TBA_TASK_OPTIONS) that does not parse
        name = next((n for n in cls.model_fields if f'"{n}"' in str(err)), "")
        where = _names(name) if name else "environment"
        raise SettingsError(f"invalid configuration:\n  {where}: not valid JSON ({err.__cause__})") from None
    except ValidationError as err:
        lines = []
        for e in err.errors():
            name = str(e["loc"][0]) if e["loc"] else ""
            where = _names(name) if name else "settings"
            lines.append(f"{where}: {e['msg']} (got {e.get('input')!r})")
        raise SettingsError("invalid configuration:\n  " + "\n  ".join(lines)) from None
    return settings


def known_variables() -> set[str]:
    """Every TBA_ variable some service reads (a profile or a check of names takes no other)."""
    classes: list[type[CommonSettings]] = [BufferSettings, TrainerSettings, SearcherSettings]
    return {f"{ENV_PREFIX}{name.upper()}" for cls in classes for name in cls.model_fields}
