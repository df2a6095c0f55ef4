"""What Redis holds of a prompt and its samples, in Python: the record a write stores, the view of a
prompt that ``read_prompt.lua`` returns, and the served group (:class:`tba.schemas.SampledGroup`)
made of the two, by :func:`served_group` alone.

A sample is stored in four places of its prompt (docs/architecture.md §3): its order score (version
and arrival), its reward and its copies, which the sampler reads to choose, and its *record*, the
rest of what a served sample carries, fetched only for the samples chosen. The record is a msgpack
list, not a map, to keep the memory per stored sample small: :data:`RECORD_FIELDS` names its positions.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import msgpack

from tba.codec import pack
from tba.schemas import SampledGroup, ScoredSample

RECORD_FIELDS = ("completion_ids", "logprob_sum", "ref_logprob_sum", "finish_reason")


def sample_id(completion_ids: list[int]) -> str:
    """Digest of the token sequence: exact-duplicate completions share an id (dedup by key)."""
    return hashlib.blake2b(pack(completion_ids), digest_size=8).hexdigest()


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
        prompt_id=prompt_id, prompt_ids=msgpack.unpackb(ids), prompt_text=(text or b"").decode(),
        task=(task or b"").decode(), sample_ids=samples[0::4], versions=[int(v) for v in samples[1::4]],
        rewards=[float(r) for r in samples[2::4]], copies=[int(c) for c in samples[3::4]])


def served_group(view: PromptView, branch: str, picks: list[int], records: list[bytes],
                 trainer_version: int) -> SampledGroup:
    """The group served for ``view``: the samples at indices ``picks`` of the view, whose records are
    ``records`` (in the same order), validated against the schema."""
    samples = []
    for i, record in zip(picks, records, strict=True):
        sample = dict(zip(RECORD_FIELDS, msgpack.unpackb(record, raw=False), strict=True))
        sample.update(reward=view.rewards[i], version=view.versions[i], staleness=trainer_version - view.versions[i])
        samples.append(sample)
    return SampledGroup.model_validate({"prompt_id": view.prompt_id, "prompt_ids": view.prompt_ids,
                                        "prompt_text": view.prompt_text, "task": view.task, "branch": branch,
                                        "samples": samples})
