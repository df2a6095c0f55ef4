"""msgpack/JSON codec: lossless round trips (property-based) and clear rejection of bad payloads."""

from __future__ import annotations

import json

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tba.codec import PayloadError, decode, encode, pack
from tba.schemas import (
    MAX_ABS_LOGPROB,
    MAX_ABS_REWARD,
    MAX_VERSION,
    SampledBatch,
    SampledGroup,
    SampledSample,
    ScoredGroup,
    ScoredSample,
)

finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
ids = st.lists(st.integers(min_value=0, max_value=10_000), min_size=1, max_size=24)
text = st.text(max_size=40)
rewards = st.floats(-MAX_ABS_REWARD, MAX_ABS_REWARD)
logprobs = st.floats(-MAX_ABS_LOGPROB, MAX_ABS_LOGPROB)


@st.composite
def scored_samples(draw) -> ScoredSample:
    completion = draw(ids)
    per_token = draw(st.one_of(st.none(), st.lists(logprobs, min_size=len(completion), max_size=len(completion))))
    return ScoredSample(
        completion_ids=completion,
        completion_text=draw(text),
        reward=draw(rewards),
        logprob_sum=draw(logprobs),
        ref_logprob_sum=draw(st.one_of(st.none(), logprobs)),  # None: the trainer computes it
        finish_reason=draw(st.sampled_from(["stop", "length", "abort"])),
        token_logprobs=per_token,
    )


scored_groups = st.builds(
    ScoredGroup,
    prompt_id=st.text(min_size=1, max_size=30),
    prompt_text=text,
    prompt_ids=ids,
    task=st.text(min_size=1, max_size=12),
    policy_version=st.integers(0, MAX_VERSION),
    searcher_id=st.text(min_size=1, max_size=12),
    created_at=st.floats(0, 1e12),
    temperature=st.floats(0.01, 10),
    reference=st.text(min_size=1, max_size=16),
    samples=st.lists(scored_samples(), min_size=1, max_size=5),
)

sampled_samples = st.builds(
    SampledSample,
    completion_ids=st.lists(st.integers(0, 10_000), max_size=10),
    reward=finite,
    logprob_sum=finite,
    ref_logprob_sum=st.one_of(st.none(), finite),
    version=st.integers(0, 2**40),
    staleness=st.integers(-5, 2**20),
    finish_reason=st.sampled_from(["stop", "length", "abort"]),
)
sampled_batches = st.builds(
    SampledBatch,
    trainer_version=st.integers(0, 2**40),
    groups=st.lists(
        st.builds(
            SampledGroup,
            prompt_id=text,
            prompt_ids=st.lists(st.integers(0, 500), max_size=8),
            prompt_text=text,
            task=text,
            branch=st.sampled_from(["recency", "reward"]),
            samples=st.lists(sampled_samples, max_size=4),
        ),
        max_size=4,
    ),
)

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(scored_groups, st.sampled_from(["msgpack", "json"]))
def test_scored_group_round_trip(group: ScoredGroup, fmt: str) -> None:
    assert decode(encode(group, fmt), ScoredGroup, fmt) == group


@FAST
@given(sampled_batches, st.sampled_from(["msgpack", "json"]))
def test_sampled_batch_round_trip(batch: SampledBatch, fmt: str) -> None:
    assert decode(encode(batch, fmt), SampledBatch, fmt) == batch


def valid_group() -> ScoredGroup:
    return ScoredGroup(
        prompt_id="p",
        prompt_text="1+1=",
        prompt_ids=[1, 5],
        task="arithmetic",
        policy_version=0,
        searcher_id="s",
        samples=[ScoredSample(completion_ids=[6, 2], reward=1.0, logprob_sum=-1.0, ref_logprob_sum=-1.0)],
        temperature=1.0,
        reference="r",
    )


def test_oversize_payload_rejected_before_parsing() -> None:
    group = valid_group()
    data = encode(group)
    assert decode(data, ScoredGroup, max_bytes=len(data)) == group
    with pytest.raises(PayloadError, match=f"payload is {len(data)} bytes, over the limit of {len(data) - 1}"):
        decode(data, ScoredGroup, max_bytes=len(data) - 1)


def test_vocab_size_checked_on_decode() -> None:
    data = encode(valid_group())
    with pytest.raises(PayloadError, match=r"samples\.0\.completion_ids: .*beyond the vocabulary size 6"):
        decode(data, ScoredGroup, vocab_size=6)
    decode(data, ScoredGroup, vocab_size=7)


@pytest.mark.parametrize(
    "data,fmt,reason",
    [
        (b"\xc1\xc1garbage", "msgpack", "not valid msgpack"),
        (b"{not json", "json", "not valid json"),
        (pack([1, 2, 3]), "msgpack", "expected a msgpack map"),
        (b"", "msgpack", "not valid msgpack"),
    ],
)
def test_malformed_payloads(data: bytes, fmt: str, reason: str) -> None:
    with pytest.raises(PayloadError, match=reason):
        decode(data, ScoredGroup, fmt)


def test_validation_error_names_the_field_path() -> None:
    obj = valid_group().model_dump()
    obj["samples"][0]["reward"] = float("nan")
    with pytest.raises(PayloadError, match=r"samples\.0\.reward: .*finite"):
        decode(msgpack.packb(obj), ScoredGroup)
    obj["samples"][0]["reward"] = 1.0
    obj["schema_version"] = 7
    with pytest.raises(PayloadError, match=r"schema_version: .*unknown schema version 7"):
        decode(json.dumps(obj).encode(), ScoredGroup, "json")


def test_nan_in_json_rejected() -> None:
    # Python's json accepts the NaN literal; the schema must still refuse it.
    body = encode(valid_group(), "json").replace(b'"reward":1.0', b'"reward":NaN')
    with pytest.raises(PayloadError, match=r"samples\.0\.reward"):
        decode(body, ScoredGroup, "json")
