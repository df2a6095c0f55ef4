"""Pure parts of the buffer: the sampling rule's helpers, auth, rates, ids."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.buffer.app import _safe_url
from services.buffer.auth import BearerAuth
from services.buffer.errors import ApiError
from services.buffer.metrics import RateTracker
from services.buffer.sampler import RECENCY, REWARD, choose_samples, draw_branches, softmax, thresholds
from services.buffer.store import decode_record, encode_record, sample_id
from tba.schemas import SampleRequest
from tests.unit.buffer_factories import make_sample


@given(st.lists(st.floats(-50, 50), min_size=1, max_size=30), st.floats(0, 100))
def test_softmax_is_a_distribution_even_for_large_inverse_temperatures(rewards, inv_temp) -> None:
    p = softmax(rewards, inv_temp)
    assert math.isclose(sum(p), 1.0, rel_tol=1e-9) and all(0 <= x <= 1 for x in p)
    best = max(range(len(rewards)), key=lambda i: rewards[i])
    assert p[best] == max(p)


@given(n=st.integers(1, 12), k=st.integers(1, 12), branch=st.sampled_from([RECENCY, REWARD]),
       inv_temp=st.sampled_from([0.0, 2.0]), seed=st.integers(0, 1000))
def test_choose_samples_draws_k_from_candidates_without_replacement_when_possible(n, k, branch, inv_temp,
                                                                                   seed) -> None:
    candidates = list(range(3, 3 + n))  # indices into a longer list: only candidates may be drawn
    rewards = [float(i % 4) for i in range(3 + n)]
    got = choose_samples(random.Random(seed), candidates, rewards, k, branch, inv_temp)
    assert len(got) == k and set(got) <= set(candidates)
    if n >= k:
        assert len(set(got)) == k


def test_zero_weight_candidates_are_drawn_last() -> None:
    rng = random.Random(0)
    got = choose_samples(rng, [0, 1, 2], [0.0, 0.0, 10_000.0], 1, REWARD, 1.0)
    assert got == [2]


def test_thresholds_combine_recency_and_staleness() -> None:
    req = SampleRequest(num_prompts=1, samples_per_prompt=1, trainer_version=10, recent_versions=2, max_staleness=3)
    th = thresholds(req, newest=9)
    assert (th.recency_low, th.reward_low) == (8, 7)
    assert th.eligible([6, 7, 8, 9], RECENCY) == [2, 3] and th.eligible([6, 7, 8, 9], REWARD) == [1, 2, 3]
    stale = thresholds(req.model_copy(update={"trainer_version": 20}), newest=9)
    assert stale.recency_low == 17  # staleness wins over recency
    exact = thresholds(req.model_copy(update={"only_version": 7}), newest=9)
    assert exact.eligible([6, 7, 8, 7], RECENCY) == [1, 3]
    assert thresholds(SampleRequest(num_prompts=1, samples_per_prompt=1, trainer_version=0), 4).reward_low == -math.inf


def test_branches_follow_m_at_the_extremes() -> None:
    rng = random.Random(1)
    assert set(draw_branches(rng, 50, 1.0)) == {RECENCY} and set(draw_branches(rng, 50, 0.0)) == {REWARD}


def test_bearer_auth_accepts_only_the_token() -> None:
    auth = BearerAuth("tok")
    auth.check("Bearer tok")
    auth.check("bearer tok")
    for bad in (None, "", "Bearer", "Bearer tok2", "Bearer to", "Basic tok", "tok"):
        with pytest.raises(ApiError) as err:
            auth.check(bad)
        assert err.value.status == 401 and "WWW-Authenticate" in err.value.headers
    BearerAuth(None).check(None)  # no token configured: open


def test_rate_tracker_measures_over_its_window() -> None:
    rt = RateTracker(window=10)
    assert rt.update(0, 0, now=0.0) == {"ingest_samples_per_s": 0.0, "sample_samples_per_s": 0.0}
    assert rt.update(100, 50, now=2.0) == {"ingest_samples_per_s": 50.0, "sample_samples_per_s": 25.0}
    rt.update(200, 50, now=12.0)
    assert rt.update(300, 50, now=14.0)["ingest_samples_per_s"] == pytest.approx(200 / 12)


def test_sample_ids_depend_on_tokens_only_and_records_round_trip() -> None:
    a, b = make_sample([1, 2, 3], reward=1.0), make_sample([1, 2, 3], reward=2.0)
    assert sample_id(a.completion_ids) == sample_id(b.completion_ids) != sample_id([1, 2, 4])
    assert decode_record(encode_record(a)) == ([1, 2, 3], a.logprob_sum, a.ref_logprob_sum, "stop")


def test_redis_passwords_stay_out_of_messages() -> None:
    assert _safe_url("redis://:pw@host:6379/0") == "redis://***@host:6379/0"
    assert _safe_url("redis://host:6379/0") == "redis://host:6379/0"


def test_the_buffer_imports_no_ml_library() -> None:
    """Its image has no torch or vLLM: importing the whole service must not need them."""
    import subprocess
    import sys

    code = ("import sys, services.buffer.app, services.buffer.cli, services.buffer.ingest; "
            "print(','.join(m for m in ('torch', 'vllm', 'transformers', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == ""
