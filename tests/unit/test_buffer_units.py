"""Pure parts of the buffer: the sampling rule's helpers, auth, rates, ids, records, the Lua scripts' files."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.buffer import redis_scripts
from services.buffer.auth import BearerAuth
from services.buffer.errors import ApiError
from services.buffer.metrics import RateTracker
from services.buffer.records import RECORD_FIELDS, PromptView, encode_record, sample_id, served_group
from services.buffer.sampler import RECENCY, REWARD, Thresholds, choose_samples, draw_branches, softmax
from tba.codec import pack
from tba.schemas import SampledGroup, SampledSample
from tests.unit.buffer_factories import make_sample


@given(st.lists(st.floats(-50, 50), min_size=1, max_size=30), st.floats(0, 100))
def test_softmax_is_a_distribution_even_for_large_inverse_temperatures(rewards, inv_temp) -> None:
    p = softmax(rewards, inv_temp)
    assert math.isclose(sum(p), 1.0, rel_tol=1e-9) and all(0 <= x <= 1 for x in p)
    best = max(range(len(rewards)), key=lambda i: rewards[i])
    assert p[best] == max(p)


@given(
    n=st.integers(1, 12),
    k=st.integers(1, 12),
    branch=st.sampled_from([RECENCY, REWARD]),
    inv_temp=st.sampled_from([0.0, 2.0]),
    seed=st.integers(0, 1000),
)
def test_choose_samples_draws_k_from_candidates_without_replacement_when_possible(n, k, branch, inv_temp, seed) -> None:
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


def test_thresholds_hold_each_branch_to_its_cut_off() -> None:
    """The cut-offs themselves come from pick_prompts.lua (test_buffer_store.py checks them)."""
    th = Thresholds(recency_low=8, reward_low=7, exact=None)
    assert th.eligible([6, 7, 8, 9], RECENCY) == [2, 3] and th.eligible([6, 7, 8, 9], REWARD) == [1, 2, 3]
    exact = Thresholds(recency_low=7, reward_low=7, exact=7)
    assert exact.eligible([6, 7, 8, 7], RECENCY) == [1, 3] and exact.eligible([6, 7, 8, 7], REWARD) == [1, 3]


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


def test_sample_ids_depend_on_tokens_only_and_records_are_served_as_stored() -> None:
    a, b = make_sample([1, 2, 3], reward=1.0), make_sample([1, 2, 3], reward=2.0)
    assert sample_id(a.completion_ids) == sample_id(b.completion_ids) != sample_id([1, 2, 4])
    view = PromptView(
        "p", [5, 6], "text", "task", [b"id-a", b"id-b"], versions=[2, 3], rewards=[0.5, 1.0], copies=[1, 1]
    )
    group = SampledGroup.model_validate(served_group(view, "reward", [1], [encode_record(a, "s-1")], trainer_version=5))
    assert (group.prompt_id, group.prompt_ids, group.prompt_text, group.task, group.branch) == (
        "p",
        [5, 6],
        "text",
        "task",
        "reward",
    )
    assert group.samples == [
        SampledSample(
            completion_ids=[1, 2, 3],
            reward=1.0,
            logprob_sum=a.logprob_sum,
            ref_logprob_sum=a.ref_logprob_sum,
            version=3,
            staleness=2,
            finish_reason="stop",
            searcher_id="s-1",
        )
    ]
    unscored = a.model_copy(update={"ref_logprob_sum": None})  # TBA_REF_PASS=trainer: served as null
    served = served_group(view, "reward", [0], [encode_record(unscored, "s-1")], trainer_version=5)
    assert SampledGroup.model_validate(served).samples[0].ref_logprob_sum is None
    # A record stored before records named their searcher (one field shorter) is served without one.
    old = pack([getattr(a, name) for name in RECORD_FIELDS[:-1]])
    assert SampledGroup.model_validate(served_group(view, "reward", [0], [old], 5)).samples[0].searcher_id is None


def test_the_served_forms_name_the_schemas_fields_and_a_mismatch_stops_the_buffer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from services.buffer import records

    records._check_against_schema()  # the module loaded, so this holds; a drifted schema must not
    monkeypatch.setattr(records, "SERVED_FIELDS", (*records.RECORD_FIELDS, "reward", "version"))
    with pytest.raises(RuntimeError, match="SampledSample.*staleness"):
        records._check_against_schema()


def test_every_lua_script_ships_as_package_data_and_a_missing_one_fails_loudly() -> None:
    import fnmatch
    import tomllib
    from pathlib import Path

    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    shipped = pyproject["tool"]["setuptools"]["package-data"]["services.buffer"]
    scripts = sorted(redis_scripts.LUA_DIR.glob("*.lua"))
    assert scripts and all(any(fnmatch.fnmatch(f"lua/{s.name}", glob) for glob in shipped) for s in scripts)
    with pytest.raises(RuntimeError, match="missing.lua is missing"):
        redis_scripts.read_lua("missing.lua")
    assert redis_scripts.PICK_PROMPTS.startswith("#!lua flags=no-writes\nlocal VERSION_SHIFT = 4294967296\n")


def test_the_buffer_imports_no_ml_library() -> None:
    """Its image has no torch or vLLM: importing the whole service must not need them."""
    import subprocess
    import sys

    code = (
        "import sys, services.buffer.app, services.buffer.cli, services.buffer.ingest; "
        "print(','.join(m for m in ('torch', 'vllm', 'transformers', 'numpy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == ""


def test_the_global_steps_items_are_named_once_for_both_sides() -> None:
    """An item of global_step.lua's ARGV: the store writes the fields GLOBAL_ITEM_FIELDS names, in that order, and
    the script reads every one of them by name (its ITEM offsets), none by a bare position."""
    import dataclasses

    from services.buffer.store import _Item

    assert tuple(f.name for f in dataclasses.fields(_Item)) == redis_scripts.GLOBAL_ITEM_FIELDS
    item = _Item("group", "g1", "tok", "1-0", "p1", 4, "s0", b"\x90", True)
    assert item.args() == ["group", "g1", "tok", "1-0", "p1", 4, "s0", b"\x90", "1"]
    assert "local ITEM = {kind = 0, group_id = 1," in redis_scripts.GLOBAL_STEP
    body = redis_scripts.read_lua("global_step.lua")
    assert all(f"ITEM.{field}]" in body for field in redis_scripts.GLOBAL_ITEM_FIELDS)
    assert "ARGV[b + " not in body.replace("ARGV[b + ITEM.", "")
