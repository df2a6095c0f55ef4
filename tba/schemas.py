"""Wire schemas shared by every service: the one place a field is declared.

A searcher publishes :class:`ScoredGroup` to the trajectory stream; the buffer
stores it and serves :class:`SampledBatch` in answer to :class:`SampleRequest`;
the trainer announces :class:`CheckpointManifest`. Every model rejects what the
loss could not survive (NaN rewards, empty groups, token ids outside the
vocabulary, per-token arrays of the wrong length) with an error naming the field.

Token ids are checked against the vocabulary when the caller passes it as
validation context: ``ScoredGroup.model_validate(obj, context={"vocab_size": V})``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    JsonValue,
    ValidationInfo,
    field_validator,
    model_validator,
)

SCHEMA_VERSION = 1
SUPPORTED_SCHEMA_VERSIONS = frozenset({1})
_VERSION_ENUM: list[JsonValue] = [*sorted(SUPPORTED_SCHEMA_VERSIONS)]  # the JSON schema's statement of them


# Bounds of the numbers on the wire: every value, and every sum the buffer and the loss form of them
# (a buffer's reward sum over 2**32 samples, a batch's squared TB residuals), stays finite in a double
# and in float32. Task rewards are O(1); a summed log-prob of a long completion at a low temperature can
# reach ~-1e7; token ids are int32 in every tokenizer and embedding table.
MAX_ABS_REWARD = 1e6
MAX_ABS_LOGPROB = 1e9
MAX_TOKEN_ID = 2**31 - 1


Reward = Annotated[float, Field(ge=-MAX_ABS_REWARD, le=MAX_ABS_REWARD, allow_inf_nan=False)]
LogProb = Annotated[float, Field(ge=-MAX_ABS_LOGPROB, le=MAX_ABS_LOGPROB, allow_inf_nan=False)]
FinishReason = Literal["stop", "length", "abort"]
# The objective a run trains: a sample's log-probs are under logits/T of its policy and of the reference model,
# so samples drawn at another temperature, or scored against another reference, silently change the loss.
Temperature = Annotated[float, Field(gt=0.0, le=10.0, allow_inf_nan=False)]
Identity = Annotated[str, Field(min_length=1, max_length=64)]


def _check_vocabulary(ids: list[int], info: ValidationInfo) -> list[int]:
    vocab_size = (info.context or {}).get("vocab_size")
    if vocab_size is not None:
        for i, tok in enumerate(ids):
            if tok >= vocab_size:
                raise ValueError(f"token id at position {i} is {tok}, beyond the vocabulary size {vocab_size}")
    return ids


def _integral(value: object) -> object:
    """JSON's 3.0 is the integer 3 (JSON Schema says so, and so do JSON encoders); a boolean or a string is
    no number, and strict validation refuses them."""
    if type(value) is float and value.is_integer():
        return int(value)
    return value


def _integral_items(values: object) -> object:
    if isinstance(values, list) and any(type(v) is float for v in values):
        return [_integral(v) for v in values]
    return values


_INTEGRAL = BeforeValidator(_integral)
Int = Annotated[int, _INTEGRAL]
TokenId = Annotated[int, Field(ge=0, le=MAX_TOKEN_ID)]
TokenIds = Annotated[list[TokenId], BeforeValidator(_integral_items), AfterValidator(_check_vocabulary)]


class SearcherState(StrEnum):
    """What a searcher says it is doing (``/status`` and ``/readyz``): one enumeration for the searcher that
    sets it, its readiness and the console that shows it."""

    LOADING = "loading"  # the engine is starting: the status server answers before the searcher exists
    STARTING = "starting"
    RUNNING = "running"
    RELOADING = "reloading"
    PAUSED_SPILL_FULL = "paused: spill queue full"
    PAUSED_FOR_POLICY = "paused: waiting for a newer policy"
    PAUSED_FOR_TRAINER = "paused: a batch waits for the trainer"
    STOPPING = "stopping"
    STOPPED = "stopped"

    @property
    def serving(self) -> bool:
        """The engine is loaded and the searcher generates, or is about to: it is ready."""
        return self in (SearcherState.RUNNING, SearcherState.RELOADING) or self.paused

    @property
    def paused(self) -> bool:
        return self in (
            SearcherState.PAUSED_SPILL_FULL,
            SearcherState.PAUSED_FOR_POLICY,
            SearcherState.PAUSED_FOR_TRAINER,
        )


class _Strict(BaseModel):
    """Unknown fields are errors and nothing is coerced (``false`` is no seed, ``"3"`` no count): a typo
    on the wire must not pass silently. Integers are still accepted where a float is declared."""

    model_config = ConfigDict(extra="forbid", frozen=False, strict=True)


class _Versioned(_Strict):
    schema_version: Int = Field(
        SCHEMA_VERSION, description="Wire schema version of this message.", json_schema_extra={"enum": _VERSION_ENUM}
    )

    @field_validator("schema_version")
    @classmethod
    def _known_version(cls, v: int) -> int:
        if v not in SUPPORTED_SCHEMA_VERSIONS:
            raise ValueError(f"unknown schema version {v}; this build reads {sorted(SUPPORTED_SCHEMA_VERSIONS)}")
        return v


# [start, end) token ranges of a completion; a trajectory of T turns has at most T - 1 of them.
EnvSpans = Annotated[list[Annotated[list[Int], Field(min_length=2, max_length=2)]], Field(max_length=1024)]


def check_env_spans(spans: list[list[int]] | None, length: int) -> None:
    """Raise ValueError unless ``spans`` are sorted, disjoint, non-empty ranges within ``length`` tokens that
    leave at least one token to the model."""
    if not spans:
        return
    end = 0
    for start, stop in spans:
        if not end <= start < stop <= length:
            raise ValueError(
                f"env_spans must be sorted, disjoint, non-empty [start, end) ranges within the completion's "
                f"{length} tokens; got {spans}"
            )
        end = stop
    if sum(stop - start for start, stop in spans) >= length:
        raise ValueError("env_spans cover the whole completion: a trajectory needs at least one model token")


def model_token_flags(length: int, env_spans: list[list[int]] | None) -> list[bool] | None:
    """Per token of a completion, whether the model generated it (the environment's spans are False);
    None when every token is the model's."""
    if not env_spans:
        return None
    flags = [True] * length
    for start, stop in env_spans:
        flags[start:stop] = [False] * (stop - start)
    return flags


def scored_flags(lengths: Sequence[int], env_spans: Sequence[list[list[int]] | None]) -> list[list[bool]] | None:
    """Per completion, whether each of its tokens is the model's (what the log-prob sums cover); None when no
    completion holds an environment span."""
    if not any(env_spans):
        return None
    return [model_token_flags(n, spans) or [True] * n for n, spans in zip(lengths, env_spans, strict=True)]


class ScoredSample(_Strict):
    """One completion of a prompt, scored by the task and the reference model."""

    completion_ids: TokenIds = Field(min_length=1, description="Completion token ids (EOS included if emitted).")
    completion_text: str = Field("", description="Decoded completion, for humans and rewards.")
    reward: Reward = Field(description=f"Task reward r(x, y), within ±{MAX_ABS_REWARD:g}.")
    logprob_sum: LogProb = Field(description="Behaviour policy log-prob sum, tempered logits.")
    ref_logprob_sum: LogProb | None = Field(
        description="Reference model log-prob sum, tempered logits; null where the trainer computes it "
        "(TBA_REF_PASS=trainer)."
    )
    finish_reason: FinishReason = Field("stop", description="Why generation ended.")
    token_logprobs: list[LogProb] | None = Field(None, description="Per-token behaviour log-probs, if asked.")
    env_spans: EnvSpans | None = Field(
        None,
        description="Multi-turn: the [start, end) ranges of completion_ids the environment wrote between the "
        "model's turns (tool results, observations): context, never scored. Sorted, disjoint, within the "
        "completion, leaving at least one model token.",
    )

    @model_validator(mode="after")
    def _lengths_match(self) -> ScoredSample:
        if self.token_logprobs is not None and len(self.token_logprobs) != len(self.completion_ids):
            raise ValueError(
                f"token_logprobs has {len(self.token_logprobs)} entries "
                f"but completion_ids has {len(self.completion_ids)}"
            )
        check_env_spans(self.env_spans, len(self.completion_ids))
        return self


# The largest policy version on the wire: the buffer keeps (version, arrival) in one sorted-set score that a
# double must hold exactly (services/buffer/redis_scripts.py), which leaves versions below 2**21 (two million steps).
MAX_VERSION = 2**21 - 1
# A batch is at most 512 x 128 = 65,536 samples: an answer the buffer builds in memory and sends whole.
MAX_PROMPTS_PER_BATCH, MAX_SAMPLES_PER_PROMPT = 512, 128
INT64 = 2**63  # seeds: what msgpack and numpy carry
MAX_COUNTER = 2**53  # counters compared on the wire: exact in a double (Lua, JSON) as in an int64
MAX_SAMPLE_WAIT_SECONDS = 60.0  # a long-poll shorter than any sane HTTP timeout


class ScoredGroup(_Versioned):
    """All completions one searcher drew for one prompt with one policy version."""

    group_id: str = Field(
        default_factory=lambda: uuid.uuid4().hex,
        min_length=1,
        max_length=128,
        description="Unique id: a resent group is stored once.",
    )
    prompt_id: str = Field(min_length=1, max_length=256, description="Stable id of the prompt within its task.")
    prompt_text: str = Field(description="Prompt as text.")
    prompt_ids: TokenIds = Field(min_length=1, description="Prompt token ids, exactly as the policy saw them.")
    task: str = Field(min_length=1, max_length=256, description="Task name the prompt and reward come from.")
    policy_version: Int = Field(
        ge=0, le=MAX_VERSION, description="Trainer version of the weights that generated the samples."
    )
    searcher_id: str = Field(min_length=1, max_length=256, description="Searcher replica that produced the group.")
    created_at: float = Field(
        default_factory=time.time, ge=0, allow_inf_nan=False, description="Unix time of creation."
    )
    temperature: Temperature = Field(description="Sampling temperature T of the completions and their log-probs.")
    reference: Identity = Field(description="Identity of the reference model (tba.checkpoints.model_identity).")
    samples: list[ScoredSample] = Field(min_length=1, description="The scored completions (at least one).")


class SampleRequest(_Strict):
    """Body of ``POST /v1/sample``: how many prompts and samples, and the rule's knobs."""

    num_prompts: Int = Field(ge=1, le=MAX_PROMPTS_PER_BATCH, description="P: prompts in the batch.")
    samples_per_prompt: Int = Field(ge=1, le=MAX_SAMPLES_PER_PROMPT, description="K: samples per prompt.")
    recency_prob: float = Field(0.5, ge=0.0, le=1.0, description="m: probability of the recency branch per slot.")
    reward_inv_temp: float = Field(0.0, ge=0.0, le=1e6, description="Inverse temperature of the reward softmax.")
    recency_draw: Literal["distinct", "as_generated"] = Field(
        "distinct",
        description="How the recency branch draws a prompt's K samples: uniformly among its distinct "
        "completions, or as generated (a completion generated c times counts c times).",
    )
    trainer_version: Int = Field(ge=0, le=MAX_VERSION, description="The caller's policy version, to compute staleness.")
    recent_versions: Int = Field(
        1, ge=1, le=MAX_VERSION, description="Versions counted as 'since the last sync' (recency)."
    )
    max_staleness: Annotated[int, Field(ge=0, le=MAX_VERSION), _INTEGRAL] | None = Field(
        None, description="Drop samples older than this many versions."
    )
    only_version: Annotated[int, Field(ge=0, le=MAX_VERSION), _INTEGRAL] | None = Field(
        None,
        description="Serve only samples of this exact version, drawn as generated "
        "(duplicates with their multiplicity): sync mode's on-policy draw.",
    )
    min_samples_generated: Annotated[int, Field(ge=0, le=MAX_COUNTER), _INTEGRAL] | None = Field(
        None,
        description="Serve only once the buffer has taken in at least this many generated samples "
        "(duplicates included): the trainer's bound on samples consumed per sample generated.",
    )
    after_arrival: Annotated[int, Field(ge=0, le=MAX_COUNTER), _INTEGRAL] | None = Field(
        None,
        description="The recency branch takes, in arrival order, the prompts whose newest group arrived after "
        "this arrival number (the previous answer's arrival_cursor; 0 from the start), each arrival once; "
        "unset: it draws uniformly among the newest versions' prompts.",
    )
    wait_seconds: float = Field(
        0.0,
        ge=0.0,
        le=MAX_SAMPLE_WAIT_SECONDS,
        allow_inf_nan=False,
        description="Long-poll: hold the request up to this long while the batch cannot be served yet, "
        "answering as soon as the samples it needs arrive (0: answer 409 at once).",
    )
    seed: Annotated[int, Field(ge=-INT64, lt=INT64), _INTEGRAL] | None = Field(
        None, description="Seed for a reproducible draw (tests)."
    )
    temperature: Temperature | None = Field(
        None, description="The caller's temperature T: the buffer refuses (409) to serve a run of another objective."
    )
    reference: Identity | None = Field(
        None, description="The caller's reference model identity (checked like the temperature)."
    )


class SampledSample(_Strict):
    completion_ids: list[int]
    reward: float
    logprob_sum: float
    ref_logprob_sum: float | None  # None: the trainer computes it (TBA_REF_PASS=trainer)
    version: int = Field(description="Policy version that generated the sample.")
    staleness: int = Field(description="trainer_version - version.")
    finish_reason: FinishReason = "stop"
    env_spans: list[list[int]] | None = Field(None, description="The environment's token ranges (multi-turn).")
    searcher_id: str | None = Field(
        None, description="The searcher whose copy of the sample was stored (None: a record older than the field)."
    )


class SampledGroup(_Strict):
    prompt_id: str
    prompt_ids: list[int]
    prompt_text: str = ""
    task: str = ""
    branch: Literal["recency", "reward", "on_policy"]  # on_policy: an only_version draw, as generated
    samples: list[SampledSample]


class SampledBatch(_Versioned):
    """Answer of ``POST /v1/sample``: P groups of exactly K samples each."""

    trainer_version: int
    groups: list[SampledGroup]
    samples_generated: int | None = Field(
        None, description="Generated samples the buffer had taken in when it drew the batch (duplicates included)."
    )
    arrival_cursor: int | None = Field(
        None, description="The last arrival the recency branch looked at: the next request's after_arrival."
    )


class CheckpointManifest(_Versioned):
    """What the trainer announces; readers trust a checkpoint only through it."""

    version: Int = Field(ge=0, le=MAX_VERSION, description="Policy version the weights carry (trainer step).")
    step: Int = Field(ge=0, le=MAX_VERSION, description="Optimizer step at which the checkpoint was taken.")
    path: str = Field(min_length=1, description="Checkpoint directory, relative to the checkpoint root.")
    content_hash: str = Field(min_length=64, max_length=64, description="sha256 over the directory's files.")
    created_at: float = Field(default_factory=time.time)
