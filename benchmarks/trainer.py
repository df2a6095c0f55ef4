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
   (``save_pretrained`` + ``torch.save`` of the optimizer + fsync); and the weights-only publish (the
   optimizer file linked, nothing fsynced) against that full one.
4. ``--model M`` (``python -m benchmarks.run --model M trainer``): 1 and 3 at a pretrained model
   (:func:`model_figures`). Batches are the model's own samples (HF ``generate``, T=0.7, top_k=0, up to 64
   new tokens, K=8, cut after EOS) of chat-form arithmetic prompts through its chat template, pushed
   through the real buffer and drawn by ``POST /v1/sample`` as in 1, P=4. The publish figure uses the
   model's directory, and a second figure gives the checkpoint's size (weights + optimizer state). The
   service loop (2) is skipped: at this size a step takes tens of seconds here. ``--quick``: one batch,
   one round, one publish: a smoke run whose figures mean nothing.
5. The learner-vs-bare comparison on another machine (a GPU host with torch, transformers, pydantic and
   prometheus_client, but no Redis, buffer or vLLM):

   - here: ``python -m benchmarks.trainer --model DIR --save-batches FILE [--prompts 32] [--count 4]``
     samples the model (a pool of max(prompts, 8) prompts), draws ``count`` batches of ``prompts`` x 8
     through the real buffer and writes them as JSON (``SampledBatch.model_dump(mode="json")``). The
     batch size is chosen here: 32 prompts x 8 samples keeps a GPU busier than the CPU runs' 4 x 8. A
     batch holds distinct prompts; with a pool no larger than the batch every batch holds the same
     prompts (and, where a prompt has 8 distinct samples stored, the same samples): the same work per step;
   - there: ``python -m benchmarks.trainer --model DIR --batches FILE --device cuda --dtype bfloat16
     [--rounds 3] [--token-budget 16384]`` runs only 1, both arms on that device with fp32 master weights
     and the forward under ``torch.autocast`` in ``--dtype`` (the Learner's ``compute_dtype``); timers are
     read after ``torch.cuda.synchronize()``. The Learner splits a batch into micro-batches of at most
     ``--token-budget`` padded tokens (the trainer's setting), the bare loop does one forward per batch.
     Only this path's imports load there: Redis, httpx, FastAPI and vLLM are imported inside the functions
     that need them.

One torch thread on the CPU: the development machines share two cores between several processes, where
OpenMP's second thread mostly spins.
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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks import Figure
from tba.health import free_port
from tba.local.commands import tba_command

PART = "trainer"
P, K, POOL_PROMPTS, MAX_NEW = 8, 8, 32, 16
ROUNDS, BATCHES = 3, 6
LOOP_STEPS, LOOP_K, SEED0 = 11, 5, 1000
T, BETA, NS = 0.7, 0.05, "bench-trainer"
SPEC_100M = dict(hidden_size=768, num_layers=14, num_heads=12, intermediate_size=2048)
# --model, 135M parameters on one thread: a prompt's 8 samples take ~12 s to generate, a bare step on
# 4 x 8 sequences ~60 s, the Learner's ~15 s (measured with other work on the machine). 2 rounds of 2 batches
# and a pool of 8 prompts keep the part near 9 minutes.
MODEL_P, MODEL_POOL, MODEL_MAX_NEW = 4, 8, 64
MODEL_ROUNDS, MODEL_BATCHES, MODEL_PUBLISHES = 2, 2, 3
SAVE_PROMPTS, SAVE_COUNT = 32, 4  # --save-batches: batches sized for a GPU


def settings(model: Path | None = None, quick: bool = False) -> dict[str, Any]:
    """What the part runs with, for its record (:func:`model_figures` takes its counts from here)."""
    common = {"samples_per_prompt": K, "temperature": T, "beta": BETA, "torch_threads": 1}
    if model is None:
        return common | {
            "prompts": P,
            "pool_prompts": POOL_PROMPTS,
            "max_new_tokens": MAX_NEW,
            "repeats": ROUNDS,
            "batches": BATCHES,
            "service_loop_steps": LOOP_STEPS,
            "publish_every": LOOP_K,
            "publish_repeats": {"tiny": 5, "100M": 3},
            "spec_100m": SPEC_100M,
        }
    return common | {
        "prompts": MODEL_P,
        "pool_prompts": MODEL_P if quick else MODEL_POOL,
        "max_new_tokens": MODEL_MAX_NEW,
        "repeats": 1 if quick else MODEL_ROUNDS,
        "batches": 1 if quick else MODEL_BATCHES,
        "publish_repeats": 1 if quick else MODEL_PUBLISHES,
        "chat_template": "on",
    }


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


@contextmanager
def _services(work: Path) -> Iterator[tuple[str, str]]:
    """redis-server and `tba buffer` on free ports, both stopped on leaving; yields the Redis URL, the buffer URL."""
    import httpx

    from tba.redis_server import RedisServer

    with RedisServer(work / "redis", appendonly=False) as redis:
        bport = free_port()
        env = {**os.environ, "TBA_REDIS_URL": redis.url, "TBA_NAMESPACE": NS, "TBA_LOG_LEVEL": "WARNING"}
        buffer = subprocess.Popen(
            tba_command("buffer", "--port", str(bport)),
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=(work / "buffer.log").open("w"),
        )
        try:
            buffer_url = f"http://127.0.0.1:{bport}"
            _wait(lambda: httpx.get(f"{buffer_url}/readyz", timeout=1).status_code == 200, 60, "the buffer")
            yield redis.url, buffer_url
        finally:
            buffer.terminate()
            buffer.wait(30)


def _fill_buffer(
    model_dir: Path,
    redis_url: str,
    buffer_url: str,
    task=None,
    prompt_format=None,
    pool: int = POOL_PROMPTS,
    max_new: int = MAX_NEW,
) -> int:
    """Completions of the model for ``pool`` prompts of ``task`` (default: 3-digit arithmetic, plain prompts),
    K per prompt, scored, with reference log-probs (the policy is the reference here), through the buffer's
    stream as a searcher publishes them."""
    import httpx
    import torch
    from transformers import AutoModelForCausalLM

    from tba.checkpoints import model_identity
    from tba.codec import encode
    from tba.keys import STREAM_FIELD, Keys
    from tba.model.logprobs import sequence_logprobs
    from tba.model.tokenizer import PLAIN, load_tokenizer
    from tba.redis_client import sync_client
    from tba.schemas import ScoredGroup, ScoredSample
    from tba.tasks import make_task

    tok = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    task = task if task is not None else make_task("arithmetic", {"digits": 3})
    prompt_format = prompt_format if prompt_format is not None else PLAIN
    client = sync_client(redis_url)
    prompts = iter(task.train_prompts(seed=1))
    seen: set[str] = set()
    while len(seen) < pool:
        p = next(prompts)
        if p.prompt_id in seen:
            continue
        seen.add(p.prompt_id)
        ids = prompt_format.encode(tok, p.text)
        with torch.no_grad():
            out = model.generate(
                torch.tensor([ids]),
                do_sample=True,
                temperature=T,
                top_k=0,
                max_new_tokens=max_new,
                num_return_sequences=K,
                pad_token_id=tok.pad_token_id,
            )
            comps = [
                c[: c.index(tok.eos_token_id) + 1] if tok.eos_token_id in c else c for c in out[:, len(ids) :].tolist()
            ]
            ref = sequence_logprobs(model, [ids] * K, comps, T, tok.pad_token_id).tolist()
        texts = [tok.decode(c, skip_special_tokens=True) for c in comps]
        group = ScoredGroup(
            prompt_id=p.prompt_id,
            prompt_text=p.text,
            prompt_ids=ids,
            task="arithmetic",
            policy_version=0,
            searcher_id="bench",
            samples=[
                ScoredSample(
                    completion_ids=c, completion_text=t, reward=task.reward(p, t), logprob_sum=r, ref_logprob_sum=r
                )
                for c, t, r in zip(comps, texts, ref, strict=True)
            ],
            temperature=T,
            reference=model_identity(model_dir),
        )
        client.xadd(Keys(NS).trajectories, {STREAM_FIELD: encode(group)})
    _wait(lambda: httpx.get(f"{buffer_url}/v1/stats").json()["groups_stored"] >= pool, 60, "ingest")
    return int(httpx.get(f"{buffer_url}/v1/stats").json()["samples"])


def _fetch(buffer_url: str, seeds: list[int], num_prompts: int = P) -> list:
    from services.trainer.client import BufferClient
    from tba.schemas import SampleRequest

    client = BufferClient(buffer_url)
    try:
        return [
            client.sample(
                SampleRequest(
                    num_prompts=num_prompts,
                    samples_per_prompt=K,
                    recency_prob=0.5,
                    trainer_version=i,
                    recent_versions=LOOP_K,
                    seed=seed,
                )
            )
            for i, seed in enumerate(seeds)
        ]
    finally:
        client.close()


class BareLoop:
    """The TB step written as plainly as possible: the baseline the service is measured against.

    On the device of ``model`` (fp32 master weights; a peft model trains its adapters only);
    ``compute_dtype`` bfloat16/float16 runs the forward under ``torch.autocast``, as the service's
    Learner does with the same setting."""

    def __init__(self, model, pad_id: int, compute_dtype: str = "float32") -> None:
        import torch

        self.torch = torch
        self.model = model
        self.device = next(model.parameters()).device
        self.opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
        self.pad_id = pad_id
        self.compute_dtype = compute_dtype

    def step(self, batch) -> int:
        from services.trainer.learner import autocast

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
            comp[i, st : len(s)] = True
        ids, attn, comp = ids.to(self.device), attn.to(self.device), comp.to(self.device)
        self.opt.zero_grad()
        with autocast(self.device, self.compute_dtype):
            logits = self.model(input_ids=ids, attention_mask=attn).logits[:, :-1]
        tok = torch.log_softmax(logits.float() / T, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        log_pi = (tok * comp[:, 1:]).sum(-1)
        idx = torch.tensor(index, device=self.device)
        target = (torch.tensor(log_ref) + torch.tensor(reward) / BETA).to(self.device)
        G = len(batch.groups)
        log_Z = torch.zeros(G, device=self.device).index_add_(0, idx, (target - log_pi).detach()) / torch.bincount(
            idx, minlength=G
        )
        loss = ((log_Z[idx] + log_pi - target) ** 2).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        return int(attn.sum())


def load_model(model_dir: Path, device: str = "cpu"):
    """The model at ``model_dir`` with fp32 weights on ``device``, as the Trainer loads it."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).to(device)


def service_learner(model, pad_id: int, compute_dtype: str = "float32", token_budget: int = 16384):
    """The service's Learner as the Trainer builds it around ``model`` (fp32 weights, ``compute_dtype``
    autocast)."""
    from services.trainer.learner import Learner
    from services.trainer.losses import make_loss
    from services.trainer.optim import LRSchedule, build_optimizer

    opt, sched = build_optimizer(model, 1e-5, 0.0, LRSchedule())
    return Learner(
        model,
        opt,
        sched,
        make_loss("tb"),
        temperature=T,
        pad_id=pad_id,
        token_budget=token_budget,
        grad_clip=1.0,
        compute_dtype=compute_dtype,
    )


def synchronize(device: str) -> None:
    """Wait for the device's queued work (CUDA runs asynchronously) before a timer is read."""
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def learner_vs_bare(
    model_dir: Path | Callable[[], Any],
    batches: list,
    pad_id: int,
    label: str = "tiny model",
    rounds: int = ROUNDS,
    device: str = "cpu",
    compute_dtype: str = "float32",
    token_budget: int = 16384,
) -> list[Figure]:
    """The figure of :func:`compare_learner`: our tokens/s against the bare loop's on the same batches."""
    result = compare_learner(model_dir, batches, pad_id, rounds, device, compute_dtype, token_budget)
    p, k = len(batches[0].groups), len(batches[0].groups[0].samples)
    return [
        Figure(
            PART,
            f"learner step tokens/s (P={p}, K={k}, {label}) vs bare PyTorch loop",
            result["service"]["tokens_per_s"],
            "tokens/s",
            result["bare"]["tokens_per_s"],
            ">= 0.9",
        )
    ]


def compare_learner(
    model_dir: Path | Callable[[], Any],
    batches: list,
    pad_id: int,
    rounds: int = ROUNDS,
    device: str = "cpu",
    compute_dtype: str = "float32",
    token_budget: int = 16384,
    wrap: Callable[[Any], Any] | None = None,
) -> dict[str, dict[str, float]]:
    """Per arm (``bare``, ``service``): tokens/s over ``rounds`` alternating passes over ``batches``, and on a
    CUDA device the step's peak memory in GB (the arm's weights and optimizer state plus what its step
    allocates on top). ``model_dir``: a model directory, or a function that builds the same fresh model on
    ``device`` each call (random weights from a config); ``wrap``: applied to each arm's model (LoRA)."""
    import torch

    from services.trainer.batching import rows_from_batch
    from services.trainer.metrics import TrainerMetrics

    def build():
        model = load_model(model_dir, device) if isinstance(model_dir, Path) else model_dir()
        return wrap(model) if wrap is not None else model

    bare = BareLoop(build(), pad_id, compute_dtype)
    learner = service_learner(build(), pad_id, compute_dtype, token_budget)
    metrics = TrainerMetrics()
    vocab, max_len = learner.model.config.vocab_size, learner.model.config.max_position_embeddings

    def service_step(batch) -> int:
        """What the Trainer does with a fetched batch: validate it into rows, step, record the metrics."""
        rows, _ = rows_from_batch(batch, vocab, max_len)
        result = learner.step(rows, BETA)
        metrics.record(learner.scheduler.last_epoch, BETA, result, 0.0)
        return result.tokens

    out = {
        arm: {"tokens_per_s": rate}
        for arm, rate in alternate({"bare": bare.step, "service": service_step}, batches, rounds, device).items()
    }
    if torch.device(device).type == "cuda":
        for model in (bare.model, learner.model):
            model.zero_grad(set_to_none=True)  # so that what is resident before a step is the two arms' state
        out["bare"]["peak_gb"] = _peak_gb(bare.model, bare.opt, lambda: bare.step(batches[0]))
        rows = rows_from_batch(batches[0], vocab, max_len)[0]
        out["service"]["peak_gb"] = _peak_gb(learner.model, learner.optimizer, lambda: learner.step(rows, BETA))
    return out


def alternate(
    arms: dict[str, Callable[[Any], int]], batches: list, rounds: int, device: str = "cpu"
) -> dict[str, float]:
    """Tokens/s of each arm (a step function returning the tokens it trained on) over ``rounds`` passes over
    ``batches``, the arms taking turns each round so that other load on the machine hits them alike; one
    warm-up step each first (first-call allocations, kernel selection), not counted. Every arm must report
    the same tokens: they do the same work."""
    for step in arms.values():
        step(batches[0])
    times = dict.fromkeys(arms, 0.0)
    tokens = dict.fromkeys(arms, 0)
    for _ in range(rounds):
        for arm, step in arms.items():
            synchronize(device)
            t0 = time.perf_counter()
            for b in batches:
                tokens[arm] += step(b)
            synchronize(device)
            times[arm] += time.perf_counter() - t0
    assert len(set(tokens.values())) == 1, f"the arms must see the same tokens: {tokens}"
    return {arm: tokens[arm] / times[arm] for arm in arms}


def _state_bytes(model, optimizer) -> int:
    """Bytes of the weights and the optimizer's state that a trainer keeps between steps."""
    tensors = list(model.parameters())
    tensors += [v for s in optimizer.state.values() for v in s.values() if hasattr(v, "nbytes")]
    return sum(t.numel() * t.element_size() for t in tensors)


def _peak_gb(model, optimizer, step: Callable[[], Any]) -> float:
    """One step's peak GPU memory as if this arm were alone on the device: its resident state plus the most
    the step allocated on top of everything resident before it (gradients, activations, workspaces)."""
    import torch

    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return (_state_bytes(model, optimizer) + torch.cuda.max_memory_allocated() - before) / 2**30


def _loop_settings(model_dir: Path, work: Path, redis_url: str, buffer_url: str, run: int):
    from tba.settings import TrainerSettings

    return TrainerSettings(
        redis_url=redis_url,
        namespace=NS,
        buffer_url=buffer_url,
        model=model_dir,
        checkpoint_dir=work / f"ckpt{run}",
        prompts_per_step=P,
        train_samples_per_prompt=K,
        recency_prob=0.5,
        recent_versions=LOOP_K,
        warmup_samples=0,
        checkpoint_every=LOOP_K,
        max_steps=LOOP_STEPS,
        sample_seed=SEED0,
        lr=1e-5,
        torch_threads=1,
        metrics_file=work / f"metrics{run}.jsonl",
        checkpoint_grace_seconds=0.0,
    )


def service_loop(model_dir: Path, work: Path, redis_url: str, buffer_url: str, pad_id: int) -> list[Figure]:
    """Whole trainer runs alternating with the bare loop on the very batches those runs draw."""
    from services.trainer.loop import Trainer

    batches = _fetch(buffer_url, [SEED0 + i for i in range(LOOP_STEPS)])[1:]
    times = {"bare": 0.0, "service": 0.0}
    tokens = {"bare": 0, "service": 0}
    for run in range(ROUNDS):
        bare = BareLoop(load_model(model_dir), pad_id)
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
    return [
        Figure(
            PART,
            f"service loop tokens/s (HTTP sample, step, metrics, publish every {LOOP_K}) vs bare",
            ours,
            "tokens/s",
            base,
            ">= 0.9",
        )
    ]


def _durable_bare_save(model, opt, out: Path) -> None:
    """The same bytes made durable without the protocol: save_pretrained + optimizer state + fsync."""
    import torch

    model.save_pretrained(out)
    torch.save(opt.state_dict(), out / "optimizer.pt")
    for f in out.iterdir():
        fd = os.open(f, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)


def _tree_mb(directory: Path) -> float:
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file()) / 2**20


def publish_time(
    work: Path, redis_url: str, name: str, model_dir: Path, repeats: int, report_size: bool = False
) -> list[Figure]:
    """Median publish of the model at ``model_dir`` with one step's AdamW state, against a durable bare save;
    ``report_size`` adds the checkpoint's size (weights, and the optimizer/trainer state beside them)."""
    import torch
    from transformers import AutoModelForCausalLM

    from services.trainer.checkpointing import Announcer, TrainerState, optimizer_path, save_checkpoint
    from services.trainer.optim import LRSchedule, build_optimizer
    from tba.checkpoints import TRAINER_STATE_DIR, CheckpointStore
    from tba.keys import Keys
    from tba.model.tokenizer import load_tokenizer
    from tba.redis_client import sync_client

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    params = sum(p.numel() for p in model.parameters())
    tok = load_tokenizer(model_dir)
    opt, sched = build_optimizer(model, 1e-5, 0.0, LRSchedule())
    model(input_ids=torch.tensor([[1, 5, 6, 7]])).logits.sum().backward()  # one step: Adam moments exist
    opt.step()
    store = CheckpointStore(work / f"ckpt-{name}")
    announcer = Announcer(sync_client(redis_url), Keys(NS))
    published = store.root

    def publish(state: TrainerState, optimizer_file: Path | None = None) -> float:
        """One publish as the trainer makes it (write, announce, prune); its seconds."""
        nonlocal published
        t0 = time.perf_counter()
        manifest = save_checkpoint(store, model, tok, opt, sched, state, optimizer_file=optimizer_file)
        announcer.announce(manifest)
        store.prune(keep=1, grace_seconds=0.0)
        published = store.resolve(manifest)
        return time.perf_counter() - t0

    ours, bare = [], []
    for step in range(1, repeats + 1):
        out = work / f"bare-{name}-{step}"
        t0 = time.perf_counter()
        _durable_bare_save(model, opt, out)
        bare.append(time.perf_counter() - t0)
        shutil.rmtree(out)
        ours.append(publish(TrainerState(step=step, beta=BETA)))
    # Weights-only: the publishes between two writes of the optimizer's state link the last one written.
    linked = [
        publish(TrainerState(step=step, beta=BETA, optimizer_step=repeats), optimizer_path(published))
        for step in range(repeats + 1, 2 * repeats + 1)
    ]
    weights_mb = sum(f.stat().st_size for f in published.iterdir() if f.is_file()) / 2**20
    state_mb = _tree_mb(published / TRAINER_STATE_DIR)
    shutil.rmtree(store.root)
    figures = [
        Figure(
            PART,
            f"checkpoint publish, {name} ({params / 1e6:.1f}M params, {weights_mb:.0f} MB weights "
            "+ optimizer) vs durable bare save",
            statistics.median(ours),
            "s",
            statistics.median(bare),
            "same bytes fsync'd; ours adds hash+rename+manifest+announce",
        ),
        Figure(
            PART,
            f"checkpoint publish, {name}, weights-only (the optimizer file linked) vs a full publish",
            statistics.median(linked),
            "s",
            statistics.median(ours),
            "the publishes between two writes of the optimizer's state (TBA_OPTIMIZER_STATE_SECONDS), not fsynced",
        ),
    ]
    if report_size:
        figures.append(
            Figure(
                PART,
                f"checkpoint size, {name} ({weights_mb:.0f} MB weights and tokenizer + "
                f"{state_mb:.0f} MB optimizer and trainer state)",
                weights_mb + state_mb,
                "MB",
            )
        )
    return figures


def main(model: Path | None = None, quick: bool = False) -> list[Figure]:
    """The tiny model's figures; with ``model``, that pretrained model's (:func:`model_figures`)."""
    import torch

    from tba.model.tiny import TinyModelSpec, init_model
    from tba.model.tokenizer import load_tokenizer

    torch.set_num_threads(1)
    if model is not None:
        return model_figures(Path(model), quick)
    work = Path(tempfile.mkdtemp(prefix="tba-bench-trainer-"))
    try:
        model_dir = init_model(work / "tiny", seed=0)
        pad_id = load_tokenizer(model_dir).pad_token_id
        with _services(work) as (redis_url, buffer_url):
            stored = _fill_buffer(model_dir, redis_url, buffer_url)
            print(f"[bench] trainer: buffer holds {stored} samples of {POOL_PROMPTS} prompts", flush=True)
            figures = learner_vs_bare(model_dir, _fetch(buffer_url, list(range(BATCHES))), pad_id)
            figures += service_loop(model_dir, work, redis_url, buffer_url, pad_id)
            repeats = settings()["publish_repeats"]
            figures += publish_time(
                work, redis_url, "tiny", init_model(work / "model-tiny", TinyModelSpec(), seed=0), repeats["tiny"]
            )
            figures += publish_time(
                work,
                redis_url,
                "100M",
                init_model(work / "model-100M", TinyModelSpec(**SPEC_100M), seed=0),
                repeats["100M"],
            )
            return figures
    finally:
        shutil.rmtree(work, ignore_errors=True)


# --- a pretrained model (--model) ----------------------------------------------------------------------------


def _pad_id(model_dir: Path) -> int:
    from tba.model.tokenizer import load_tokenizer

    tok = load_tokenizer(model_dir)
    return tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id


def model_batches(model_dir: Path, redis_url: str, buffer_url: str, num_prompts: int, count: int, pool: int) -> list:
    """``count`` batches of ``num_prompts`` x K drawn by the real buffer from the model's own samples of
    ``pool`` chat-form arithmetic prompts (chat template applied, as the searcher encodes them)."""
    from tba.model.tokenizer import PromptFormat
    from tba.tasks import make_task

    t0 = time.perf_counter()
    stored = _fill_buffer(
        model_dir,
        redis_url,
        buffer_url,
        make_task("arithmetic", chat=True),
        PromptFormat(chat=True),
        pool=pool,
        max_new=MODEL_MAX_NEW,
    )
    print(
        f"[bench] trainer: buffer holds {stored} samples of {pool} prompts (sampled in "
        f"{time.perf_counter() - t0:.0f} s)",
        flush=True,
    )
    batches = _fetch(buffer_url, list(range(count)), num_prompts)
    lengths = [len(g.prompt_ids) + len(s.completion_ids) for b in batches for g in b.groups for s in g.samples]
    print(
        f"[bench] trainer: {count} batches of {num_prompts} x {K}, sequences of {statistics.mean(lengths):.0f} "
        f"tokens on average ({min(lengths)}..{max(lengths)})",
        flush=True,
    )
    return batches


def model_figures(model_dir: Path, quick: bool = False) -> list[Figure]:
    """Learner vs bare loop and the checkpoint publish at a pretrained model, on this machine's CPU.

    The whole-Trainer service loop is not run here: at this size a step takes tens of seconds on
    these cores, and its 11 steps x 3 runs (and as many bare steps) would take most of an hour."""
    from benchmarks import model_label

    label = model_label(model_dir)
    run = settings(model_dir, quick)
    work = Path(tempfile.mkdtemp(prefix="tba-bench-trainer-"))
    try:
        with _services(work) as (redis_url, buffer_url):
            batches = model_batches(model_dir, redis_url, buffer_url, MODEL_P, run["batches"], run["pool_prompts"])
            figures = learner_vs_bare(model_dir, batches, _pad_id(model_dir), label, run["repeats"])
            print(
                f"[bench] trainer: service loop (whole Trainer) skipped for --model {label}: "
                "too slow at this size on the CPU",
                flush=True,
            )
            figures += publish_time(work, redis_url, label, model_dir, repeats=run["publish_repeats"], report_size=True)
            return figures
    finally:
        shutil.rmtree(work, ignore_errors=True)


# --- the learner-vs-bare comparison on another machine (a GPU host without Redis, buffer or vLLM) ---------------


def save_batches(model_dir: Path, path: Path, num_prompts: int, count: int) -> None:
    """Make batches here (the real buffer, the model's own samples) and write them as JSON for :func:`run_saved`."""
    work = Path(tempfile.mkdtemp(prefix="tba-bench-trainer-"))
    try:
        with _services(work) as (redis_url, buffer_url):
            batches = model_batches(model_dir, redis_url, buffer_url, num_prompts, count, max(num_prompts, MODEL_POOL))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    path.write_text(json.dumps([b.model_dump(mode="json") for b in batches]))
    print(f"[bench] trainer: wrote {count} batches to {path} ({path.stat().st_size / 2**20:.1f} MB)", flush=True)


def run_saved(
    model_dir: Path, path: Path, device: str, compute_dtype: str, rounds: int, token_budget: int
) -> list[Figure]:
    """Learner vs bare loop on saved batches, both arms on ``device``. Needs torch, transformers, pydantic and
    prometheus_client only (no Redis, buffer or vLLM: their imports stay inside the functions that use them)."""
    from benchmarks import model_label
    from tba.schemas import SampledBatch

    batches = [SampledBatch.model_validate(d) for d in json.loads(path.read_text())]
    label = f"{model_label(model_dir)}, {device}, {compute_dtype}, {len(batches)} batches"
    print(f"[bench] trainer: {label}, {rounds} rounds, token budget {token_budget}", flush=True)
    return learner_vs_bare(model_dir, batches, _pad_id(model_dir), label, rounds, device, compute_dtype, token_budget)


def cli(argv: list[str] | None = None) -> int:
    import argparse

    from benchmarks import format_table

    parser = argparse.ArgumentParser(prog="python -m benchmarks.trainer", description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model directory or packaged model name (default: the tiny model)")
    parser.add_argument("--quick", action="store_true", help="with --model: a smoke run; figures mean nothing")
    parser.add_argument("--save-batches", type=Path, metavar="FILE", help="with --model: write batches, then exit")
    parser.add_argument("--prompts", type=int, default=SAVE_PROMPTS, help="--save-batches: prompts per batch")
    parser.add_argument("--count", type=int, default=SAVE_COUNT, help="--save-batches: number of batches")
    parser.add_argument(
        "--batches", type=Path, metavar="FILE", help="with --model: learner vs bare loop on these saved batches only"
    )
    parser.add_argument("--device", default="cpu", help="--batches: torch device of both arms (cpu, cuda, cuda:0)")
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=("float32", "bfloat16", "float16"),
        help="--batches: compute dtype (autocast over fp32 master weights)",
    )
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="--batches: timed passes over the batches")
    parser.add_argument(
        "--token-budget", type=int, default=16384, help="--batches: the Learner's padded tokens per micro-batch"
    )
    args = parser.parse_args(argv)
    if (args.save_batches or args.batches or args.quick) and not args.model:
        parser.error("--save-batches, --batches and --quick need --model")
    model = None
    if args.model:
        from tba.model.importer import resolve_model

        model = resolve_model(args.model)
    if args.save_batches:
        import torch

        torch.set_num_threads(1)
        save_batches(model, args.save_batches, args.prompts, args.count)
        return 0
    if args.batches:
        import torch

        if torch.device(args.device).type == "cpu":
            torch.set_num_threads(1)
        print(format_table(run_saved(model, args.batches, args.device, args.dtype, args.rounds, args.token_budget)))
        return 0
    print(format_table(main(model, args.quick)))
    return 0


if __name__ == "__main__":
    sys.exit(cli())
