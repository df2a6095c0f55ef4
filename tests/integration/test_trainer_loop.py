"""The trainer service against a real buffer process and a real Redis.

The test stands in for the searchers: it writes scored groups of the tiny model
(real completions, rewards and reference log-probs) to the trajectory stream,
which the real buffer (`tba buffer`, a subprocess) ingests. The trainer runs
in-process for status checks, and as a `tba trainer` subprocess for SIGTERM and
`kill -9`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest
import torch

from services.trainer.checkpointing import load_state, optimizer_path
from services.trainer.loop import Trainer
from tba.checkpoints import TMP_PREFIX, CheckpointStore, model_identity, parse_manifest
from tba.codec import encode
from tba.health import free_port
from tba.keys import STREAM_FIELD, Keys
from tba.local.commands import tba_command
from tba.model.adapters import is_adapter
from tba.process_tree import descendants
from tba.schemas import ScoredGroup, ScoredSample
from tba.settings import SettingsError, TrainerSettings

T = 0.7
NS = "trn"
pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _one_torch_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def group_pool(tiny_model) -> list[ScoredGroup]:
    """12 prompts x 6 completions drawn from the tiny model, scored, with reference log-probs (version 0)."""
    from transformers import AutoModelForCausalLM

    from tba.model.logprobs import sequence_logprobs
    from tba.model.tokenizer import encode_prompt, load_tokenizer
    from tba.tasks import make_task

    torch.manual_seed(0)
    tok = load_tokenizer(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    task = make_task("arithmetic", {"digits": 1})
    groups, seen = [], set()
    for prompt in task.train_prompts(seed=0):
        if prompt.prompt_id in seen:
            continue
        seen.add(prompt.prompt_id)
        ids = encode_prompt(tok, prompt.text)
        with torch.no_grad():
            out = model.generate(
                torch.tensor([ids]),
                do_sample=True,
                temperature=T,
                top_k=0,
                max_new_tokens=4,
                num_return_sequences=6,
                pad_token_id=tok.pad_token_id,
            )
            completions = [
                c[: c.index(tok.eos_token_id) + 1] if tok.eos_token_id in c else c for c in out[:, len(ids) :].tolist()
            ]
            ref = sequence_logprobs(model, [ids] * 6, completions, T, tok.pad_token_id).tolist()
        samples = [
            ScoredSample(
                completion_ids=c,
                completion_text=tok.decode(c, skip_special_tokens=True),
                reward=task.reward(prompt, tok.decode(c, skip_special_tokens=True)),
                logprob_sum=lp,
                ref_logprob_sum=lp,
            )
            for c, lp in zip(completions, ref, strict=True)
        ]
        groups.append(
            ScoredGroup(
                prompt_id=prompt.prompt_id,
                prompt_text=prompt.text,
                prompt_ids=ids,
                task="arithmetic",
                policy_version=0,
                searcher_id="test",
                samples=samples,
                temperature=T,
                reference=model_identity(tiny_model),
            )
        )
        if len(groups) == 12:
            return groups
    raise AssertionError("unreachable")


def publish_groups(redis_client, groups: list[ScoredGroup], version: int) -> int:
    """XADD the groups as a searcher of ``version`` would; returns the number of samples sent."""
    keys = Keys(NS)
    n = 0
    for g in groups:
        fresh = g.model_copy(update={"policy_version": version, "group_id": f"{g.prompt_id}-v{version}"})
        redis_client.xadd(keys.trajectories, {STREAM_FIELD: encode(fresh)})
        n += len(g.samples)
    return n


class BufferProcess:
    """`tba buffer` as a subprocess on a free port."""

    def __init__(self, redis_url: str, log_path: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.redis_url = redis_url
        self.log_path = log_path
        self.env: dict[str, str] = {}
        self.proc: subprocess.Popen | None = None

    def start(self) -> BufferProcess:
        env = {
            **os.environ,
            "TBA_REDIS_URL": self.redis_url,
            "TBA_NAMESPACE": NS,
            "TBA_LOG_LEVEL": "WARNING",
            **self.env,
        }
        self.proc = subprocess.Popen(
            tba_command("buffer", "--port", str(self.port)),
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=self.log_path.open("a"),
        )
        wait_for(lambda: _http_ok(f"{self.url}/readyz"), 60, f"buffer to start (log {self.log_path})")
        return self

    def stop(self, kill: bool = False) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill() if kill else self.proc.terminate()
            self.proc.wait(30)

    def stats(self) -> dict:
        return httpx.get(f"{self.url}/v1/stats", timeout=5).json()


def _http_ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def wait_for(cond, timeout: float, what: str, every: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@pytest.fixture
def buffer(redis_server, tmp_path):
    proc = BufferProcess(redis_server.url, tmp_path / "buffer.log")
    yield proc
    proc.stop()


def settings_for(redis_server, buffer: BufferProcess, tiny_model: Path, tmp_path: Path, **kw) -> TrainerSettings:
    base = dict(
        redis_url=redis_server.url,
        namespace=NS,
        buffer_url=buffer.url,
        model=tiny_model,
        checkpoint_dir=tmp_path / "ckpt",
        metrics_port=0,
        prompts_per_step=2,
        train_samples_per_prompt=4,
        warmup_samples=24,
        checkpoint_every=2,
        checkpoint_grace_seconds=0.0,
        poll_seconds=0.05,
        lr=1e-3,
        metrics_file=tmp_path / "metrics.jsonl",
        torch_threads=1,
    )
    return TrainerSettings(**(base | kw))


def run_in_thread(trainer: Trainer) -> tuple[threading.Thread, list[int]]:
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(trainer.run()), daemon=True)
    thread.start()
    return thread, codes


def test_async_run_waits_survives_buffer_outages_and_stops_at_max_steps(
    redis_server, buffer, tiny_model, tmp_path, group_pool
):
    """Buffer down at start, then empty, then filled, then killed and restarted mid-run: 0 at max_steps."""
    s = settings_for(redis_server, buffer, tiny_model, tmp_path, max_steps=5)
    trainer = Trainer(s)
    thread, codes = run_in_thread(trainer)
    health = wait_for(lambda: trainer.health, 60, "the health server")
    base = f"http://127.0.0.1:{health.port}"
    wait_for(
        lambda: trainer._client is not None and trainer._client.failures >= 2, 60, "retries while the buffer is down"
    )
    assert httpx.get(f"{base}/status").json()["state"] == "warmup"
    ready = httpx.get(f"{base}/readyz")
    assert ready.status_code == 503 and "not reachable" in ready.text

    buffer.start()
    wait_for(lambda: trainer.client.reachable, 30, "the trainer to reach the buffer")
    time.sleep(0.3)
    assert trainer.step == 0 and httpx.get(f"{base}/status").json()["state"] == "warmup", "warm-up not reached"
    r = redis_server.client()
    sent = publish_groups(r, group_pool, version=0)
    wait_for(lambda: trainer.step >= 2, 120, "two steps")
    status = httpx.get(f"{base}/status").json()
    for field in (
        "step",
        "version",
        "loss",
        "reward_mean",
        "log_Z_mean",
        "kl",
        "beta",
        "samples_per_s",
        "tokens_per_s",
        "wait_s",
        "staleness",
        "state",
    ):
        assert field in status and status[field] is not None, field
    assert status["state"] in ("training", "waiting")
    assert "tba_trainer_step" in httpx.get(f"{base}/metrics").text

    buffer.stop(kill=True)
    failures = trainer.client.failures
    wait_for(lambda: trainer.client.failures > failures, 60, "retries after the buffer died")
    buffer.start()
    thread.join(180)
    assert codes == [0] and trainer.step == 5
    assert 24 <= buffer.stats()["samples"] <= sent

    store = CheckpointStore(s.checkpoint_dir)
    assert store.versions() == [2, 4, 5], "every k=2 steps, then a final one at max_steps"
    manifest = store.read_manifest()
    assert manifest.version == 5 and parse_manifest(r.get(Keys(NS).latest_manifest)) == manifest
    store.verify(manifest)
    assert load_state(store.resolve(manifest)).step == 5
    rows = [json.loads(x) for x in s.metrics_file.read_text().splitlines()]
    assert [x["step"] for x in rows] == [1, 2, 3, 4, 5]
    for row in rows:
        assert row["samples"] == 8 and sum(row["staleness_hist"].values()) == 8
        assert row["beta"] == 0.05 and row["loss"] >= 0 and row["tokens"] > 0
    assert trainer.status()["state"] == "done"


@pytest.mark.parametrize("seconds", [3600.0, 0.0])
def test_checkpoints_link_the_last_optimizer_file_until_it_is_due_and_the_final_one_writes_its_own(
    seconds, redis_server, buffer, tiny_model, tmp_path, group_pool
):
    """Weights-only publishing (TBA_OPTIMIZER_STATE_SECONDS): until the interval has passed, a checkpoint
    hard-links the optimizer file of the one before it and names the step it was written at; the final
    checkpoint, and every one at 0, write their own."""
    buffer.start()
    s = settings_for(redis_server, buffer, tiny_model, tmp_path, max_steps=5, optimizer_state_seconds=seconds)
    publish_groups(redis_server.client(), group_pool, version=0)
    thread, codes = run_in_thread(Trainer(s))
    thread.join(180)
    assert codes == [0]
    store = CheckpointStore(s.checkpoint_dir)
    assert store.versions() == [2, 4, 5]
    inode = {v: optimizer_path(store.step_dir(v)).stat().st_ino for v in (2, 4, 5)}
    written_at = {v: load_state(store.step_dir(v)).optimizer_step for v in (2, 4, 5)}
    if seconds:
        assert inode[4] == inode[2] != inode[5] and written_at == {2: None, 4: 2, 5: None}
    else:
        assert len(set(inode.values())) == 3 and written_at == {2: None, 4: None, 5: None}


def test_sync_mode_trains_only_on_the_current_version(redis_server, buffer, tiny_model, tmp_path, group_pool):
    """Sync GRPO: a checkpoint every step, each batch entirely from the version just published."""
    buffer.start()
    r = redis_server.client()
    publish_groups(r, group_pool[:6], version=0)
    published: list[int] = []
    stop = threading.Event()

    def searcher() -> None:
        # Plays the searchers: on each announced version, publish groups labelled with it.
        listener = redis_server.client()
        pubsub = listener.pubsub()
        pubsub.subscribe(Keys(NS).checkpoint_channel)
        while not stop.is_set():
            msg = pubsub.get_message(timeout=0.2)
            if msg and msg["type"] == "message":
                v = parse_manifest(msg["data"]).version
                published.append(v)
                publish_groups(r, group_pool[v % 2 * 6 : v % 2 * 6 + 6], version=v)

    t = threading.Thread(target=searcher, daemon=True)
    t.start()
    s = settings_for(
        redis_server,
        buffer,
        tiny_model,
        tmp_path,
        mode="sync",
        loss="grpo",
        max_steps=3,
        recency_prob=0.0,
        checkpoint_every=5,
        warmup_samples=8,
    )
    try:
        assert Trainer(s).run() == 0
    finally:
        stop.set()
        t.join(5)
    rows = [json.loads(x) for x in s.metrics_file.read_text().splitlines()]
    assert [x["step"] for x in rows] == [1, 2, 3]
    assert all(row["staleness_hist"] == {"0": 8} for row in rows), "only samples of the current version"
    assert published == [1, 2, 3] and CheckpointStore(s.checkpoint_dir).versions() == [1, 2, 3]
    assert all("advantage_abs_mean" in row for row in rows)


def test_a_bad_token_stops_the_run_with_a_clear_error(redis_server, buffer, tiny_model, tmp_path, group_pool):
    """A 401 from the buffer is our misconfiguration: exit 1 at once, no retry loop."""
    buffer.env["TBA_AUTH_TOKEN"] = "right-token"
    buffer.start()
    publish_groups(redis_server.client(), group_pool, version=0)
    wait_for(lambda: buffer.stats()["samples"] >= 24, 30, "ingest")
    s = settings_for(redis_server, buffer, tiny_model, tmp_path, auth_token="wrong-token", max_steps=2)
    trainer = Trainer(s)
    assert trainer.run() == 1
    assert trainer.step == 0 and CheckpointStore(s.checkpoint_dir).versions() == []


def replaying_pool(redis_server, buffer, tiny_model, tmp_path, group_pool, **kw) -> TrainerSettings:
    """The buffer started with the test's pool published, and settings under which the trainer replays those
    samples, the only ones there are, for as long as it runs (no recency, no bounds, one checkpoint at the end)."""
    buffer.start()
    publish_groups(redis_server.client(), group_pool, version=0)
    replay = dict(checkpoint_every=1000, recency_prob=0.0, max_reuse=None, max_staleness=None)
    return settings_for(redis_server, buffer, tiny_model, tmp_path, **(replay | kw))


def test_a_time_budget_decays_the_lr_to_zero_and_holds_across_a_restart(
    redis_server, buffer, tiny_model, tmp_path, group_pool
):
    """max_seconds with wsd: steps at the peak LR, then a decay that ends with the budget; a trainer restarted
    on the same checkpoints has no time left and takes no further step."""
    s = replaying_pool(
        redis_server,
        buffer,
        tiny_model,
        tmp_path,
        group_pool,
        max_seconds=8.0,
        lr_schedule="wsd",
        lr_decay_fraction=0.5,
    )
    started = time.monotonic()
    trainer = Trainer(s)
    assert trainer.run() == 0
    assert 8.0 <= time.monotonic() - started < 60
    lrs = [json.loads(x)["lr"] for x in s.metrics_file.read_text().splitlines()]
    assert len(lrs) >= 4, "too few steps to see a schedule"
    assert lrs[0] == pytest.approx(s.peak_lr), "stable phase at the peak"
    assert lrs[-1] < 0.5 * s.peak_lr and all(b <= a for a, b in zip(lrs, lrs[1:], strict=False)), lrs
    state = load_state(CheckpointStore(s.checkpoint_dir).resolve(CheckpointStore(s.checkpoint_dir).read_manifest()))
    assert state.step == len(lrs) and state.run_seconds >= 8.0

    again = Trainer(s)
    assert again.run() == 0
    assert again.step == state.step and again.run_seconds() >= state.run_seconds
    assert len(s.metrics_file.read_text().splitlines()) == len(lrs), "the spent budget stays spent"


def test_a_data_decay_follows_the_samples_trained_and_resumes_where_it_was(
    redis_server, buffer, tiny_model, tmp_path, group_pool
):
    """TBA_LR_DECAY_START_SAMPLES, in samples (8 per step here): at the peak for the first 16 samples, down to a
    quarter of it over the next 32, held there; a trainer restarted on the checkpoint goes on at the floor."""
    s = replaying_pool(
        redis_server,
        buffer,
        tiny_model,
        tmp_path,
        group_pool,
        max_steps=9,
        lr_decay_start_samples=16,
        lr_decay_samples=32,
        lr_min_ratio=0.25,
    )
    assert Trainer(s).run() == 0
    lrs = [json.loads(x)["lr"] / s.peak_lr for x in s.metrics_file.read_text().splitlines()]
    assert lrs == pytest.approx([1.0, 1.0, 1.0, 0.8125, 0.625, 0.4375, 0.25, 0.25, 0.25])

    again = Trainer(s.model_copy(update={"max_steps": 11}))
    assert again.run() == 0
    lrs = [json.loads(x)["lr"] / s.peak_lr for x in s.metrics_file.read_text().splitlines()]
    assert len(lrs) == 11 and lrs[9:] == pytest.approx([0.25, 0.25])


class Announcements:
    """Every checkpoint announcement on the channel, collected by a thread: version -> content hashes."""

    def __init__(self, client) -> None:
        self.client = client  # a collected client closes its pool, and with it the subscription
        self.pubsub = client.pubsub()
        self.pubsub.subscribe(Keys(NS).checkpoint_channel)
        assert self.pubsub.get_message(timeout=5)["type"] == "subscribe"
        self.seen: dict[int, set[str]] = {}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._listen, daemon=True)
        self.thread.start()

    def _listen(self) -> None:
        while not self.done.is_set():
            msg = self.pubsub.get_message(timeout=0.2)
            if msg and msg["type"] == "message":
                m = parse_manifest(msg["data"])
                self.seen.setdefault(m.version, set()).add(m.content_hash)

    def close(self) -> dict[int, set[str]]:
        time.sleep(0.5)
        self.done.set()
        self.thread.join(5)
        self.pubsub.close()
        return self.seen


def latest_version(store: CheckpointStore) -> int:
    manifest = store.read_manifest()
    return -1 if manifest is None else manifest.version


def start_trainer(env: dict, log_path: Path) -> subprocess.Popen:
    return subprocess.Popen(tba_command("trainer"), env=env, stdout=subprocess.DEVNULL, stderr=log_path.open("a"))


def trainer_process_env(
    redis_server, buffer, model, ckpt: Path, metrics_file: Path, **overrides: str
) -> dict[str, str]:
    """The environment of a `tba trainer` process against the test's Redis and buffer: small steps, a
    checkpoint every 2, fast polling, no bounds on reuse or staleness (the test's samples are all there
    are: the trainer replays them); ``overrides`` are further TBA_ variables."""
    return {
        **os.environ,
        "TBA_REDIS_URL": redis_server.url,
        "TBA_NAMESPACE": NS,
        "TBA_BUFFER_URL": buffer.url,
        "TBA_MODEL": str(model),
        "TBA_CHECKPOINT_DIR": str(ckpt),
        "TBA_MAX_STEPS": "1000",
        "TBA_CHECKPOINT_EVERY": "2",
        "TBA_CHECKPOINT_GRACE_SECONDS": "0",
        "TBA_TRAIN_SAMPLES_PER_PROMPT": "4",
        "TBA_WARMUP_SAMPLES": "24",
        "TBA_TORCH_THREADS": "1",
        "TBA_POLL_SECONDS": "0.05",
        "TBA_LR": "1e-3",
        "TBA_MAX_REUSE": "off",
        "TBA_MAX_STALENESS": "off",
        "TBA_METRICS_FILE": str(metrics_file),
        **overrides,
    }


@pytest.mark.parametrize("lora_rank", [0, 8], ids=["full", "lora"])
def test_kill_9_then_sigterm_resumes_without_reusing_versions(
    redis_server, buffer, tiny_model, tmp_path, group_pool, lora_rank
):
    """`tba trainer` killed with -9 (aimed at a checkpoint write), restarted with the same settings, then SIGTERM.

    The same for a LoRA run, whose checkpoints hold the adapters and their optimizer state only."""
    buffer.start()
    publish_groups(redis_server.client(), group_pool, version=0)
    ckpt, metrics_file = tmp_path / "ckpt", tmp_path / "metrics.jsonl"
    store = CheckpointStore(ckpt)
    env = trainer_process_env(
        redis_server,
        buffer,
        tiny_model,
        ckpt,
        metrics_file,
        TBA_KEEP_CHECKPOINTS="3",
        TBA_PROMPTS_PER_STEP="2",
        TBA_LORA_RANK=str(lora_rank),
    )
    announcements = Announcements(redis_server.client())
    log_path = tmp_path / "trainer.log"

    a = start_trainer(env, log_path)
    try:
        wait_for(lambda: latest_version(store) >= 4, 120, "version 4")
        try:  # aim the kill at a checkpoint being written; any moment will do if none is caught
            wait_for(lambda: any(p.name.startswith(TMP_PREFIX) for p in ckpt.iterdir()), 5, "a write", 0.001)
        except AssertionError:
            pass
    finally:
        a.send_signal(signal.SIGKILL)
        a.wait(10)
    newest = max(store.versions())
    store.verify(store.read_manifest())  # LATEST never names a half-written directory
    assert store.read_manifest().version in (newest, newest - 2)
    steps_done = max(json.loads(x)["step"] for x in metrics_file.read_text().splitlines())
    assert steps_done - newest <= 2, "a crash loses at most k steps"

    b = start_trainer(env, log_path)
    try:
        wait_for(lambda: latest_version(store) >= newest + 4, 120, "two new versions after the restart")
        b.send_signal(signal.SIGTERM)
        assert b.wait(60) == 0
    finally:
        if b.poll() is None:
            b.kill()
    log_text = log_path.read_text()
    assert f"resumed from step-{newest:06d}: step {newest}, version {newest}" in log_text
    if lora_rank:
        assert f"LoRA rank {lora_rank} on q_proj" in log_text
        for version in store.versions():
            assert is_adapter(store.step_dir(version)), "a LoRA run publishes adapters"
            assert not (store.step_dir(version) / "model.safetensors").exists()
    assert "(stop requested)" in log_text
    stopped_at = store.read_manifest()
    assert load_state(store.verify(stopped_at)).step == stopped_at.version, "SIGTERM saved the step it reached"
    steps = [json.loads(x)["step"] for x in metrics_file.read_text().splitlines()]
    assert steps[-1] == stopped_at.version and newest + 1 in steps[steps.index(steps_done) :]
    assert not any(p.name.startswith(TMP_PREFIX) for p in ckpt.iterdir()), "crash leftovers pruned"
    hashes = announcements.close()
    assert all(len(h) == 1 for h in hashes.values()), f"a version number was reused: {hashes}"
    assert newest in hashes and max(hashes) == stopped_at.version


def test_a_missing_model_is_a_clear_error(tmp_path) -> None:
    """`tba` turns SettingsError into exit 2 with the message; the trainer raises it before any training."""
    s = TrainerSettings(model=tmp_path / "nothing", checkpoint_dir=tmp_path / "c", buffer_url="http://127.0.0.1:9")
    trainer = Trainer(s)
    with pytest.raises(SettingsError, match=r"TBA_MODEL / --model: .*nothing.*tba model init"):
        trainer.run()
    assert trainer.status()["state"] == "done" and not (tmp_path / "c").exists()


def _rank_pids(launcher_pid: int) -> dict[int, int]:
    """rank -> pid of the trainer processes torchrun started (read from their environment)."""
    ranks = {}
    for pid in descendants(launcher_pid):
        try:
            env = dict(kv.split("=", 1) for kv in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in kv)
        except OSError:
            continue
        if "RANK" in env and "tba.cli" in Path(f"/proc/{pid}/cmdline").read_text():
            ranks[int(env["RANK"])] = pid
    return ranks


def test_a_two_rank_trainer_publishes_full_checkpoints_and_resumes_after_a_rank_dies(
    redis_server, buffer, tiny_model, tmp_path, group_pool
):
    """`tba trainer` as 2 FSDP2 ranks under torchrun (gloo): rank 0 fetches, both train, rank 0 publishes whole
    checkpoints. kill -9 of rank 1 takes the whole job down (torchrun exits non-zero, no rank left), the
    restart (what `tba up`'s supervisor or a container's restart policy does) resumes from the newest
    checkpoint, and SIGTERM publishes the step reached."""
    from transformers import AutoModelForCausalLM

    buffer.start()
    publish_groups(redis_server.client(), group_pool, version=0)
    ckpt = tmp_path / "ckpt"
    store = CheckpointStore(ckpt)
    env = trainer_process_env(
        redis_server, buffer, tiny_model, ckpt, tmp_path / "metrics.jsonl", TBA_PROMPTS_PER_STEP="3"
    )
    log_path = tmp_path / "trainer.log"
    env["TBA_TRAINER_PROCS"] = "2"  # `tba trainer` runs itself under torchrun
    cmd = tba_command("trainer")

    def launch() -> subprocess.Popen:
        return subprocess.Popen(
            cmd, env=env, stdout=subprocess.DEVNULL, stderr=log_path.open("a"), start_new_session=True
        )

    first = launch()
    try:
        wait_for(lambda: latest_version(store) >= 4, 180, f"version 4 (log {log_path})")
        ranks = wait_for(lambda: _rank_pids(first.pid) if len(_rank_pids(first.pid)) == 2 else None, 10, "ranks")
        os.kill(ranks[1], signal.SIGKILL)
        assert first.wait(60) != 0, "a dead rank fails the job"
        wait_for(lambda: not any(Path(f"/proc/{pid}").exists() for pid in ranks.values()), 10, "no rank left")
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait(10)
    newest = latest_version(store)
    second = launch()
    try:
        wait_for(lambda: latest_version(store) >= newest + 4, 180, "new versions after the restart")
        ranks = _rank_pids(second.pid)
        os.killpg(second.pid, signal.SIGTERM)  # what `tba up` and a container stop send
        second.wait(120)
    finally:
        if second.poll() is None:
            os.killpg(second.pid, signal.SIGKILL)
            second.wait(10)
    log_text = log_path.read_text()
    assert "trainer rank 1 of 2" in log_text and f"resumed from step-{newest:06d}" in log_text, log_text[-3000:]
    assert "(stop requested)" in log_text
    stopped_at = store.read_manifest()
    directory = store.verify(stopped_at)
    assert load_state(directory).step == stopped_at.version, "SIGTERM saved the step it reached"
    trained = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32)
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    assert trained.state_dict().keys() == base.state_dict().keys()
    assert any(not torch.equal(a, base.state_dict()[k]) for k, a in trained.state_dict().items())
    steps = [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1] == stopped_at.version and newest + 1 in steps
    assert not any(Path(f"/proc/{pid}").exists() for pid in ranks.values()), "no rank outlives the launcher"


def test_a_batch_with_no_valid_group_takes_no_step_and_publishes_nothing(
    redis_server, buffer, tiny_model, tmp_path, group_pool
):
    """Every group's ids outside the vocabulary: the trainer drops them, samples again, does not crash (it used to
    publish the same step twice: CheckpointError), then trains once valid groups arrive."""
    buffer.start()
    r = redis_server.client()
    bad = [
        g.model_copy(
            update={
                "prompt_id": f"bad-{g.prompt_id}",
                "samples": [
                    s.model_copy(update={"completion_ids": [10_000 + i, 10_001]}) for i, s in enumerate(g.samples)
                ],
            }
        )
        for g in group_pool[:6]
    ]
    publish_groups(r, bad, version=0)
    s = settings_for(redis_server, buffer, tiny_model, tmp_path, checkpoint_every=1, max_steps=2, warmup_samples=8)
    trainer = Trainer(s)
    thread, codes = run_in_thread(trainer)
    try:
        wait_for(lambda: trainer.metrics.dropped_groups._value.get() >= 6, 60, "whole batches dropped")
        assert thread.is_alive() and trainer.step == 0 and not CheckpointStore(s.checkpoint_dir).versions()
        publish_groups(r, group_pool[:6], version=0)
        thread.join(120)
    finally:
        trainer.stop.set()
        thread.join(30)
    assert codes == [0] and trainer.step == 2
    assert CheckpointStore(s.checkpoint_dir).versions() == [1, 2]


def test_sync_mode_retries_a_failed_checkpoint_write_instead_of_waiting_forever(
    redis_server, buffer, tiny_model, tmp_path, group_pool
):
    """Sync mode waits for samples of the version it publishes: with the first write failing (files capped at
    1 MB: EFBIG), the trainer retries it while waiting, and once writes work again the run goes on."""
    import resource

    buffer.start()
    r = redis_server.client()
    publish_groups(r, group_pool[:6], version=0)
    stop = threading.Event()

    def searcher() -> None:  # publishes groups of each announced version, as searchers do
        pubsub = redis_server.client().pubsub()
        pubsub.subscribe(Keys(NS).checkpoint_channel)
        while not stop.is_set():
            msg = pubsub.get_message(timeout=0.2)
            if msg and msg["type"] == "message":
                v = parse_manifest(msg["data"]).version
                publish_groups(r, group_pool[v % 2 * 6 : v % 2 * 6 + 6], version=v)

    helper = threading.Thread(target=searcher, daemon=True)
    helper.start()
    s = settings_for(
        redis_server, buffer, tiny_model, tmp_path, mode="sync", max_steps=2, recency_prob=0.0, warmup_samples=8
    )
    trainer = Trainer(s)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, hard))  # Python ignores SIGXFSZ: big writes fail
    thread, codes = run_in_thread(trainer)
    try:
        wait_for(lambda: trainer.step == 1, 60, "the first step")
        time.sleep(2 * 0.05 + 1.0)
        assert trainer.published == 0 and thread.is_alive(), "the write must have failed"
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    try:
        thread.join(120)
    finally:
        trainer.stop.set()
        stop.set()
        thread.join(30)
        helper.join(5)
    assert codes == [0] and trainer.step == 2 and trainer.published == 2
    assert CheckpointStore(s.checkpoint_dir).versions() == [1, 2]


def _metric(text: str, name: str) -> float:
    """The value of one Prometheus sample line ``name value`` (labels included in ``name``)."""
    return next(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + " "))


def three_steps_settings(redis_server, buffer, tiny_model, tmp_path, **kw) -> TrainerSettings:
    """A run of 3 steps from a warm-up of one batch (8 samples), with short long-polls: a wait shows at once."""
    return settings_for(
        redis_server, buffer, tiny_model, tmp_path, max_steps=3, warmup_samples=8, sample_wait_seconds=0.5, **kw
    )


@pytest.mark.parametrize("bound", ["reuse", "staleness"])
def test_async_trainer_waits_while_a_bound_binds_and_resumes_on_fresh_samples(
    bound, redis_server, buffer, tiny_model, tmp_path, group_pool
):
    """reuse: 18 samples generated allow two batches of 8 at max_reuse 1, the third waits for 6 more;
    staleness: samples of version 0 serve versions 0 and 1 at max_staleness 1, version 2 waits for new ones.
    The trainer says why it waits (status, metrics), and its reported ratio is what it consumed. Its
    recency branch takes the groups in arrival order: its cursor ends at the last group that arrived, and
    the final checkpoint carries it for a resumed trainer."""
    buffer.start()
    r = redis_server.client()
    limits = {"max_reuse": 1.0, "max_staleness": None} if bound == "reuse" else {"max_reuse": None, "max_staleness": 1}
    s = three_steps_settings(redis_server, buffer, tiny_model, tmp_path, recency_prob=1.0, **limits)
    publish_groups(r, group_pool[:3], version=0)
    trainer = Trainer(s)
    thread, codes = run_in_thread(trainer)
    wait_for(lambda: trainer.step == 2 and trainer.status()["state"] == "waiting", 120, "the bound to bind")
    reason = "reuse" if bound == "reuse" else "fresh_samples"
    assert trainer.status()["waiting_for"] == reason
    time.sleep(1.5)  # several long-polls: still waiting, nothing trained
    assert trainer.step == 2 and trainer.status()["state"] == "waiting"
    text = httpx.get(f"http://127.0.0.1:{trainer.health.port}/metrics").text
    waited = _metric(text, f'tba_trainer_wait_seconds_total{{reason="{reason}"}}')
    assert waited >= 1.0, "the wait is counted while it lasts"
    publish_groups(r, group_pool[3:4] if bound == "reuse" else group_pool[3:5], version=2)
    thread.join(120)
    assert codes == [0] and trainer.step == 3
    rows = [json.loads(x) for x in s.metrics_file.read_text().splitlines()]
    assert [row["wait_reason"] for row in rows] == [None, None, reason]
    assert rows[2]["wait_s"] >= 1.5
    if bound == "reuse":
        assert rows[1]["reuse"] == pytest.approx(16 / 18, abs=1e-4) and rows[2]["reuse"] == 1.0  # 24 of 24
    else:
        assert rows[2]["staleness_hist"] == {"0": 8}  # only the new version-2 samples
    arrived = 4 if bound == "reuse" else 5
    assert int(r.hget(Keys(NS).global_key("stats"), "groups_arrived")) == arrived
    assert trainer.arrival_cursor == arrived
    manifest = CheckpointStore(s.checkpoint_dir).read_manifest()
    assert manifest is not None and load_state(s.checkpoint_dir / manifest.path).arrival_cursor == arrived


def test_an_async_trainer_waiting_for_samples_publishes_the_step_it_has_not_published(
    redis_server, buffer, tiny_model, tmp_path, group_pool
):
    """Searchers paced to a batch per version wait for a newer checkpoint. A trainer that waits for their
    samples one step after its last checkpoint (k = 2) publishes and announces that step after one long-poll,
    instead of waiting for samples that wait for it; the steps after it publish as before."""
    buffer.start()
    r = redis_server.client()
    s = three_steps_settings(redis_server, buffer, tiny_model, tmp_path, max_reuse=1.0)
    assert s.checkpoint_every == 2
    publish_groups(r, group_pool[:2], version=0)  # 12 samples: one batch of 8 at max_reuse 1, then a wait
    trainer = Trainer(s)
    thread, codes = run_in_thread(trainer)
    store = CheckpointStore(s.checkpoint_dir)
    wait_for(lambda: (m := store.read_manifest()) is not None and m.version == 1, 60, "version 1 published")
    wait_for(lambda: r.get(Keys(NS).latest_manifest), 10, "version 1 announced")
    assert parse_manifest(r.get(Keys(NS).latest_manifest)).version == 1
    assert trainer.step == 1 and trainer.status()["state"] == "waiting"
    assert trainer.status()["waiting_for"] == "reuse"
    publish_groups(r, group_pool[2:5], version=1)
    thread.join(120)
    assert codes == [0] and trainer.step == 3
    assert store.versions() == [1, 2, 3]
