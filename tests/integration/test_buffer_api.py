"""The buffer's HTTP API (real app, real lifespan, real Redis): formats, auth, bad inputs, probes."""

from __future__ import annotations

import json
import time

import msgpack
import pytest
from fastapi.testclient import TestClient

from services.buffer.app import create_app
from tba.codec import MSGPACK_MEDIA_TYPE, decode, encode
from tba.keys import STREAM_FIELD, Keys
from tba.schemas import SampledBatch, SampleRequest
from tba.settings import BufferSettings
from tests.unit.buffer_factories import make_group

MSGPACK = {"Content-Type": MSGPACK_MEDIA_TYPE}


@pytest.fixture
def make_client(redis_server):
    clients = []

    def make(**overrides) -> TestClient:
        settings = BufferSettings(redis_url=redis_server.url, consumer_name="api", ingest_block_ms=20, **overrides)
        client = TestClient(create_app(settings))
        client.__enter__()
        clients.append(client)
        return client

    yield make
    for c in clients:
        c.__exit__(None, None, None)


def post_group(client: TestClient, group, **headers):
    return client.post("/v1/groups", content=encode(group), headers={**MSGPACK, **headers})


def error_of(resp) -> dict:
    body = resp.json()
    assert set(body) == {"error"} and body["error"]["status"] == resp.status_code
    return body["error"]


def test_groups_in_then_batches_out_in_msgpack_and_json(make_client) -> None:
    client = make_client()
    for i in range(3):
        r = post_group(client, make_group(f"p{i}", version=2, rewards=[0.0, 1.0, 2.0]))
        assert r.status_code == 200 and r.json()["added"] == 3
    body = encode(SampleRequest(num_prompts=3, samples_per_prompt=2, trainer_version=4, seed=3))
    r = client.post("/v1/sample", content=body, headers=MSGPACK)
    assert r.status_code == 200 and r.headers["content-type"] == MSGPACK_MEDIA_TYPE
    batch = decode(r.content, SampledBatch)
    assert len(batch.groups) == 3 and all(len(g.samples) == 2 for g in batch.groups)
    assert {s.staleness for g in batch.groups for s in g.samples} == {2}
    r = client.post("/v1/sample", content=body, headers={**MSGPACK, "Accept": "application/json"})
    assert r.headers["content-type"] == "application/json"
    assert decode(r.content, SampledBatch, "json") == batch  # same seed, same batch, other format
    r = client.post("/v1/sample", json={"num_prompts": 1, "samples_per_prompt": 1, "trainer_version": 0})
    assert r.status_code == 200 and SampledBatch.model_validate(msgpack.unpackb(r.content))


def test_posting_the_same_group_twice_stores_it_once(make_client) -> None:
    client = make_client()
    g = make_group("p", rewards=[1.0, 2.0])
    assert post_group(client, g).json() == {
        "group_id": g.group_id,
        "added": 2,
        "duplicates": 0,
        "evicted": 0,
        "resent": False,
    }
    again = client.post("/v1/groups", content=g.model_dump_json(), headers={"Content-Type": "application/json"})
    assert again.status_code == 200 and again.json()["resent"] is True
    stats = client.get("/v1/stats").json()
    assert stats["samples"] == 2 and stats["samples_duplicate"] == 2 and stats["versions"] == {"0": 2}


def test_409_with_a_reason_when_too_few_prompts(make_client) -> None:
    client = make_client()
    post_group(client, make_group("p"))
    r = client.post("/v1/sample", json={"num_prompts": 2, "samples_per_prompt": 4, "trainer_version": 0})
    assert r.status_code == 409
    err = error_of(r)
    assert err["code"] == "not_enough_samples" and "fewer than num_prompts=2" in err["message"]


def test_409_reuse_bound_and_bad_waits(make_client) -> None:
    """The reuse bound's refusal has its own code; a long-poll wait outside [0, 60] s is refused with a reason."""
    client = make_client()
    post_group(client, make_group("p", rewards=[1.0, 2.0]))
    body = {"num_prompts": 1, "samples_per_prompt": 2, "trainer_version": 0}
    r = client.post("/v1/sample", json={**body, "min_samples_generated": 3, "wait_seconds": 0.1})
    assert r.status_code == 409
    err = error_of(r)
    assert err["code"] == "reuse_bound" and "taken in 2 generated samples" in err["message"]
    ok = client.post("/v1/sample", json={**body, "min_samples_generated": 2}, headers={"Accept": "application/json"})
    assert ok.status_code == 200 and ok.json()["samples_generated"] == 2
    for bad in ({"wait_seconds": -1}, {"wait_seconds": 61}, {"wait_seconds": "inf"}, {"min_samples_generated": -1}):
        r = client.post("/v1/sample", json={**body, **bad})
        assert r.status_code == 422, (bad, r.text)
        assert next(iter(bad)) in error_of(r)["message"]


def test_auth_guards_writes_and_sampling_but_not_probes(make_client) -> None:
    client = make_client(auth_token="s3cret")
    g = encode(make_group("p"))
    for path, body in (
        ("/v1/groups", g),
        ("/v1/sample", encode(SampleRequest(num_prompts=1, samples_per_prompt=1, trainer_version=0))),
    ):
        r = client.post(path, content=body, headers=MSGPACK)
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
        assert "missing bearer token" in error_of(r)["message"]
        r = client.post(path, content=body, headers={**MSGPACK, "Authorization": "Bearer s3cre"})
        assert r.status_code == 401 and "invalid_token" in r.headers["www-authenticate"]
        r = client.post(path, content=body, headers={**MSGPACK, "Authorization": "Basic s3cret"})
        assert r.status_code == 401
    assert client.get("/v1/stats").json()["samples"] == 0  # nothing got in
    ok = {**MSGPACK, "Authorization": "Bearer s3cret"}
    assert client.post("/v1/groups", content=g, headers=ok).status_code == 200
    assert client.get("/healthz").status_code == 200 and client.get("/v1/stats").status_code == 200


@pytest.mark.parametrize(
    ("headers", "body", "status", "needle"),
    [
        (MSGPACK, b"", 400, "empty"),
        (MSGPACK, b"\xc1\x00", 422, "not valid msgpack"),
        ({"Content-Type": "application/json"}, b"{not json", 422, "not valid json"),
        ({"Content-Type": "text/plain"}, b"hello", 415, "text/plain"),
        ({"Content-Type": "application/json"}, json.dumps([1, 2]).encode(), 422, "map at the top level"),
    ],
)
def test_malformed_bodies_get_4xx_with_a_reason(make_client, headers, body, status, needle) -> None:
    client = make_client()
    for path in ("/v1/groups", "/v1/sample"):
        r = client.post(path, content=body, headers=headers)
        assert r.status_code == status, r.text
        assert needle in error_of(r)["message"]


def test_invalid_groups_are_refused_whole_and_nothing_is_stored(make_client) -> None:
    client = make_client(max_payload_bytes=4096)
    good = make_group("p", rewards=[1.0, 2.0]).model_dump()
    cases = {
        "samples.1.reward": {**good, "samples": [good["samples"][0], {**good["samples"][1], "reward": float("inf")}]},
        "policy_version": {**good, "policy_version": -1},
        "samples: List should have at least 1": {**good, "samples": []},
        "extra_field": {**good, "extra_field": 1},
        "policy_version: Input should be less than or equal to 2097151": {**good, "policy_version": 2**22},
        "prompt_ids.0: Input should be greater than or equal to 0": {**good, "prompt_ids": [-3]},
        # the wire's bounds: a reward whose sums overflow, a token id no vocabulary has, a boolean as a number
        "samples.0.reward: Input should be less than or equal to 1000000": {
            **good,
            "samples": [{**good["samples"][0], "reward": 1e308}],
        },
        "samples.0.logprob_sum: Input should be greater than or equal to -1000000000": {
            **good,
            "samples": [{**good["samples"][0], "logprob_sum": -1e300}],
        },
        "samples.0.completion_ids.0: Input should be less than or equal to 2147483647": {
            **good,
            "samples": [{**good["samples"][0], "completion_ids": [2**62]}],
        },
        "policy_version: Input should be a valid integer": {**good, "policy_version": False},
        "prompt_ids.0: Input should be a valid integer": {**good, "prompt_ids": ["7"]},
    }
    for needle, obj in cases.items():
        r = client.post("/v1/groups", content=msgpack.packb(obj), headers=MSGPACK)
        assert r.status_code == 422, (needle, r.text)
        assert needle.split(": List")[0] in error_of(r)["message"], (needle, r.text)
    big = {**good, "prompt_text": "x" * 5000}
    r = client.post("/v1/groups", content=msgpack.packb(big), headers=MSGPACK)
    assert r.status_code == 413 and "limit of 4096" in error_of(r)["message"]
    stats = client.get("/v1/stats").json()
    assert stats["samples"] == 0 and stats["prompts"] == 0 and stats["groups_ingested"] == 0


@pytest.mark.parametrize("fmt", ["json", "msgpack"])
def test_deeply_nested_bodies_are_refused_not_crashed_on(make_client, fmt) -> None:
    """100,000 nested lists overflow a recursive parser: 422 with the reason, never a 500."""
    client = make_client()
    body = b"[" * 100_000 + b"]" * 100_000 if fmt == "json" else b"\x91" * 100_000 + b"\xc0"
    headers = {"Content-Type": "application/json"} if fmt == "json" else MSGPACK
    for path in ("/v1/groups", "/v1/sample"):
        r = client.post(path, content=body, headers=headers)
        assert r.status_code == 422 and f"not valid {fmt}" in error_of(r)["message"], r.text


def test_extreme_rewards_within_the_bounds_keep_every_counter_and_draw_right(make_client) -> None:
    """Rewards at the bound: the reward sum stays exact enough, and the reward branch at the largest inverse
    temperature draws the best sample (a reward of 1e308 used to overflow the sum after the ack and NaN the
    softmax)."""
    client = make_client()
    top = 1e6
    for i, rewards in enumerate(([top, -top], [top, top - 1], [-top, -top])):
        g = make_group(f"x{i}", rewards=rewards)
        r = client.post("/v1/groups", content=encode(g), headers=MSGPACK)
        assert r.status_code == 200 and r.json()["added"] == 2, r.text
    stats = client.get("/v1/stats").json()
    assert stats["samples"] == 6 and stats["groups_ingested"] == 3
    assert stats["reward_mean"] == pytest.approx(-1 / 6, abs=1e-9)
    req = {
        "num_prompts": 3,
        "samples_per_prompt": 1,
        "trainer_version": 0,
        "recency_prob": 0.0,
        "reward_inv_temp": 1e6,
        "seed": 3,
    }
    r = client.post("/v1/sample", json=req, headers={"Accept": "application/json"})
    assert r.status_code == 200, r.text
    best = {g["prompt_id"]: g["samples"][0]["reward"] for g in r.json()["groups"]}
    assert best == {"x0": top, "x1": top, "x2": -top}


def test_sync_mode_serves_samples_as_generated_not_as_stored(make_client) -> None:
    """On-policy frequencies through the API: a completion generated 7 times in 8 (stored once) is served
    7/8 of the time by ``only_version`` draws, with or without replacement (binomial tests)."""
    from scipy.stats import binomtest

    client = make_client()
    common, rare = [11, 12], [13, 14]
    for version in (5, 6):  # version 5's copies are not version 6's; a resent group counts once
        group = make_group("p", version=version, rewards=[1.0] * 7 + [0.0], tokens=[common] * 7 + [rare])
        assert post_group(client, group).status_code == 200
        assert post_group(client, group).json()["resent"] is True

    def draws(k: int, n: int) -> list[list[int]]:
        out = []
        for seed in range(n):
            body = {
                "num_prompts": 1,
                "samples_per_prompt": k,
                "trainer_version": 6,
                "only_version": 6,
                "recency_prob": 0.0,
                "reward_inv_temp": 5.0,
                "seed": seed,
            }
            r = client.post("/v1/sample", json=body, headers={"Accept": "application/json"})
            assert r.status_code == 200, r.text
            out += [s["completion_ids"] for g in r.json()["groups"] for s in g["samples"]]
        return out

    one = draws(1, 400)  # the reward softmax does not apply: as generated, not reward-weighted
    hits = sum(c == common for c in one)
    assert binomtest(hits, len(one), 7 / 8).pvalue > 1e-3, hits
    assert binomtest(hits, len(one), 1 / 2).pvalue < 1e-12, hits  # what drawing distinct completions gives
    every = draws(8, 5)  # K equals what was generated: the generated group itself, each time
    assert all(every[i : i + 8].count(common) == 7 for i in range(0, 40, 8))
    many = draws(12, 40)  # K above what was generated: i.i.d. from the generated samples
    hits = sum(c == common for c in many)
    assert binomtest(hits, len(many), 7 / 8).pvalue > 1e-3, hits


def test_invalid_sample_requests_name_the_field(make_client) -> None:
    client = make_client()
    for body, field in (
        ({"num_prompts": 0, "samples_per_prompt": 1, "trainer_version": 0}, "num_prompts"),
        ({"num_prompts": 1, "samples_per_prompt": 1}, "trainer_version"),
        ({"num_prompts": 1, "samples_per_prompt": 1, "trainer_version": 0, "recency_prob": 2}, "recency_prob"),
        ({"num_prompts": 1, "samples_per_prompt": 1, "trainer_version": 0, "bogus": 1}, "bogus"),
        # beyond what the wire and the buffer's scores carry: 422, not a 500 when encoding
        ({"num_prompts": 1, "samples_per_prompt": 1, "trainer_version": 2**64}, "trainer_version"),
        ({"num_prompts": 1, "samples_per_prompt": 1, "trainer_version": 0, "only_version": 2**21}, "only_version"),
        ({"num_prompts": 1, "samples_per_prompt": 1, "trainer_version": 0, "seed": 2**63}, "seed"),
        # nothing is coerced: a boolean is no seed, a string no count
        (
            {"num_prompts": 1, "samples_per_prompt": 1, "trainer_version": 0, "seed": False},
            "seed: Input should be a valid integer",
        ),
        (
            {"num_prompts": "2", "samples_per_prompt": 1, "trainer_version": 0},
            "num_prompts: Input should be a valid integer",
        ),
    ):
        r = client.post("/v1/sample", json=body)
        assert r.status_code == 422 and field in error_of(r)["message"], r.text


def test_stream_ingest_runs_in_the_app_lifespan(make_client, redis_server) -> None:
    client = make_client()
    sync = redis_server.client()
    for i in range(5):
        sync.xadd(Keys().trajectories, {STREAM_FIELD: encode(make_group(f"p{i}", version=1, searcher_id="s-a"))})
    sync.xadd(Keys().trajectories, {STREAM_FIELD: b"junk"})
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        stats = client.get("/v1/stats").json()
        if stats["groups_ingested"] == 6:
            break
        time.sleep(0.05)
    assert stats["samples"] == 10 and stats["dead_letters"] == 1 and stats["searcher_versions"] == {"s-a": [1]}
    assert stats["dedup_records"] == 5  # one remembered id per stored group, none for the dead letter
    assert stats["ingest"]["healthy"] is True and stats["ingest"]["consumer"] == "api"
    for key in (
        "reward_mean",
        "ingest_samples_per_s",
        "sample_samples_per_s",
        "samples_evicted",
        "samples_dead_lettered",
        "groups_stored",
    ):
        assert key in stats


def test_probes_metrics_and_docs(make_client, redis_server) -> None:
    client = make_client()
    assert client.get("/healthz").text == "ok\n"
    assert client.get("/readyz").status_code == 200
    post_group(client, make_group("p", version=3))
    metrics = client.get("/metrics").text
    assert 'tba_buffer_state{figure="samples"} 2.0' in metrics
    assert 'tba_buffer_version_samples{version="3"} 2.0' in metrics
    assert 'tba_buffer_http_requests_total{route="/v1/groups",status="200"} 1.0' in metrics
    assert client.get("/docs").status_code == 200
    spec = client.get("/openapi.json").json()
    assert {"/v1/sample", "/v1/groups", "/v1/stats", "/readyz"} <= set(spec["paths"])
    assert "SampleRequest" in spec["components"]["schemas"] and "ScoredGroup" in spec["components"]["schemas"]
    redis_server.client().config_set("maxmemory-policy", "allkeys-lru")
    r = client.get("/readyz")
    assert r.status_code == 503 and "maxmemory-policy is allkeys-lru" in r.text and "noeviction" in r.text
    redis_server.client().config_set("maxmemory-policy", "noeviction")
    redis_server.stop()
    r = client.get("/readyz")
    assert r.status_code == 503 and "unreachable" in r.text
    r = client.get("/v1/stats")
    assert r.status_code == 503 and error_of(r)["code"] == "redis_unavailable"


def test_the_first_objective_is_pinned_and_others_are_refused_with_the_reason(make_client, redis_server) -> None:
    """A searcher at another temperature or with another reference model would silently change the loss: its
    groups are refused (HTTP 409, dead letter on the stream), and so is a trainer of another objective."""
    client = make_client()
    first = make_group("p0")
    assert post_group(client, first).status_code == 200  # pins (0.7, test-reference)
    hot = make_group("p1").model_copy(update={"temperature": 1.0})
    r = post_group(client, hot)
    assert r.status_code == 409 and error_of(r)["code"] == "objective_mismatch", r.text
    assert "temperature 1 and reference model test-reference" in error_of(r)["message"]
    assert "samples at temperature 0.7" in error_of(r)["message"]
    other = make_group("p2").model_copy(update={"reference": "another-base"})
    sync = redis_server.client()
    sync.xadd(Keys().trajectories, {STREAM_FIELD: encode(other)})
    deadline = time.monotonic() + 10
    while client.get("/v1/stats").json()["dead_letters"] < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    letters = sync.xrange(Keys().dead_letters)
    assert len(letters) == 1 and b"reference model another-base" in letters[0][1][b"reason"]
    stats = client.get("/v1/stats").json()
    assert stats["samples"] == len(first.samples) and stats["prompts"] == 1  # nothing of the refused ones
    request = {"num_prompts": 1, "samples_per_prompt": 1, "trainer_version": 0}
    r = client.post("/v1/sample", json={**request, "temperature": 0.7, "reference": "another-base"})
    assert r.status_code == 409 and error_of(r)["code"] == "objective_mismatch", r.text
    assert (
        client.post("/v1/sample", json={**request, "temperature": 0.7, "reference": "test-reference"}).status_code
        == 200
    )
    assert client.post("/v1/sample", json=request).status_code == 200  # a client that states none is not checked
    # JSON's 1.0 is the integer 1 (JSON Schema agrees); only booleans and strings are refused
    assert client.post("/v1/sample", json={**request, "num_prompts": 1.0, "seed": 7.0}).status_code == 200
    assert client.post("/v1/sample", json={**request, "temperature": 0.7}).status_code == 200  # one half, checked
    r = client.post("/v1/sample", json={**request, "temperature": 0.8})
    assert r.status_code == 409 and error_of(r)["code"] == "objective_mismatch", r.text
