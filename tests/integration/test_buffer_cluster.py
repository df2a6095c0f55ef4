"""The buffer on a real Redis Cluster (3 primaries): prompts spread over the nodes, every script
stays in one slot, ingest, HTTP writes, both capacities and sampling work as on one Redis."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from redis.cluster import RedisCluster as SyncCluster

from services.buffer.ingest import Ingestor
from services.buffer.sampler import Sampler
from services.buffer.store import BufferStore
from tba.codec import encode
from tba.health import free_port
from tba.keys import STREAM_FIELD, Keys
from tba.local.commands import tba_command
from tba.redis_client import async_client
from tba.schemas import SampleRequest
from tba.settings import BufferSettings
from tests.unit.buffer_factories import check_consistency, make_group, served

K = Keys()
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cluster(redis_cluster):
    sync = redis_cluster.client()
    sync.flushall(target_nodes=SyncCluster.PRIMARIES)
    yield redis_cluster
    sync.close()


@pytest.mark.anyio
async def test_ingest_http_capacities_and_sampling_on_a_cluster(cluster) -> None:
    sync = cluster.client()
    s = BufferSettings(
        redis_url=cluster.url,
        redis_cluster=True,
        consumer_name="c1",
        ingest_block_ms=10,
        per_prompt_capacity=4,
        global_capacity=100,
    )
    client = async_client(s.redis_url, cluster=True)
    try:
        store = BufferStore(client, s)
        ing = Ingestor(client, store, s)
        await ing.ensure_group()
        await store.load_scripts()
        streamed = [make_group(f"p{i % 30}", version=i // 30, rewards=[0.0, 1.0, 2.0]) for i in range(90)]
        for group in streamed:
            sync.xadd(K.trajectories, {STREAM_FIELD: encode(group)})
        idle = 0
        while idle < 2:
            idle = idle + 1 if await ing.step(block_ms=10) == 0 else 0
        posted = [make_group(f"h{i}", version=3, rewards=[5.0, 6.0]) for i in range(10)]
        for group in posted:
            assert (await store.write_group(group)).added == 2
        assert (await store.write_group(posted[0])).resent
        stats = await store.stats()
        # 270 streamed samples, 4 kept per prompt (120), 20 posted: 140, cut to the global 100
        assert stats["samples"] == 100 and stats["groups_stored"] == 100 and stats["groups_duplicate"] == 1
        assert stats["samples_evicted"] == 150 + 40 and stats["samples_duplicate"] == 2
        assert sync.xpending(K.trajectories, K.ingest_group)["pending"] == 0
        summary = check_consistency(sync)
        assert summary["samples"] == 100
        nodes = {
            sync.get_node_from_key(K.prompt_key(p, "order")).name
            for p in (x.decode() for x in sync.zrange(K.global_key("newest_version"), 0, -1))
        }
        assert len(nodes) == 3, "prompts should spread over every primary"
        batch = await served(
            Sampler(store),
            SampleRequest(num_prompts=8, samples_per_prompt=3, recency_prob=0.5, trainer_version=3, seed=7),
        )
        assert len(batch.groups) == 8 and all(len(g.samples) == 3 for g in batch.groups)
        assert len({g.prompt_id for g in batch.groups}) == 8
        distinct = {(g.prompt_id, tuple(s.completion_ids)) for g in batch.groups for s in g.samples}
        assert (await store.stats())["samples_served_distinct"] == len(distinct)  # each counted once
    finally:
        await client.aclose()


def test_the_buffer_service_runs_on_a_cluster(cluster, tmp_path) -> None:
    sync = cluster.client()
    port = free_port()
    env = {
        **os.environ,
        "TBA_REDIS_URL": cluster.url,
        "TBA_REDIS_CLUSTER": "true",
        "TBA_PORT": str(port),
        "TBA_CONSUMER_NAME": "svc",
        "TBA_AUTH_TOKEN": "t0ken",
    }
    log = tmp_path / "buffer.log"
    proc = subprocess.Popen(tba_command("buffer"), cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    url, auth = f"http://127.0.0.1:{port}", {"Authorization": "Bearer t0ken"}
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        for i in range(40):
            sync.xadd(K.trajectories, {STREAM_FIELD: encode(make_group(f"p{i % 20}", version=1, rewards=[1.0, 2.0]))})
        group = make_group("posted", version=2, rewards=[3.0]).model_dump(mode="json")
        r = httpx.post(f"{url}/v1/groups", json=group, headers=auth)
        assert r.status_code == 200 and r.json()["added"] == 1, r.text
        deadline = time.monotonic() + 30
        while httpx.get(f"{url}/v1/stats").json()["samples"] < 81:
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        r = httpx.post(
            f"{url}/v1/sample",
            headers={**auth, "Accept": "application/json"},
            json={"num_prompts": 4, "samples_per_prompt": 2, "trainer_version": 2},
        )
        assert r.status_code == 200, r.text
        assert [len(g["samples"]) for g in r.json()["groups"]] == [2, 2, 2, 2]
        check_consistency(sync)
        node = cluster.nodes[2].client()  # one primary that may evict keys makes the whole buffer unready
        node.config_set("maxmemory-policy", "allkeys-lru")
        try:
            r = httpx.get(f"{url}/readyz")
            assert r.status_code == 503 and "allkeys-lru" in r.text
        finally:
            node.config_set("maxmemory-policy", "noeviction")
    finally:
        proc.terminate()
        proc.wait(20)


def test_checkpoint_announcements_and_trajectories_go_through_a_cluster(cluster) -> None:
    """What the trainer and the searchers write with the shared client, on a cluster."""
    from tba.checkpoints import announce
    from tba.redis_client import sync_client
    from tba.schemas import CheckpointManifest

    client = sync_client(cluster.url, cluster=True, timeout=5)
    pubsub = client.pubsub()
    pubsub.subscribe(K.checkpoint_channel)
    manifest = CheckpointManifest(version=3, step=3, path="v3", content_hash="0" * 64)
    announce(client, K, manifest)
    assert CheckpointManifest.model_validate_json(client.get(K.latest_manifest)).version == 3
    deadline, message = time.monotonic() + 10, None
    while message is None or message["type"] != "message":
        assert time.monotonic() < deadline, "no announcement arrived"
        message = pubsub.get_message(timeout=1)
    assert CheckpointManifest.model_validate_json(message["data"]).version == 3
    pipe = client.pipeline(transaction=False)
    for i in range(5):
        pipe.xadd(K.trajectories, {STREAM_FIELD: encode(make_group(f"p{i}"))})
    pipe.execute()
    assert client.xlen(K.trajectories) == 5
    pubsub.close()
