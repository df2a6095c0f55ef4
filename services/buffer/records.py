"""What Redis holds of a prompt and its samples, in Python: the record a write stores, the view of a
prompt that ``read_prompt.lua`` returns, and the served group (:class:`tba.schemas.SampledGroup`, in
its wire form) made of the two, by :func:`served_group` alone.

A sample is stored in four places of its prompt (docs/architecture.md §3): its order score (version
and arrival), its reward and its copies, which the sampler reads to choose, and its *record*, the
rest of what a served sample carries, fetched only for the samples chosen. The record is a msgpack
list, not a map, to keep the memory per stored sample small: :data:`RECORD_FIELDS` names its positions.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from tba.codec import pack, unpack
from tba.schemas import SCHEMA_VERSION, SampledBatch, SampledGroup, SampledSample, ScoredSample

RECORD_FIELDS = ("completion_ids", "logprob_sum", "ref_logprob_sum", "finish_reason", "env_spans")
# A served sample is its record plus what the prompt's view holds of it.
SERVED_FIELDS = (*RECORD_FIELDS, "reward", "version", "staleness")
GROUP_FIELDS = ("prompt_id", "prompt_ids", "prompt_text", "task", "branch", "samples")
BATCH_FIELDS = ("schema_version", "trainer_version", "groups", "samples_generated", "arrival_cursor")


def sample_id(completion_ids: list[int], env_spans: list[list[int]] | None = None) -> str:
    """Digest of the token sequence (and of which of its tokens the environment wrote, in a multi-turn
    trajectory): exact-duplicate completions share an id (dedup by key)."""
    return hashlib.blake2b(
        pack([completion_ids, env_spans] if env_spans else completion_ids), digest_size=8
    ).hexdigest()


def encode_record(sample: ScoredSample) -> bytes:
    """The stored record of a sample: its :data:`RECORD_FIELDS`, in that order."""
    return pack([getattr(sample, name) for name in RECORD_FIELDS])


@dataclass(frozen=True)
class PromptView:
    """One prompt as read atomically: its record, then per sample its id, version, reward and copies
    (how many times it was generated at its stored version)."""

    prompt_id: str
    prompt_ids: list[int]
    prompt_text: str
    task: str
    sample_ids: list[bytes]
    versions: list[int]
    rewards: list[float]
    copies: list[int]


def prompt_view(prompt_id: str, answer: list[Any]) -> PromptView:
    """The answer of ``read_prompt.lua``; a prompt emptied since it was picked reads as having no samples."""
    if not answer:
        return PromptView(prompt_id, [], "", "", [], [], [], [])
    ids, text, task, *samples = answer
    return PromptView(
        prompt_id=prompt_id,
        prompt_ids=unpack(ids),
        prompt_text=(text or b"").decode(),
        task=(task or b"").decode(),
        sample_ids=samples[0::4],
        versions=[int(v) for v in samples[1::4]],
        rewards=[float(r) for r in samples[2::4]],
        copies=[int(c) for c in samples[3::4]],
    )


def served_group(
    view: PromptView, branch: str, picks: list[int], records: list[bytes], trainer_version: int
) -> dict[str, Any]:
    """The group served for ``view``, as the wire carries a :class:`SampledGroup`: the samples at indices
    ``picks`` of the view, whose records are ``records`` (in the same order).

    Its fields are the schema's (checked when this module loads, :func:`_check_against_schema`), and what
    they hold was validated when it was written; the trainer validates every batch it receives against the
    strict schema. Validating here too would cost a fifth of the sampler's throughput for nothing new."""
    samples = []
    for i, record in zip(picks, records, strict=True):
        sample = dict(zip(RECORD_FIELDS, unpack(record), strict=False))
        sample.update(reward=view.rewards[i], version=view.versions[i], staleness=trainer_version - view.versions[i])
        samples.append(sample)
    return {
        "prompt_id": view.prompt_id,
        "prompt_ids": view.prompt_ids,
        "prompt_text": view.prompt_text,
        "task": view.task,
        "branch": branch,
        "samples": samples,
    }


def served_batch(
    trainer_version: int, groups: list[dict[str, Any]], samples_generated: int, arrival_cursor: int | None
) -> dict[str, Any]:
    """A :class:`SampledBatch` in its wire form, around groups from :func:`served_group`."""
    return {
        "schema_version": SCHEMA_VERSION,
        "trainer_version": trainer_version,
        "groups": groups,
        "samples_generated": samples_generated,
        "arrival_cursor": arrival_cursor,
    }


def _check_against_schema() -> None:
    """The served forms name exactly the schema's fields: a field added to, renamed in or removed from
    the schema stops the buffer at import instead of serving batches the trainer refuses."""
    for model, fields in ((SampledSample, SERVED_FIELDS), (SampledGroup, GROUP_FIELDS), (SampledBatch, BATCH_FIELDS)):
        if set(model.model_fields) != set(fields):
            raise RuntimeError(
                f"services/buffer/records.py serves {model.__name__} as {sorted(fields)}, but the "
                f"schema's fields are {sorted(model.model_fields)}"
            )


_check_against_schema()
