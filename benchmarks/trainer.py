"""Trainer benchmark: step throughput through the service against a bare PyTorch loop, and publish time.

1. Learner vs bare loop. The same pre-fetched batches (P=8 prompts x K=8 samples of the tiny model, drawn
   by the real buffer) go through (a) a bare PyTorch loop: pad, forward, tempered log-softmax, masked sums,
   VarGrad TB by index_add, backward, clip, AdamW; and (b) the service's compute path: batch validation,
   micro-batch planning, :class:`Learner`, metrics. Rounds alternate (a) and (b) so that load from other
   processes hits both alike.
2. The whole service loop: :class:`Trainer` in-process against a real `tba buffer` and redis-server that
   this benchmark starts, k=5 (so two checkpoint publishes per 10 steps are inside the timed span), draws
   seeded with ``sample_seed`` so that the bare loop replays exactly the same batches. Tokens/s of steps
   2..N from the metrics file, against the bare loop on those batches; runs alternate with the bare loop.
3. Checkpoint publish (HF save + trainer state + fsync + hash + rename + manifest + Redis announce + prune)
   for the tiny model and a ~100M-parameter model, against a durable bare save of the same bytes
   (``save_pretrained`` + ``torch.save`` of the optimizer + fsync).

One torch thread: the development machines share two cores between several processes, where OpenMP's
second thread mostly spins.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import Figure
from tba.ops import free_port

PART = "trainer"
P, K, POOL_PROMPTS, MAX_NEW = 8, 8, 32, 16
ROUNDS, BATCHES = 3, 6
LOOP_STEPS, LOOP_K, SEED0 = 11, 5, 1000
T, BETA, NS = 0.7, 0.05, "bench-trainer"
SPEC_100M = dict(hidden_size=768, num_layers=14, num_heads=12, intermediate_size=2048)



def _wait(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if cond():
                return
        except Exception:  # noqa: BLE001 (not up yet)
            pass
        time.sleep(0.1)
    raise RuntimeError(f"timed out waiting for {what}")


def _start_services(work: Path) -> tuple[list[subprocess.Popen], str, str]:
    """redis-server and `tba buffer` on free ports; returns the processes, the Redis URL, the buffer URL."""
    import httpx
    import redis

    rport, bport = free_port(), free_port()
    (work / "redis").mkdir(parents=True)
    procs = [subprocess.Popen(["redis-server", "--port", str(rport), "--bind", "127.0.0.1", "--dir",
                               str(work / "redis"), "--save", "", "--appendonly", "no"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    redis_url = f"redis://127.0.0.1:{rport}/0"
    _wait(lambda: redis.Redis.from_url(redis_url).ping(), 10, "redis-server")
    env = {**os.environ, "TBA_REDIS_URL": redis_url, "TBA_NAMESPACE": NS, "TBA_LOG_LEVEL": "WARNING"}
    procs.append(subprocess.Popen([sys.executable, "-m", "tba.cli", "buffer", "--port", str(bport)], env=env,
                                  stdout=subprocess.DEVNULL, stderr=(work / "buffer.log").open("w")))
    buffer_url = f"http://127.0.0.1:{bport}"
    _wait(lambda: httpx.get(f"{buffer_url}/readyz", timeout=1).status_code == 200, 60, "the buffer")
    return procs, redis_url, buffer_url


def _fill_buffer(model_dir: Path, redis_url: str, buffer_url: str) -> int:
    """Completions of the tiny model for POOL_PROMPTS arithmetic prompts, scored, with reference log-probs."""
    import httpx
    import redis
    import torch
    from transformers import AutoModelForCausalLM

    from tba.codec import encode
    from tba.keys import STREAM_FIELD, Keys
    from tba.model.logprobs import sequence_logprobs
    from tba.model.tokenizer import encode_prompt, load_tokenizer
    from tba.schemas import ScoredGroup, ScoredSample
    from tba.tasks import make_task

    tok = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    task = make_task("arithmetic", {"digits": 3})
    client = redis.Redis.from_url(redis_url)
    prompts = iter(task.train_prompts(seed=1))
    seen: set[str] = set()
    while len(seen) < POOL_PROMPTS:
        p = next(prompts)
        if p.prompt_id in seen:
            continue
        seen.add(p.prompt_id)
        ids = encode_prompt(tok, p.text)
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), do_sample=True, temperature=T, top_k=0, max_new_tokens=MAX_NEW,
                                 num_return_sequences=K, pad_token_id=tok.pad_token_id)
            comps = [c[: c.index(tok.eos_token_id) + 1] if tok.eos_token_id in c else c
                     for c in out[:, len(ids):].tolist()]
            ref = sequence_logprobs(model, [ids] * K, comps, T, tok.pad_token_id).tolist()
        texts = [tok.decode(c, skip_special_tokens=True) for c in comps]
        group = ScoredGroup(prompt_id=p.prompt_id, prompt_text=p.text, prompt_ids=ids, task="arithmetic",
                            policy_version=0, searcher_id="bench", samples=[
                                ScoredSample(completion_ids=c, completion_text=t, reward=task.reward(p, t),
                                             logprob_sum=r, ref_logprob_sum=r)
                                for c, t, r in zip(comps, texts, ref, strict=True)])
        client.xadd(Keys(NS).trajectories, {STREAM_FIELD: encode(group)})
    _wait(lambda: httpx.get(f"{buffer_url}/v1/stats").json()["groups_stored"] >= POOL_PROMPTS, 60, "ingest")
    return int(httpx.get(f"{buffer_url}/v1/stats").json()["samples"])


def _fetch(buffer_url: str, seeds: list[int]) -> list:
    from services.trainer.client import BufferClient
    from tba.schemas import SampleRequest

    client = BufferClient(buffer_url)
    try:
        return [client.sample(SampleRequest(num_prompts=P, samples_per_prompt=K, recency_prob=0.5,
                                            trainer_version=i, recent_versions=LOOP_K, seed=seed))
                for i, seed in enumerate(seeds)]
    finally:
        client.close()


class BareLoop:
    """The TB step written as plainly as possible: the baseline the service is measured against."""

    def __init__(self, model_dir: Path, pad_id: int) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-5)
        self.pad_id = pad_id

    def step(self, batch) -> int:
        torch = self.torch
        seqs, starts, index = [], [], []
        log_ref, reward = [], []
        for g, group in enumerate(batch.groups):
            for s in group.samples:
                seqs.append(group.prompt_ids + s.completion_ids)
                starts.append(len(group.prompt_ids))
                index.append(g)
                log_ref.append(s.ref_logprob_sum)
                reward.append(s.reward)
        L = max(map(len, seqs))
        ids = torch.full((len(seqs), L), self.pad_id)
        attn = torch.zeros((len(seqs), L), dtype=torch.long)
        comp = torch.zeros((len(seqs), L), dtype=torch.bool)
        for i, (s, st) in enumerate(zip(seqs, starts, strict=True)):
            ids[i, : len(s)] = torch.tensor(s)
            attn[i, : len(s)] = 1
            comp[i, st: len(s)] = True
        self.opt.zero_grad()
        logits = self.model(input_ids=ids, attention_mask=attn).logits[:, :-1]
        tok = torch.log_softmax(logits / T, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        log_pi = (tok * comp[:, 1:]).sum(-1)
        idx = torch.tensor(index)
        target = torch.tensor(log_ref) + torch.tensor(reward) / BETA
        G = len(batch.groups)
        log_Z = torch.zeros(G).index_add_(0, idx, (target - log_pi).detach()) / torch.bincount(idx, minlength=G)
        loss = ((log_Z[idx] + log_pi - target) ** 2).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        return int(attn.sum())


def _service_learner(model_dir: Path, pad_id: int):
    import torch
    from transformers import AutoModelForCausalLM

    from services.trainer.learner import Learner
    from services.trainer.losses import make_loss
    from services.trainer.optim import LRSchedule, build_optimizer

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    opt, sched = build_optimizer(model, 1e-5, 0.0, LRSchedule())
    return Learner(model, opt, sched, make_loss("tb"), temperature=T, pad_id=pad_id, token_budget=16384,
                   grad_clip=1.0)


def learner_vs_bare(model_dir: Path, batches: list, pad_id: int) -> list[Figure]:
    from services.trainer.batching import rows_from_batch
    from services.trainer.metrics import TrainerMetrics

    bare, learner, metrics = BareLoop(model_dir, pad_id), _service_learner(model_dir, pad_id), TrainerMetrics()
    vocab, max_len = learner.model.config.vocab_size, learner.model.config.max_position_embeddings
    times = {"bare": 0.0, "service": 0.0}
    tokens = {"bare": 0, "service": 0}
    bare.step(batches[0])  # warm both up (first-call allocations)
    learner.step(rows_from_batch(batches[0], vocab, max_len)[0], BETA)
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        for b in batches:
            tokens["bare"] += bare.step(b)
        times["bare"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        for i, b in enumerate(batches):
            rows, _ = rows_from_batch(b, vocab, max_len)
            result = learner.step(rows, BETA)
            metrics.record(i + 1, BETA, result, 0.0)
            tokens["service"] += result.tokens
        times["service"] += time.perf_counter() - t0
    assert tokens["bare"] == tokens["service"], "both arms must see the same tokens"
    ours, base = tokens["service"] / times["service"], tokens["bare"] / times["bare"]
    return [Figure(PART, f"learner step tokens/s (P={P}, K={K}, tiny model) vs bare PyTorch loop", ours, "tokens/s",
                   base, ">= 0.9")]


def _loop_settings(model_dir: Path, work: Path, redis_url: str, buffer_url: str, run: int):
    from tba.settings import TrainerSettings

    return TrainerSettings(
        redis_url=redis_url, namespace=NS, buffer_url=buffer_url, model=model_dir, checkpoint_dir=work / f"ckpt{run}",
        prompts_per_step=P, samples_per_prompt=K, recency_prob=0.5, recent_versions=LOOP_K, warmup_samples=0,
        checkpoint_every=LOOP_K, max_steps=LOOP_STEPS, sample_seed=SEED0, lr=1e-5, torch_threads=1,
        metrics_file=work / f"metrics{run}.jsonl", checkpoint_grace_seconds=0.0)


def service_loop(model_dir: Path, work: Path, redis_url: str, buffer_url: str, pad_id: int) -> list[Figure]:
    """Whole trainer runs alternating with the bare loop on the very batches those runs draw."""
    from services.trainer.loop import Trainer

    batches = _fetch(buffer_url, [SEED0 + i for i in range(LOOP_STEPS)])[1:]
    times = {"bare": 0.0, "service": 0.0}
    tokens = {"bare": 0, "service": 0}
    for run in range(ROUNDS):
        bare = BareLoop(model_dir, pad_id)
        bare.step(batches[0])
        t0 = time.perf_counter()
        tokens["bare"] += sum(bare.step(b) for b in batches)
        times["bare"] += time.perf_counter() - t0
        settings = _loop_settings(model_dir, work, redis_url, buffer_url, run)
        assert Trainer(settings).run() == 0
        rows = [json.loads(x) for x in settings.metrics_file.read_text().splitlines()]
        times["service"] += rows[-1]["ts"] - rows[0]["ts"]  # steps 2..N, their fetches and publishes
        tokens["service"] += sum(r["tokens"] for r in rows[1:])
    assert tokens["bare"] == tokens["service"], "the seeded draws must replay the same batches"
    ours, base = tokens["service"] / times["service"], tokens["bare"] / times["bare"]
    return [Figure(PART, f"service loop tokens/s (HTTP sample, step, metrics, publish every {LOOP_K}) vs bare",
                   ours, "tokens/s", base, ">= 0.9")]


def _durable_bare_save(model, opt, out: Path) -> None:
    """The same bytes made durable without the protocol: save_pretrained + optimizer state + fsync."""
    import torch

    model.save_pretrained(out)
    torch.save(opt.state_dict(), out / "optimizer.pt")
    for f in out.iterdir():
        fd = os.open(f, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)


def publish_time(work: Path, redis_url: str, name: str, spec, repeats: int) -> list[Figure]:
    import redis
    import torch
    from transformers import AutoModelForCausalLM

    from services.trainer.checkpoints import Announcer, TrainerState, save_checkpoint
    from services.trainer.optim import LRSchedule, build_optimizer
    from tba.checkpoints import CheckpointStore
    from tba.keys import Keys
    from tba.model.tiny import TinyModelSpec, init_model
    from tba.model.tokenizer import load_tokenizer

    model_dir = init_model(work / f"model-{name}", TinyModelSpec(**spec), seed=0)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    params = sum(p.numel() for p in model.parameters())
    tok = load_tokenizer(model_dir)
    opt, sched = build_optimizer(model, 1e-5, 0.0, LRSchedule())
    model(input_ids=torch.tensor([[1, 5, 6, 7]])).logits.sum().backward()  # one step: Adam moments exist
    opt.step()
    store = CheckpointStore(work / f"ckpt-{name}")
    announcer = Announcer(redis.Redis.from_url(redis_url), Keys(NS))
    ours, bare = [], []
    for step in range(1, repeats + 1):
        out = work / f"bare-{name}-{step}"
        t0 = time.perf_counter()
        _durable_bare_save(model, opt, out)
        bare.append(time.perf_counter() - t0)
        shutil.rmtree(out)
        t0 = time.perf_counter()
        manifest = save_checkpoint(store, model, tok, opt, sched, TrainerState(step=step, beta=BETA))
        announcer.announce(manifest)
        store.prune(keep=1, grace_seconds=0.0)
        ours.append(time.perf_counter() - t0)
    weights_mb = sum(f.stat().st_size for f in store.resolve(manifest).iterdir() if f.is_file()) / 2**20
    shutil.rmtree(store.root)
    return [Figure(PART, f"checkpoint publish, {name} ({params / 1e6:.1f}M params, {weights_mb:.0f} MB weights "
                         "+ optimizer) vs durable bare save", statistics.median(ours), "s", statistics.median(bare),
                   "same bytes fsync'd; ours adds hash+rename+manifest+announce")]


def main() -> list[Figure]:
    import torch

    from tba.model.tiny import init_model
    from tba.model.tokenizer import load_tokenizer

    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="tba-bench-trainer-"))
    procs: list[subprocess.Popen] = []
    try:
        model_dir = init_model(work / "tiny", seed=0)
        pad_id = load_tokenizer(model_dir).pad_token_id
        procs, redis_url, buffer_url = _start_services(work)
        stored = _fill_buffer(model_dir, redis_url, buffer_url)
        print(f"[bench] trainer: buffer holds {stored} samples of {POOL_PROMPTS} prompts", flush=True)
        figures = learner_vs_bare(model_dir, _fetch(buffer_url, list(range(BATCHES))), pad_id)
        figures += service_loop(model_dir, work, redis_url, buffer_url, pad_id)
        figures += publish_time(work, redis_url, "tiny", {}, repeats=5)
        figures += publish_time(work, redis_url, "100M", SPEC_100M, repeats=3)
        return figures
    finally:
        for p in reversed(procs):
            p.terminate()
            p.wait(30)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    from benchmarks import format_table

    print(format_table(main()))
