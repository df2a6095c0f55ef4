"""The searcher with the real vLLM CPU engine (one engine for the whole module) and a real redis-server.

Checks the numbers the TB loss depends on (behaviour and reference log-probs equal the trainer's
computation, at the base weights and after a reload, when the reference pass scores), the stream
round trip, and hot reload: new weights served in place, groups stamped with the new version, a
checkpoint whose hash does not match refused, straight to the newest version.
"""

from __future__ import annotations

import itertools
import os
import shutil
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from services.searcher.cpus import engine_core_pids, spare_cpus
from services.searcher.engine import Engine
from services.searcher.loop import Searcher
from services.searcher.scorer import GeneratedBatch, Scorer
from tba.checkpoints import CheckpointStore, announce, model_identity
from tba.codec import decode
from tba.keys import STREAM_FIELD, Keys
from tba.local.lifetime import alive_in
from tba.model.logprobs import sequence_logprobs
from tba.model.tiny import init_model
from tba.model.tokenizer import encode_prompt, load_tokenizer
from tba.process_tree import command_line, cpu_seconds, descendants
from tba.schemas import ScoredGroup, scored_flags
from tba.settings import SearcherSettings
from tba.tasks import MultiTurnTask, Prompt, Step, make_task

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

T = 0.7
PROMPTS = ["12+34=", "5+7=", "99+1=", "40+40=", "3+58=", "61+22="]


def settings_for(model: Path, tmp: Path, redis_url: str = "redis://127.0.0.1:1/0", **kw) -> SearcherSettings:
    base = dict(
        model=model,
        redis_url=redis_url,
        namespace="t",
        checkpoint_dir=tmp / "ckpt",
        spill_dir=tmp / "spill",
        searcher_id="s-test",
        completions_per_prompt=4,
        prompts_per_batch=6,
        max_new_tokens=12,
        temperature=T,
        max_model_len=64,
        kv_cache_gib=1,
        reload_poll_seconds=0.2,
        flush_timeout_seconds=5.0,
        max_batches=1,
        generation_dtype="float32",  # the checks below compare vLLM's numbers with the trainer's float32 ones
    )
    return SearcherSettings(**(base | kw))


@pytest.fixture(scope="module")
def parts(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory):
    """One engine (and reference scorer) for every test here: engine start and warm-up cost a minute."""
    settings = settings_for(tiny_model, tmp_path_factory.mktemp("engine"))
    engine = Engine(settings, tiny_model, version=0, seed=0)
    scorer = Scorer(settings, make_task("arithmetic"), settings.searcher_id)
    engine.generate([encode_prompt(scorer.tokenizer, "1+1=")], engine.sampling_params(2, T, 4))  # warm-up
    yield engine, scorer
    engine.close()


def hf_model(path: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


def trainers_logprobs(model: Path, groups: list[ScoredGroup], pad_id: int) -> torch.Tensor:
    """The trainer's side: the samples' log-probs on a fresh float32 load of ``model``, the shared function."""
    prompts = [g.prompt_ids for g in groups for _ in g.samples]
    completions = [s.completion_ids for g in groups for s in g.samples]
    with torch.no_grad():
        return sequence_logprobs(hf_model(model), prompts, completions, T, pad_id)


def generate_batch(engine: Engine, scorer: Scorer, n: int = 4, temperature: float = T) -> GeneratedBatch:
    prompts = [task_prompt(text) for text in PROMPTS]
    ids = [encode_prompt(scorer.tokenizer, p.text) for p in prompts]
    completions = engine.generate(ids, engine.sampling_params(n, temperature, 12))
    return GeneratedBatch(prompts, ids, completions, engine.version)


def task_prompt(text: str) -> Prompt:
    a, b = text.rstrip("=").split("+")
    return Prompt(prompt_id=text, text=text, answer=str(int(a) + int(b)))


def hf_greedy(model, tokenizer, texts: list[str], max_new: int = 12) -> list[list[int]]:
    out = []
    with torch.inference_mode():
        for text in texts:
            ids = torch.tensor([encode_prompt(tokenizer, text)])
            gen = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new,
                do_sample=False,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
            )
            out.append(gen[0, ids.shape[1] :].tolist())
    return out


def vllm_greedy(engine: Engine, tokenizer, texts: list[str], max_new: int = 12) -> list[list[int]]:
    ids = [encode_prompt(tokenizer, t) for t in texts]
    return [g[0].token_ids for g in engine.generate(ids, engine.sampling_params(1, 0.0, max_new))]


def read_stream(redis_server) -> list[ScoredGroup]:
    entries = redis_server.client().xrange(Keys("t").trajectories)
    return [decode(f[STREAM_FIELD.encode()], ScoredGroup, vocab_size=92) for _id, f in entries]


def test_idle_engine_workers_sleep_instead_of_spinning(parts) -> None:
    engine, scorer = parts
    # The worker loaded the extension, which shortened vLLM's one-second busy loop (the engine core too:
    # the CPU-time check below covers it), and the engine core runs on the cores the worker leaves free.
    assert engine.llm.collective_rpc("spin_window") == [0.01]
    spare = set(spare_cpus())
    assert spare and all(os.sched_getaffinity(pid) == spare for pid in engine_core_pids(engine.llm))
    # And every engine process is quiet just after a batch, where vLLM's default has the workers spin
    # for a second: CPU time over the next 0.8 s.
    ids = [encode_prompt(scorer.tokenizer, t) for t in PROMPTS]
    greedy = engine.generate(ids, engine.sampling_params(1, 0.0, 12))  # greedy: leaves the sampler's RNG alone
    scorer.ref_logprobs(ids, [g[0].token_ids for g in greedy])
    time.sleep(0.1)
    # The engine's processes: those of this process group (the suite's background preparations lead their own).
    procs = {pid for pid in descendants(os.getpid()) if alive_in(os.getpgid(0), pid)}
    assert set(engine_core_pids(engine.llm)) <= procs
    before = {pid: cpu_seconds(pid) for pid in procs}
    time.sleep(0.8)
    used = {command_line(pid)[:60]: round(cpu_seconds(pid) - before[pid], 2) for pid in procs}
    assert sum(used.values()) < 0.3, used


def test_logprobs_equal_the_trainers_computation(parts, tiny_model: Path) -> None:
    engine, scorer = parts
    for _ in range(5):  # the random-weight model emits EOS now and then: draw until both endings occur
        groups = scorer.score(generate_batch(engine, scorer, n=8))
        reasons = [s.finish_reason for g in groups for s in g.samples]
        if "stop" in reasons and "length" in reasons:
            break
    assert len(groups) == len(PROMPTS) and all(len(g.samples) == 8 for g in groups)
    assert "stop" in reasons and "length" in reasons  # EOS-terminated completions are compared too
    expected = trainers_logprobs(tiny_model, groups, scorer.pad_id)
    ref = torch.tensor([s.ref_logprob_sum for g in groups for s in g.samples])
    behaviour = torch.tensor([s.logprob_sum for g in groups for s in g.samples])
    torch.testing.assert_close(ref, expected, atol=1e-4, rtol=1e-5)
    # At version 0 the policy is the reference: vLLM's tempered log-probs agree with the trainer's ...
    torch.testing.assert_close(behaviour, expected, atol=2e-3, rtol=1e-4)
    # ... which is why, while the engine serves the base weights, they are reused as the reference ones.
    batch = generate_batch(engine, scorer)
    batch.ref_is_policy = True
    reused = scorer.score(batch)
    assert all(s.ref_logprob_sum == s.logprob_sum for g in reused for s in g.samples)


def test_completions_rewards_and_envelope(parts) -> None:
    engine, scorer = parts
    groups = scorer.score(generate_batch(engine, scorer, n=8))
    tok = scorer.tokenizer
    reference = model_identity(scorer.settings.model)
    for g in groups:
        assert g.prompt_ids == encode_prompt(tok, g.prompt_text)
        assert g.policy_version == engine.version and g.searcher_id == "s-test" and g.task == "arithmetic"
        assert g.temperature == T and g.reference == reference  # the objective, checked by the buffer
        for s in g.samples:
            ends_with_eos = s.completion_ids[-1] == tok.eos_token_id
            assert s.finish_reason == ("stop" if ends_with_eos else "length")
            assert len(s.completion_ids) <= 12
            assert s.completion_text == tok.decode(s.completion_ids, skip_special_tokens=True)
            assert tok.eos_token not in s.completion_text
            answer = str(sum(int(x) for x in g.prompt_text.rstrip("=").split("+")))
            assert s.reward == (1.0 if s.completion_text.strip() == answer else 0.0)
    assert len({g.group_id for g in groups}) == len(groups)


def test_the_held_out_evaluation_reads_completions_where_the_searchers_end_them(parts, tiny_model: Path) -> None:
    """With the searchers' stop strings (TBA_STOP), the evaluation of `tba up` and `tba eval` reads exactly the
    texts, and so the rewards, that the searchers score: greedy vLLM with stops against the evaluation's decode."""
    from tba.model.evaluation import attempts, load_model

    engine, scorer = parts
    stop = ["h", "22"]  # the tiny model's greedy completions hit both (one spans two tokens), and not all do
    prompts = [task_prompt(text) for text in PROMPTS]
    ids = [encode_prompt(scorer.tokenizer, p.text) for p in prompts]
    completions = engine.generate(ids, engine.sampling_params(1, 0.0, 12, stop=stop))
    groups = scorer.score(GeneratedBatch(prompts, ids, completions, engine.version))
    searchers = {g.prompt_text: (g.samples[0].completion_text, g.samples[0].reward) for g in groups}
    assert {c[0].finish_reason for c in completions} == {"stop", "length"}

    model, tokenizer = load_model(tiny_model)
    texts, rewards = attempts(model, tokenizer, scorer.task, prompts, max_new_tokens=12, stop=stop)
    assert dict(zip(PROMPTS, zip(texts, rewards, strict=True), strict=True)) == searchers
    unstopped, _ = attempts(model, tokenizer, scorer.task, prompts, max_new_tokens=12)
    assert unstopped != texts  # without the stop strings the evaluation would read other texts


def test_completions_the_model_cannot_score_are_dropped_not_published(parts, caplog) -> None:
    """Token ids beyond the model's vocabulary (or the wire's int32) never leave the searcher; the rest do."""
    engine, scorer = parts
    batch = generate_batch(engine, scorer, n=2)
    first = batch.completions[0][0]
    batch.completions[0][0] = replace(first, token_ids=[*first.token_ids[:-1], scorer.vocab_size + 3])
    batch.completions[1][1] = replace(batch.completions[1][1], token_ids=[2**62])
    before = scorer.dropped
    with caplog.at_level("WARNING", logger="services.searcher.scorer"):
        groups = scorer.score(batch)
    assert scorer.dropped - before == 2
    assert f"token ids outside the vocabulary [0, {scorer.vocab_size})" in caplog.text
    kept = [s.completion_ids for g in groups for s in g.samples]
    assert len(kept) == 2 * len(PROMPTS) - 2
    assert all(max(ids) < scorer.vocab_size for ids in kept)


def test_per_token_logprobs_on_request(parts) -> None:
    engine, scorer = parts
    default = engine.settings
    engine.settings = default.model_copy(update={"per_token_logprobs": True})
    try:
        groups = scorer.score(generate_batch(engine, scorer, n=2))
    finally:
        engine.settings = default
    for s in (s for g in groups for s in g.samples):
        assert len(s.token_logprobs) == len(s.completion_ids)
        assert abs(sum(s.token_logprobs) - s.logprob_sum) < 1e-3
    assert all(s.token_logprobs is None for g in scorer.score(generate_batch(engine, scorer, n=2)) for s in g.samples)


class DigitTalk(MultiTurnTask):
    """A turn ends at its first digit; the environment answers the first turn with `` ok;`` and ends the
    episode at the second (reward 1). The random-weight model's turns end at a digit or its token budget."""

    name = "digit-talk"
    max_turns = 2
    max_episode_tokens = 40
    turn_stop = tuple("0123456789")

    def train_prompts(self, seed):
        return itertools.cycle([task_prompt(p) for p in PROMPTS])

    def eval_prompts(self, n):
        return [task_prompt(p) for p in PROMPTS[:n]]

    def start(self, prompt):
        return {"turns": 0}

    def step(self, prompt, state, turn):
        state["turns"] += 1
        return Step(observation=" ok;") if state["turns"] == 1 else Step(done=True, reward=1.0)

    def reward(self, prompt, completion):
        return 0.0


def run_to_the_end(settings: SearcherSettings, engine: Engine, task) -> dict:
    """A searcher of ``task`` on the shared engine, run through its batches; its last status."""
    searcher = Searcher(settings, engine, Scorer(settings, task, settings.searcher_id))
    try:
        assert searcher.run() == 0
        return searcher.status()
    finally:
        searcher.close()


def test_multi_turn_log_probs_sum_the_models_tokens_only(parts, redis_server, tmp_path, tiny_model) -> None:
    """Episodes through the whole searcher loop (a generate call per turn, the environment's answer in the
    context): the stream carries each trajectory with its environment span, and both log-probs, vLLM's
    behaviour sum and the reference pass's (forced here, at the base weights), equal the trainer's
    computation with the environment's tokens masked."""
    engine, _ = parts
    settings = settings_for(
        tiny_model, tmp_path, redis_server.url, prompts_per_batch=3, max_batches=2, ref_reuse_at_base=False
    )
    status = run_to_the_end(settings, engine, DigitTalk())
    samples = [(g.prompt_ids, s) for g in read_stream(redis_server) for s in g.samples]
    two_turns = [s for _, s in samples if s.env_spans]
    assert len(samples) == 24 and len(two_turns) >= 4, "too few episodes reached a second turn"
    ok = load_tokenizer(tiny_model)(" ok;", add_special_tokens=False)["input_ids"]
    for s in two_turns:
        ((start, end),) = s.env_spans
        assert s.completion_ids[start:end] == ok and s.reward == 1.0
    assert status["episodes"] == 24 and status["env_tokens"] == len(ok) * len(two_turns)
    assert status["episode_turns"] == len(samples) + len(two_turns) and status["episode_failures"] == {}
    prompts = [p for p, _ in samples]
    completions = [s.completion_ids for _, s in samples]
    scored = scored_flags([len(c) for c in completions], [s.env_spans for _, s in samples])
    with torch.no_grad():
        expected = sequence_logprobs(hf_model(tiny_model), prompts, completions, T, 0, scored)
        unmasked = sequence_logprobs(hf_model(tiny_model), prompts, completions, T, 0)
    ref = torch.tensor([s.ref_logprob_sum for _, s in samples])
    behaviour = torch.tensor([s.logprob_sum for _, s in samples])
    torch.testing.assert_close(ref, expected, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(behaviour, expected, atol=2e-3, rtol=1e-4)
    assert (unmasked - expected).abs().max() > 0.1  # the environment's tokens would have counted


def test_an_openenv_server_that_fails_ends_episodes_and_the_searcher_goes_on(parts, redis_server, tmp_path, tiny_model):
    """A server that answers some episodes, hangs on others and sends garbage to the rest: those episodes
    end (counted by what failed), the searcher runs all its batches, and only the answered episodes reach
    the stream, each a valid group."""
    from tests.integration.test_openenv import faulty

    engine, _ = parts
    proc, url = faulty()
    try:
        task = make_task("openenv", {"url": url, "timeout_s": 1.0, "max_turns": 2, "max_episode_tokens": 32})
        settings = settings_for(tiny_model, tmp_path, redis_server.url, prompts_per_batch=4, max_batches=2)
        status = run_to_the_end(settings, engine, task)
    finally:
        proc.kill()
        proc.wait()
    groups = read_stream(redis_server)  # decoded against the strict schema
    seeds = [int(g.prompt_id.removeprefix("seed-")) for g in groups]
    failed = status["episode_failures"].get("step", 0)
    assert status["batches"] == 2 and status["episodes"] == 2 * 4 * settings.completions_per_prompt
    assert failed > 0 and failed + sum(len(g.samples) for g in groups) == status["episodes"]
    assert groups and all(seed % 4 == 0 for seed in seeds)  # only the server's well-behaved seeds
    assert all(s.reward == 1.0 and not s.env_spans for g in groups for s in g.samples)


def test_a_verifiers_environment_runs_its_loop_in_the_searcher(
    parts, redis_server, tmp_path, tiny_model, monkeypatch
) -> None:
    """A verifiers ``Env`` with a loop of its own (tests/envs/vf_followup.py: a sum, then a follow-up) played by
    the real engine: its follow-up reaches the stream as each trajectory's environment span, the reward is the
    taskset's; the same environment broken after the first answer ends every episode, counted, and the searcher
    runs all its batches with nothing published."""
    from tba.model.tokenizer import CHARACTERS
    from tba.tasks.verifiers_env import VerifiersEnv

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "envs"))
    engine, _ = parts
    tokenizer = load_tokenizer(tiny_model)
    for env_args, published in (({}, True), ({"fail_at": 1}, False)):
        redis_server.client().flushall()
        # Every character ends a model turn: the untrained model's episodes all reach the follow-up.
        options = {"env": "vf-followup", "env_args": env_args, "turn_stop": list(CHARACTERS), "max_episode_tokens": 24}
        task = make_task("verifiers", options)
        assert isinstance(task, VerifiersEnv)
        settings = settings_for(
            tiny_model, tmp_path / str(published), redis_server.url, prompts_per_batch=3, max_batches=2
        )
        try:
            status = run_to_the_end(settings, engine, task)
        finally:
            task.close()
        episodes = 2 * 3 * settings.completions_per_prompt
        assert status["batches"] == 2 and status["episodes"] == episodes
        groups = read_stream(redis_server)
        if not published:
            assert not groups and status["episode_failures"] == {"step": episodes}
            continue
        assert status["episode_failures"] == {} and status["episode_turns"] == 2 * episodes
        assert sum(len(g.samples) for g in groups) == episodes
        for g in groups:
            (addend,) = task._tasks[g.prompt_id].data.addends
            for sample in g.samples:
                ((start, end),) = sample.env_spans
                assert tokenizer.decode(sample.completion_ids[start:end]) == f";+{addend}="
                assert sample.reward in (0.0, 0.5, 1.0)


def test_loop_publishes_scored_groups(parts, redis_server, tmp_path: Path, tiny_model: Path) -> None:
    engine, scorer = parts
    settings = settings_for(tiny_model, tmp_path, redis_server.url, max_batches=2, prompts_per_batch=3)
    searcher = Searcher(settings, engine, scorer)
    try:
        assert searcher.run() == 0
        status = searcher.status()
    finally:
        searcher.close()
    groups = read_stream(redis_server)
    assert len(groups) == 6 and all(len(g.samples) == 4 for g in groups)
    assert {g.searcher_id for g in groups} == {"s-test"} and {g.policy_version for g in groups} == {engine.version}
    assert len({g.group_id for g in groups}) == 6
    assert status["groups_published"] == 6 and status["samples_published"] == 24 and status["spilled"] == 0
    assert status["tokens_generated"] == sum(len(s.completion_ids) for g in groups for s in g.samples)
    # The engine still serves the base weights: the reference log-probs are the behaviour ones.
    assert all(s.ref_logprob_sum == s.logprob_sum for g in groups for s in g.samples)
    assert status["state"] == "stopped" and status["version"] == engine.version


def test_a_bfloat16_engine_samples_while_the_reference_stays_float32(redis_server, tmp_path, tiny_model) -> None:
    """Generation in bfloat16 (``auto`` on a CPU with bf16 arithmetic) changes which completions are drawn, not
    the numbers the loss reads: at the base weights its log-probs are not taken as the float32 reference's;
    the reference pass scores the samples as the trainer does."""
    settings = settings_for(tiny_model, tmp_path, redis_server.url, generation_dtype="bfloat16", prompts_per_batch=3)
    engine = Engine(settings, tiny_model, version=0, seed=0)
    try:
        assert engine.dtype == "bfloat16"
        scorer = Scorer(settings, make_task("arithmetic"), settings.searcher_id)
        searcher = Searcher(settings, engine, scorer)
        try:
            assert searcher.run() == 0
        finally:
            searcher.close()
    finally:
        engine.close()
    groups = read_stream(redis_server)
    assert len(groups) == 3 and all(len(g.samples) == 4 for g in groups)
    expected = trainers_logprobs(tiny_model, groups, scorer.pad_id)
    reference = torch.tensor([s.ref_logprob_sum for g in groups for s in g.samples])
    behaviour = torch.tensor([s.logprob_sum for g in groups for s in g.samples])
    torch.testing.assert_close(reference, expected, atol=1e-4, rtol=1e-5)
    error = (behaviour - expected).abs()
    assert error.max() > 2e-3, "bfloat16's log-probs should not be float32's"
    assert error.max() < 0.25, "but the same policy's"


def test_redis_down_spills_then_next_start_publishes_in_order(parts, redis_server, tmp_path, tiny_model) -> None:
    engine, scorer = parts
    settings = settings_for(tiny_model, tmp_path, redis_server.url, prompts_per_batch=3, flush_timeout_seconds=0.5)
    redis_server.stop(kill=True)
    searcher = Searcher(settings, engine, scorer)
    try:
        assert searcher.run() == 0  # nothing to publish to: the batch goes to disk, the loop still exits cleanly
        status = searcher.status()
        spilled = [decode(e.payload, ScoredGroup) for e in searcher.spill.peek(100)]
    finally:
        searcher.close()
    assert status["spilled"] == 3 and status["groups_published"] == 0 and status["redis_up"] == 0
    assert [g.prompt_id for g in spilled] and len(list((tmp_path / "spill").glob("*.msgpack"))) == 3

    redis_server.start()
    searcher = Searcher(settings, engine, scorer)  # the restarted searcher, same spill directory
    try:
        assert searcher.run() == 0
        status = searcher.status()
    finally:
        searcher.close()
    published = read_stream(redis_server)
    assert [g.group_id for g in published[:3]] == [g.group_id for g in spilled]  # the backlog first, in order
    assert len(published) == 6 and status["spilled"] == 0 and status["redis_up"] == 1
    assert not list((tmp_path / "spill").glob("*.msgpack"))


def test_hot_reload_serves_new_weights_and_stamps_the_version(parts, redis_server, tmp_path, tiny_model) -> None:
    engine, scorer = parts
    settings = settings_for(tiny_model, tmp_path, redis_server.url)
    store = CheckpointStore(settings.checkpoint_dir)
    tmp = store.new_tmp_dir()
    init_model(tmp, seed=123)  # different weights, same architecture and tokenizer
    new_model = hf_model(tmp)
    expected = hf_greedy(new_model, scorer.tokenizer, PROMPTS)
    assert vllm_greedy(engine, scorer.tokenizer, PROMPTS) != expected  # the old weights answer differently
    announce(redis_server.client(), Keys("t"), store.commit(tmp, version=1, step=1))

    searcher = Searcher(settings, engine, scorer)
    try:
        assert searcher.run() == 0
        status = searcher.status()
    finally:
        searcher.close()
    assert engine.version == 1 and status["version"] == 1 and status["reloads"] == 1
    assert status["reload_ms_last"] is not None and status["reload_ms_last"] > 0
    published = read_stream(redis_server)
    assert {g.policy_version for g in published} == {1}
    # Now policy != reference: the published reference log-probs are the trainer's computation on the base.
    with torch.no_grad():
        ref = sequence_logprobs(
            hf_model(tiny_model),
            [g.prompt_ids for g in published for _ in g.samples],
            [s.completion_ids for g in published for s in g.samples],
            T,
            scorer.pad_id,
        )
    torch.testing.assert_close(
        torch.tensor([s.ref_logprob_sum for g in published for s in g.samples]), ref, atol=1e-4, rtol=1e-5
    )
    assert vllm_greedy(engine, scorer.tokenizer, PROMPTS) == expected  # token for token, EOS included
    # The behaviour log-probs now come from the new weights: they match the trainer's computation on them.
    groups = scorer.score(generate_batch(engine, scorer))
    with torch.no_grad():
        on_new = sequence_logprobs(
            new_model,
            [g.prompt_ids for g in groups for _ in g.samples],
            [s.completion_ids for g in groups for s in g.samples],
            T,
            scorer.pad_id,
        )
    torch.testing.assert_close(
        torch.tensor([s.logprob_sum for g in groups for s in g.samples]), on_new, atol=2e-3, rtol=1e-4
    )


def test_refuses_a_corrupt_checkpoint_then_skips_to_the_newest(parts, redis_server, tmp_path, tiny_model) -> None:
    engine, scorer = parts
    start = engine.version
    settings = settings_for(tiny_model, tmp_path, redis_server.url)
    store = CheckpointStore(settings.checkpoint_dir)
    keys = Keys("t")
    client = redis_server.client()

    tmp = store.new_tmp_dir()
    init_model(tmp, seed=7)
    bad = store.commit(tmp, version=start + 1, step=start + 1)
    weights = store.step_dir(bad.version) / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # one flipped byte of weights: still a loadable file, but not what was published
    weights.write_bytes(bytes(data))
    announce(client, keys, bad)
    before = vllm_greedy(engine, scorer.tokenizer, PROMPTS)
    searcher = Searcher(settings, engine, scorer)
    try:
        assert searcher.run() == 0
        status = searcher.status()
    finally:
        searcher.close()
    assert engine.version == start and status["rejected_checkpoints"] == 1 and status["reloads"] == 0
    assert {g.policy_version for g in read_stream(redis_server)} == {start}
    assert vllm_greedy(engine, scorer.tokenizer, PROMPTS) == before  # weights untouched

    for v, seed in ((start + 2, 8), (start + 3, 9)):  # two arrive before the next batch
        tmp = store.new_tmp_dir()
        init_model(tmp, seed=seed)
        announce(client, keys, store.commit(tmp, version=v, step=v))
    searcher = Searcher(settings, engine, scorer)
    try:
        assert searcher.run() == 0
        status = searcher.status()
    finally:
        searcher.close()
    assert engine.version == start + 3 and status["reloads"] == 1
    assert hf_greedy(hf_model(store.step_dir(start + 3)), scorer.tokenizer, PROMPTS) == vllm_greedy(
        engine, scorer.tokenizer, PROMPTS
    )


def test_a_checkpoint_pruned_after_its_check_is_rejected_not_fatal(parts, redis_server, tmp_path, tiny_model) -> None:
    """Retention may delete a verified checkpoint before the reload reads it: the searcher keeps its weights."""
    engine, scorer = parts
    start = engine.version
    settings = settings_for(tiny_model, tmp_path, redis_server.url)
    store = CheckpointStore(settings.checkpoint_dir)
    tmp = store.new_tmp_dir()
    init_model(tmp, seed=11)
    manifest = store.commit(tmp, version=start + 1, step=start + 1)
    announce(redis_server.client(), Keys("t"), manifest)
    searcher = Searcher(settings, engine, scorer)
    try:
        searcher.watcher.poll_once()  # verified ...
        shutil.rmtree(store.step_dir(manifest.version))  # ... then pruned before the batch boundary
        assert searcher.run() == 0
        status = searcher.status()
    finally:
        searcher.close()
    assert engine.version == start and status["rejected_checkpoints"] == 1 and status["reloads"] == 0
    assert status["groups_published"] > 0 and {g.policy_version for g in read_stream(redis_server)} == {start}


def test_a_searcher_whose_own_checkpoint_is_deleted_too_keeps_its_weights_not_the_base(
    parts, redis_server, tmp_path, tiny_model
) -> None:
    """Both the checkpoint a searcher verified and the one it serves deleted behind its back (by hand: the trainer
    spares what a lease holds): the reload fails before the engine is asked, so the weights it served stay, and
    it goes on generating with them, never with the base model's."""
    engine, scorer = parts
    settings = settings_for(tiny_model, tmp_path, redis_server.url)
    store = CheckpointStore(settings.checkpoint_dir)
    v = engine.version + 1
    for version, seed in ((v, 13), (v + 1, 14)):
        tmp = store.new_tmp_dir()
        init_model(tmp, seed=seed)
        manifest = store.commit(tmp, version=version, step=version)
    engine.reload(store.step_dir(v), v)
    served = hf_greedy(hf_model(store.step_dir(v)), scorer.tokenizer, PROMPTS)
    announce(redis_server.client(), Keys("t"), manifest)
    searcher = Searcher(settings, engine, scorer)
    try:
        searcher.watcher.poll_once()  # v + 1 verified ...
        for version in (v, v + 1):  # ... then both deleted before the batch boundary
            shutil.rmtree(store.step_dir(version))
        assert searcher.run() == 0
        status = searcher.status()
    finally:
        searcher.close()
    assert engine.version == v and status["rejected_checkpoints"] == 1 and status["reload_failures"] == 1
    assert status["groups_published"] > 0 and {g.policy_version for g in read_stream(redis_server)} == {v}
    assert vllm_greedy(engine, scorer.tokenizer, PROMPTS) == served
    assert served != hf_greedy(hf_model(tiny_model), scorer.tokenizer, PROMPTS)  # not the base's answers


def test_reference_after_a_reload_is_the_trainers_computation_on_the_base(parts, tmp_path, tiny_model) -> None:
    engine, scorer = parts
    engine.reload(init_model(tmp_path / "policy", seed=321), engine.version + 1)
    batch = generate_batch(engine, scorer, n=8)
    assert not batch.ref_is_policy  # the policy is no longer the reference: the reference pass runs
    groups = scorer.score(batch)
    prompts = [g.prompt_ids for g in groups for _ in g.samples]
    completions = [s.completion_ids for g in groups for s in g.samples]
    # The same prompts with completions that end in EOS, as emitted ones do (whatever this batch drew).
    tok = scorer.tokenizer
    answers = [str(sum(int(x) for x in text.rstrip("=").split("+"))) for text in PROMPTS]
    eos_prompts = [encode_prompt(tok, text) for text in PROMPTS]
    eos_completions = [tok(a, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for a in answers]
    ref = [s.ref_logprob_sum for g in groups for s in g.samples] + scorer.ref_logprobs(eos_prompts, eos_completions)
    # The trainer's side: a fresh load of the reference (= base) model, the shared log-prob function.
    with torch.no_grad():
        expected = sequence_logprobs(
            hf_model(tiny_model), prompts + eos_prompts, completions + eos_completions, T, scorer.pad_id
        )
    torch.testing.assert_close(torch.tensor(ref), expected, atol=1e-4, rtol=1e-5)
    behaviour = torch.tensor([s.logprob_sum for g in groups for s in g.samples])
    assert (behaviour - expected[: len(behaviour)]).abs().max() > 0.1  # not the new policy's numbers
    # A pair asked for twice is scored once, and both get its value.
    scored = scorer.ref_pairs_scored
    again = scorer.ref_logprobs(eos_prompts + eos_prompts[:2], eos_completions + eos_completions[:2])
    assert scorer.ref_pairs_scored - scored == len(eos_prompts)
    assert again[-2:] == again[:2] and again[:2] == pytest.approx(ref[-len(eos_prompts) :][:2], abs=1e-4)


def test_with_the_reference_pass_on_the_trainer_the_trainer_computes_the_searchers_numbers(
    parts, tmp_path, tiny_model
) -> None:
    """TBA_REF_PASS=trainer: the searcher loads no reference model and publishes its samples without log pi_ref
    (the wire carries null), except at the base weights, where vLLM's own log-probs are the reference's; the
    trainer's pass over those samples gives what the searcher's pass gives."""
    from services.trainer.batching import Row, plan_micro_batches
    from services.trainer.learner import Learner
    from services.trainer.losses import make_loss
    from services.trainer.optim import LRSchedule, build_optimizer
    from services.trainer.reference import TrainerReference
    from tba.codec import encode

    engine, scorer = parts
    settings = settings_for(tiny_model, tmp_path, ref_pass="trainer")
    lean = Scorer(settings, make_task("arithmetic"), settings.searcher_id)
    assert lean.reference is None and lean.vocab_size == scorer.vocab_size
    batch = generate_batch(engine, scorer, n=8)
    groups, by_searcher = lean.score(batch), scorer.score(batch)
    assert [s.reward for g in groups for s in g.samples] == [s.reward for g in by_searcher for s in g.samples]
    assert all(s.ref_logprob_sum is None for g in groups for s in g.samples) and lean.ref_pairs_scored == 0
    wire = [decode(encode(g), ScoredGroup, vocab_size=lean.vocab_size) for g in groups]
    assert all(s.ref_logprob_sum is None for g in wire for s in g.samples)
    batch.ref_is_policy = True  # at the base weights the searcher still has the reference's numbers, for free
    assert all(s.ref_logprob_sum == s.logprob_sum for g in lean.score(batch) for s in g.samples)

    from transformers import AutoModelForCausalLM

    policy = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    reference = TrainerReference(policy, str(tiny_model), lora=False, device=torch.device("cpu"))
    learner = Learner(
        policy, *build_optimizer(policy, 1e-3, 0.0, LRSchedule()), make_loss("tb"),
        temperature=T, pad_id=lean.pad_id, token_budget=100_000, grad_clip=None, reference=reference,
    )  # fmt: skip
    rows = [Row(("arithmetic", g.prompt_id), tuple(g.prompt_ids), tuple(s.completion_ids), s.reward, None, 1, 0)
            for g in wire for s in g.samples]  # fmt: skip
    (mb,) = plan_micro_batches(rows, 100_000)
    searchers = {
        (tuple(g.prompt_ids), tuple(s.completion_ids)): s.ref_logprob_sum for g in by_searcher for s in g.samples
    }
    pairs = zip(map(tuple, mb.prompts), map(tuple, mb.completions), strict=True)
    torch.testing.assert_close(learner.log_ref(mb), torch.tensor([searchers[p] for p in pairs]), atol=1e-4, rtol=1e-5)


def test_a_paced_searcher_waits_for_a_newer_policy(parts, redis_server, tmp_path, tiny_model) -> None:
    """TBA_MAX_BATCHES_PER_VERSION=1: one batch per policy version, then a pause until a checkpoint lands."""
    import threading
    import time

    engine, scorer = parts
    start = engine.version
    settings = settings_for(
        tiny_model, tmp_path, redis_server.url, max_batches=3, max_batches_per_version=1, pace_max_wait_seconds=120
    )
    store = CheckpointStore(settings.checkpoint_dir)
    searcher = Searcher(settings, engine, scorer)

    def wait_for(cond, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            assert time.monotonic() < deadline, searcher.status()
            time.sleep(0.05)

    paused = "paused: waiting for a newer policy"
    thread = threading.Thread(target=searcher.run)
    thread.start()
    try:
        wait_for(lambda: searcher.state == paused)
        time.sleep(1.0)
        assert searcher.batches == 1 and searcher.status()["paced_seconds"] > 0
        assert searcher.ready()[0], "a paced searcher is still ready"
        tmp = store.new_tmp_dir()
        init_model(tmp, seed=7)
        announce(redis_server.client(), Keys("t"), store.commit(tmp, version=start + 1, step=start + 1))
        wait_for(lambda: searcher.batches == 2 and searcher.state == paused)
        assert engine.version == start + 1
    finally:
        searcher.request_stop()
        thread.join(60)
        searcher.close()
    assert sorted({g.policy_version for g in read_stream(redis_server)}) == [start, start + 1]


def test_a_searcher_paced_by_samples_ahead_waits_for_the_trainer_to_draw(
    parts, redis_server, tmp_path, tiny_model
) -> None:
    """TBA_MAX_SAMPLES_AHEAD: the searcher generates until the buffer holds that many samples nobody has drawn,
    pauses (still ready), and generates again once the buffer (its real ingest and sampler) serves a batch."""
    import asyncio
    import threading

    from services.buffer.ingest import Ingestor
    from services.buffer.sampler import Sampler
    from services.buffer.store import BufferStore
    from tba.redis_client import async_client
    from tba.schemas import SampleRequest, SearcherState
    from tba.settings import BufferSettings

    engine, scorer = parts
    settings = settings_for(
        tiny_model, tmp_path, redis_server.url, max_batches=3, max_samples_ahead=24, pace_max_wait_seconds=120
    )
    batch = settings.prompts_per_batch * settings.completions_per_prompt  # 24 samples: one batch ahead at most
    searcher = Searcher(settings, engine, scorer)
    thread = threading.Thread(target=searcher.run)

    async def buffer_side() -> None:
        client = async_client(redis_server.url)
        buffer = BufferSettings(redis_url=redis_server.url, namespace="t", consumer_name="c1", ingest_block_ms=10)
        store = BufferStore(client, buffer)
        ingest = Ingestor(client, store, buffer)
        await ingest.ensure_group()

        async def until(cond, timeout: float = 120.0) -> None:
            deadline = time.monotonic() + timeout
            while not cond():
                assert time.monotonic() < deadline, searcher.status()
                await ingest.step(block_ms=10)
                await asyncio.sleep(0.02)

        try:
            await until(lambda: searcher.state == SearcherState.PAUSED_FOR_TRAINER)
            generated = searcher.batches
            await until(lambda: searcher.status()["paced_seconds"] > 1.0)
            status = searcher.status()
            assert searcher.batches == generated and status["samples_ahead"] >= batch, status
            stats = await client.hgetall(store.stats_key)  # nothing drawn yet: the samples stored, as the warm-up
            assert status["samples_ahead"] == int(stats[b"samples_ingested"]) - int(stats.get(b"samples_duplicate", 0))
            assert searcher.ready()[0], "a paced searcher is still ready"
            request = SampleRequest(
                num_prompts=settings.prompts_per_batch,
                samples_per_prompt=settings.completions_per_prompt,
                trainer_version=engine.version,
                recency_prob=1.0,
                seed=0,
            )
            for _ in range(generated):  # the trainer draws what was generated: the searcher goes on
                await Sampler(store).sample(request)
            await until(lambda: searcher.batches > generated)
        finally:
            await client.aclose()

    thread.start()
    try:
        asyncio.run(buffer_side())
    finally:
        searcher.request_stop()
        thread.join(60)
        searcher.close()
