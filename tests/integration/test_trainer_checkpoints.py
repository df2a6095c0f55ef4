"""Trainer checkpoints: what searchers load is the trainer's model, announcements reach Redis, resume is exact."""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path

import pytest
import torch

from services.trainer.batching import Row
from services.trainer.checkpointing import (
    Announcer,
    TrainerState,
    find_resume_point,
    optimizer_path,
    restore_trainer_state,
    save_checkpoint,
)
from services.trainer.distributed import ONE_PROCESS, full_state
from services.trainer.learner import Learner
from services.trainer.losses import make_loss
from services.trainer.optim import LRSchedule, build_optimizer, set_step
from tba.checkpoints import TMP_PREFIX, CheckpointError, CheckpointStore, parse_manifest
from tba.keys import Keys
from tba.model.logprobs import sequence_logprobs
from tba.model.tokenizer import encode_prompt, load_tokenizer

T = 0.7


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Tiny models run fastest on one thread, and the CI cores are shared with other tests."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def batches(n: int, seed: int = 0) -> list[list[Row]]:
    rng = random.Random(seed)
    out = []
    for b in range(n):
        rows = []
        for p in range(3):
            prompt = (1, *(rng.randrange(4, 40) for _ in range(5)))
            for _ in range(4):
                completion = tuple(rng.randrange(4, 40) for _ in range(rng.randint(2, 6))) + (2,)
                rows.append(
                    Row(("t", f"{b}-{p}"), prompt, completion, float(rng.random() > 0.5), -rng.uniform(10, 20), 0, 0)
                )
        out.append(rows)
    return out


def make_learner(model_dir: Path) -> Learner:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    optimizer, scheduler = build_optimizer(model, 3e-3, 0.01, LRSchedule("linear", warmup_steps=1, max_steps=10))
    return Learner(
        model, optimizer, scheduler, make_loss("tb"), temperature=T, pad_id=0, token_budget=64, grad_clip=1.0
    )


def publish(store: CheckpointStore, learner: Learner, tokenizer, step: int):
    state = TrainerState(step=step, beta=0.05, samples_seen=12 * step)
    return save_checkpoint(store, learner.model, tokenizer, learner.optimizer, learner.scheduler, state)


@pytest.fixture
def trained(tiny_model, tmp_path):
    """A learner two steps past the base model, and its published checkpoint (version 2)."""
    torch.manual_seed(0)
    learner = make_learner(tiny_model)
    for rows in batches(2):
        learner.step(rows, beta=0.05)
    store = CheckpointStore(tmp_path / "ckpt")
    tokenizer = load_tokenizer(tiny_model)
    manifest = publish(store, learner, tokenizer, step=2)
    return learner, store, manifest, tokenizer


def test_published_checkpoint_loads_with_transformers_and_matches_the_trainer(trained, tiny_model, redis_server):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    learner, store, manifest, tokenizer = trained
    keys = Keys("t1")
    r = redis_server.client()
    pubsub = r.pubsub()
    pubsub.subscribe(keys.checkpoint_channel)
    assert pubsub.get_message(timeout=2)["type"] == "subscribe"
    assert Announcer(r, keys).announce(manifest)

    assert parse_manifest(r.get(keys.latest_manifest)) == manifest
    msg = pubsub.get_message(timeout=2)
    assert msg is not None and parse_manifest(msg["data"]) == manifest
    assert store.read_manifest() == manifest and manifest.path == "step-000002" and manifest.version == 2
    directory = store.verify(manifest)
    assert {"model.safetensors", "config.json", "tokenizer.json", "generation_config.json"} <= {
        p.name for p in directory.iterdir()
    }
    assert not list(store.root.glob(f"{TMP_PREFIX}*"))

    loaded = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32)
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    assert AutoTokenizer.from_pretrained(str(directory)).get_vocab() == tokenizer.get_vocab()
    assert GenerationConfig.from_pretrained(str(directory)).eos_token_id == tokenizer.eos_token_id
    ids = torch.tensor([encode_prompt(tokenizer, "12+34=")])
    learner.model.eval()
    with torch.no_grad():
        want = learner.model(ids).logits
        torch.testing.assert_close(loaded(ids).logits, want, rtol=0, atol=1e-6)
        assert (base(ids).logits - want).abs().max() > 1e-3, "the checkpoint carries the trained weights"
        greedy = learner.model.generate(ids, do_sample=False, max_new_tokens=8)
        assert torch.equal(loaded.generate(ids, do_sample=False, max_new_tokens=8), greedy)


def test_announce_failure_is_kept_and_retried(trained, redis_server):
    _, _, manifest, _ = trained
    keys = Keys("t2")
    r = redis_server.client()
    redis_server.stop(kill=True)
    announcer = Announcer(r, keys)
    assert not announcer.announce(manifest) and announcer.pending == manifest
    redis_server.start()
    assert announcer.flush() and announcer.pending is None
    assert parse_manifest(r.get(keys.latest_manifest)).version == 2


def test_resume_continues_exactly_as_if_never_stopped(trained, tiny_model):
    learner, store, manifest, _ = trained
    more = batches(4, seed=1)[2:]
    for rows in more:
        learner.step(rows, beta=0.05)
    uninterrupted = {k: v.clone() for k, v in learner.model.state_dict().items()}

    point = find_resume_point(store)
    assert point is not None and point.manifest == manifest and point.state.step == 2
    assert point.state.samples_seen == 24
    resumed = make_learner(point.directory)
    restore_trainer_state(point.directory, resumed.model, resumed.optimizer, resumed.scheduler)
    assert resumed.scheduler.last_epoch == 2
    for rows in more:
        resumed.step(rows, beta=0.05)
    for k, v in resumed.model.state_dict().items():
        torch.testing.assert_close(v, uninterrupted[k], rtol=0, atol=1e-7, msg=k)


def test_a_weights_only_checkpoint_links_the_optimizer_file_and_resumes_at_its_own_step(trained):
    """Weights-only publishing: a checkpoint hard-links the optimizer file of the one before it (written at
    step 2), stays resumable once that one is pruned, and a trainer resumed from it has its weights and its
    schedule's step (4), with the optimizer moments of step 2."""
    learner, store, first, tokenizer = trained
    written = optimizer_path(store.resolve(first))
    for rows in batches(2, seed=3):
        learner.step(rows, beta=0.05)
    model_state, no_optimizer = full_state(learner.model, learner.optimizer, ONE_PROCESS, with_optimizer=False)
    assert no_optimizer is None
    state = TrainerState(step=4, beta=0.05, samples_seen=48, optimizer_step=2)
    newer = save_checkpoint(
        store,
        learner.model,
        tokenizer,
        learner.optimizer,
        learner.scheduler,
        state,
        model_state=model_state,
        optimizer_file=written,
    )
    linked = optimizer_path(store.resolve(newer))
    assert linked.stat().st_ino == written.stat().st_ino and linked.stat().st_nlink == 2
    assert store.prune(keep=1, grace_seconds=0) == [2] and linked.stat().st_nlink == 1
    store.verify(newer)

    point = find_resume_point(store)
    assert point is not None and point.manifest == newer
    assert (point.state.step, point.state.optimizer_step, point.state.samples_seen) == (4, 2, 48)
    resumed = make_learner(point.directory)
    restore_trainer_state(point.directory, resumed.model, resumed.optimizer, resumed.scheduler)
    assert resumed.scheduler.last_epoch == 2, "the optimizer file's own step"
    set_step(resumed.scheduler, point.state.step)
    assert resumed.scheduler.last_epoch == learner.scheduler.last_epoch == 4
    assert resumed.optimizer.param_groups[0]["lr"] == pytest.approx(learner.optimizer.param_groups[0]["lr"])
    for k, v in resumed.model.state_dict().items():
        torch.testing.assert_close(v, learner.model.state_dict()[k], rtol=0, atol=0, msg=k)


def test_a_crash_never_exposes_a_half_written_checkpoint(trained):
    learner, store, manifest, tokenizer = trained
    # A writer killed mid-write leaves a temporary directory: never a resume point, never in LATEST.
    half = store.new_tmp_dir()
    (half / "model.safetensors").write_bytes(b"\0" * 100)
    # A writer killed between the rename and the manifest: complete, newest, not yet announced.
    for rows in batches(1, seed=2):
        learner.step(rows, beta=0.05)
    state = TrainerState(step=3, beta=0.05)
    tmp = store.new_tmp_dir()
    learner.model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    from services.trainer.checkpointing import _save_trainer_state

    _save_trainer_state(tmp / "trainer", learner.optimizer, learner.scheduler, state)
    tmp.rename(store.step_dir(3))
    assert store.read_manifest().version == 2

    point = find_resume_point(store)
    assert point.state.step == 3 and point.directory == store.step_dir(3)
    assert store.read_manifest().version == 3, "the resumed state is re-published"
    store.verify(store.read_manifest())
    with pytest.raises(CheckpointError, match="never reused"):
        publish(store, learner, tokenizer, step=3)
    assert sorted(store.versions()) == [2, 3]


def test_a_damaged_newest_checkpoint_falls_back_to_the_previous(trained):
    learner, store, manifest, tokenizer = trained
    newer = publish(store, learner, tokenizer, step=4)
    (store.resolve(newer) / "trainer" / "state.json").write_text("{not json")
    point = find_resume_point(store)
    assert point.state.step == 2
    assert json.loads(store.manifest_path.read_text())["version"] == 2


def test_a_power_loss_tearing_weights_only_checkpoints_resumes_from_the_newest_intact(trained, monkeypatch):
    """Weights-only checkpoints are not fsynced (the one that writes the optimizer's state is): after a power loss
    that tore the newest one and LATEST, a resume takes the newest intact checkpoint, re-publishes it, sets the torn
    one aside, and the trainer can publish that version number again."""
    learner, store, first, tokenizer = trained
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    written = optimizer_path(store.resolve(first))

    def weights_only(step: int):
        learner.step(batches(1, seed=step)[0], beta=0.05)
        state = TrainerState(step=step, beta=0.05, optimizer_step=2)
        opt, sched = learner.optimizer, learner.scheduler
        return save_checkpoint(store, learner.model, tokenizer, opt, sched, state, optimizer_file=written)

    intact, torn = weights_only(3), weights_only(4)
    assert synced == [], "a weights-only checkpoint is not fsynced"
    weights = store.resolve(torn) / "model.safetensors"
    weights.write_bytes(b"\0" * weights.stat().st_size)  # what an unsynced file can come back as
    store.manifest_path.write_bytes(b"")

    point = find_resume_point(store)
    assert point is not None and point.manifest == intact and point.state.step == 3
    assert store.read_manifest() == intact and store.versions() == [2, 3]
    assert len(list(store.root.glob("unusable-step-000004-*"))) == 1
    assert synced, "the resume point is re-published durably"
    synced.clear()
    again = publish(store, learner, tokenizer, step=4)
    assert store.verify_own(4) == again
    assert synced, "a checkpoint that writes the optimizer's state is fsynced"


def test_prune_keeps_the_newest_and_respects_the_grace_period(trained):
    learner, store, _, tokenizer = trained
    for step in (4, 6, 8):
        publish(store, learner, tokenizer, step=step)
    assert store.prune(keep=2, grace_seconds=3600) == []
    assert store.versions() == [2, 4, 6, 8]
    assert store.prune(keep=2, grace_seconds=0, now=time.time() + 1) == [2, 4]
    assert store.versions() == [6, 8] and store.read_manifest().version == 8


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_loads_the_published_checkpoint_with_the_trainers_outputs(trained, tiny_model):
    """The CPU vLLM engine serves the published weights: same greedy tokens, same tempered log-probs."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    learner, store, manifest, tokenizer = trained
    directory = store.verify(manifest)
    prompts = [encode_prompt(tokenizer, t) for t in ("12+34=", "7+5=", "99+1=")]
    llm = LLM(
        model=str(directory),
        dtype="float32",
        max_model_len=128,
        enforce_eager=True,
        logprobs_mode="processed_logprobs",
        seed=0,
    )
    try:
        greedy = llm.generate(
            [TokensPrompt(prompt_token_ids=p) for p in prompts],
            SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True),
            use_tqdm=False,
        )
        sampled = llm.generate(
            [TokensPrompt(prompt_token_ids=p) for p in prompts],
            SamplingParams(temperature=T, max_tokens=8, logprobs=0, ignore_eos=True, seed=1),
            use_tqdm=False,
        )
    finally:
        del llm
    learner.model.eval()
    with torch.no_grad():
        for p, out in zip(prompts, greedy, strict=True):
            hf = learner.model.generate(torch.tensor([p]), do_sample=False, max_new_tokens=8, min_new_tokens=8)
            assert list(out.outputs[0].token_ids) == hf[0, len(p) :].tolist()
        completions = [list(o.outputs[0].token_ids) for o in sampled]
        log_pi = sequence_logprobs(learner.model, prompts, completions, T, tokenizer.pad_token_id)
    vllm_sums = torch.tensor([o.outputs[0].cumulative_logprob for o in sampled])
    torch.testing.assert_close(vllm_sums, log_pi, rtol=0, atol=1e-3)
