"""Wire schemas: every bad field is rejected with an error that names it."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from tba.schemas import (
    SCHEMA_VERSION,
    CheckpointManifest,
    SampledBatch,
    SampleRequest,
    ScoredGroup,
    ScoredSample,
    model_token_flags,
)


def sample(**kw) -> dict:
    base = {
        "completion_ids": [5, 6, 2],
        "completion_text": "82",
        "reward": 1.0,
        "logprob_sum": -1.5,
        "ref_logprob_sum": -2.0,
    }
    return {**base, **kw}


def group(**kw) -> dict:
    base = {
        "prompt_id": "37+45=",
        "prompt_text": "37+45=",
        "prompt_ids": [1, 7, 11],
        "task": "arithmetic",
        "policy_version": 3,
        "searcher_id": "s0",
        "samples": [sample()],
        "temperature": 0.7,
        "reference": "r",
    }
    return {**base, **kw}


def error_text(excinfo: pytest.ExceptionInfo) -> str:
    return "; ".join(".".join(map(str, e["loc"])) + ": " + e["msg"] for e in excinfo.value.errors())


def test_valid_group_gets_defaults() -> None:
    g = ScoredGroup.model_validate(group())
    assert g.schema_version == SCHEMA_VERSION
    assert len(g.group_id) == 32 and g.created_at > 0
    assert g.samples[0].finish_reason == "stop"


@pytest.mark.parametrize("field", ["reward", "logprob_sum", "ref_logprob_sum"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_numbers_name_the_field(field: str, bad: float) -> None:
    with pytest.raises(ValidationError) as exc:
        ScoredGroup.model_validate(group(samples=[sample(), sample(**{field: bad})]))
    text = error_text(exc)
    assert f"samples.1.{field}" in text and "finite" in text


def test_a_sample_without_a_reference_log_prob_is_explicit() -> None:
    """TBA_REF_PASS=trainer: null is a valid ref_logprob_sum (the trainer computes it); leaving it out is not."""
    assert ScoredGroup.model_validate(group(samples=[sample(ref_logprob_sum=None)])).samples[0].ref_logprob_sum is None
    missing = sample()
    del missing["ref_logprob_sum"]
    with pytest.raises(ValidationError) as exc:
        ScoredGroup.model_validate(group(samples=[missing]))
    assert "samples.0.ref_logprob_sum" in error_text(exc)


def test_non_finite_token_logprob_names_its_position() -> None:
    with pytest.raises(ValidationError) as exc:
        ScoredSample.model_validate(sample(token_logprobs=[-0.1, math.nan, -0.2]))
    assert "token_logprobs.1" in error_text(exc)


def test_empty_group_and_empty_completion_rejected() -> None:
    with pytest.raises(ValidationError) as exc:
        ScoredGroup.model_validate(group(samples=[]))
    assert "samples" in error_text(exc)
    with pytest.raises(ValidationError) as exc:
        ScoredGroup.model_validate(group(samples=[sample(completion_ids=[])]))
    assert "samples.0.completion_ids" in error_text(exc)


def test_negative_token_id_rejected() -> None:
    with pytest.raises(ValidationError) as exc:
        ScoredGroup.model_validate(group(prompt_ids=[1, -4]))
    text = error_text(exc)
    assert "prompt_ids.1: Input should be greater than or equal to 0" in text


def test_token_ids_checked_against_vocab_only_when_given() -> None:
    obj = group(samples=[sample(completion_ids=[5, 92])])
    ScoredGroup.model_validate(obj)  # no vocabulary given: only the sign is checked
    with pytest.raises(ValidationError) as exc:
        ScoredGroup.model_validate(obj, context={"vocab_size": 92})
    text = error_text(exc)
    assert "samples.0.completion_ids" in text and "92" in text
    ScoredGroup.model_validate(obj, context={"vocab_size": 93})


def test_token_logprobs_length_must_match() -> None:
    with pytest.raises(ValidationError) as exc:
        ScoredSample.model_validate(sample(token_logprobs=[-0.1, -0.2]))
    assert "token_logprobs has 2 entries but completion_ids has 3" in error_text(exc)
    ScoredSample.model_validate(sample(token_logprobs=[-0.1, -0.2, -0.3]))


@pytest.mark.parametrize(
    "model,obj",
    [
        (ScoredGroup, group(schema_version=99)),
        (SampledBatch, {"schema_version": 2, "trainer_version": 0, "groups": []}),
        (
            CheckpointManifest,
            {"schema_version": 0, "version": 1, "step": 1, "path": "step-000001", "content_hash": "a" * 64},
        ),
    ],
)
def test_unknown_schema_version(model, obj) -> None:
    with pytest.raises(ValidationError) as exc:
        model.model_validate(obj)
    text = error_text(exc)
    assert "schema_version" in text and "unknown schema version" in text


def test_unknown_fields_and_bad_enums_rejected() -> None:
    with pytest.raises(ValidationError) as exc:
        ScoredGroup.model_validate(group(rewards=[1.0]))
    assert "rewards" in error_text(exc)
    with pytest.raises(ValidationError) as exc:
        ScoredSample.model_validate(sample(finish_reason="eos"))
    assert "finish_reason" in error_text(exc)
    with pytest.raises(ValidationError) as exc:
        ScoredGroup.model_validate(group(policy_version=-1))
    assert "policy_version" in error_text(exc)


def test_sample_request_bounds() -> None:
    SampleRequest(num_prompts=8, samples_per_prompt=8, trainer_version=0)
    for bad, field in [
        ({"num_prompts": 0}, "num_prompts"),
        ({"recency_prob": 1.5}, "recency_prob"),
        ({"samples_per_prompt": 10_000}, "samples_per_prompt"),
    ]:
        with pytest.raises(ValidationError) as exc:
            SampleRequest(**{"num_prompts": 8, "samples_per_prompt": 8, "trainer_version": 0, **bad})
        assert field in error_text(exc)


def test_manifest_hash_length() -> None:
    with pytest.raises(ValidationError) as exc:
        CheckpointManifest(version=1, step=1, path="step-000001", content_hash="abc")
    assert "content_hash" in error_text(exc)


@pytest.mark.parametrize(
    "spans",
    [[[2, 1]], [[0, 2], [1, 3]], [[3, 5]], [[1, 2], [0, 1]], [[0, 4]], [[1]], [[1, 2.5]]],
    ids=["reversed", "overlapping", "beyond the end", "unsorted", "whole completion", "one bound", "fractional"],
)
def test_env_spans_that_do_not_describe_the_completion_are_refused(spans) -> None:
    with pytest.raises(ValidationError, match="env_spans"):
        ScoredSample.model_validate(sample(completion_ids=[5, 6, 7, 2], env_spans=spans))


def test_env_spans_mark_the_environments_tokens() -> None:
    s = ScoredSample.model_validate(sample(completion_ids=[5, 6, 7, 8, 2], env_spans=[[1, 3], [4, 5]]))
    assert model_token_flags(5, s.env_spans) == [True, False, False, True, False]
    assert model_token_flags(5, None) is None and model_token_flags(5, []) is None
