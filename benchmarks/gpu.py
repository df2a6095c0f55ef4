"""The trainer on a GPU: the learner in bfloat16 against a bare PyTorch loop, FSDP2 with one rank, bf16 numerics
against fp32, and checkpoint publishing from GPU memory, at three Llama sizes.

Made for a GPU host that has PyTorch, transformers and peft (pydantic and pydantic-settings carried beside
them) but no model files, vLLM, Redis or network: the models are Llama configurations with random weights
built on the device (:data:`SIZES`), and the batches are synthetic with the shape of the real-model runs'
(:func:`synthetic_batches`: P prompts x K completions, chat-form prompt lengths, completions up to 64 tokens
whose first tokens siblings often share). Each part reuses the CPU benchmarks' arms
(:mod:`benchmarks.trainer`), so a figure here means what it means there.

Per size:

1. ``learner``: the service's :class:`~services.trainer.learner.Learner` (prefix sharing, micro-batches,
   validation, metrics) against :class:`~benchmarks.trainer.BareLoop` on the same batches, fp32 master
   weights and the forward under bf16 autocast, full fine-tuning and LoRA (rank 16 on every projection):
   tokens/s and peak memory of each.
2. ``fsdp``: the same Learner on the model sharded by FSDP2 (``fully_shard`` per decoder layer, as the
   trainer under torchrun shards it) in a process group of one rank (NCCL on CUDA, gloo on the CPU),
   against the plain Learner.
3. ``numerics``: log pi (the trainer's prefix-shared sums and the padded ones) and the TB loss in bf16
   autocast against float32 on the same weights and inputs: differences per sequence, and the cosine
   between the two gradients.
4. ``publish``: the real ``save_checkpoint`` of the model in GPU memory into a checkpoint store on local
   disk, with the optimizer's state (the resume point: fsynced) and weights-only (the optimizer file linked,
   not fsynced), seconds and MB/s, with the content hash's share.

``python -m benchmarks.gpu --out FILE`` measures and writes a run record (JSON, updated after every part, so
a run cut short keeps what it measured); ``--render FILE`` prints the results page of a record. ``--smoke``
runs every part on a tiny configuration (the CPU test of this module): its figures mean nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks.trainer import BETA, T, alternate, compare_learner, service_learner, synchronize

VOCAB = 49152  # SmolLM2's tokenizer, for every size
LLAMA: dict[str, Any] = dict(
    vocab_size=VOCAB, tie_word_embeddings=True, max_position_embeddings=8192, rope_theta=100000.0
)
SIZES: dict[str, dict[str, int]] = {
    # SmolLM2-135M's own shape
    "smollm2-135m": dict(
        hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3
    ),
    "llama-0.5b": dict(
        hidden_size=1024, intermediate_size=4096, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8
    ),
    "llama-1.5b": dict(
        hidden_size=2048, intermediate_size=8192, num_hidden_layers=24, num_attention_heads=32, num_key_value_heads=8
    ),
}
SMOKE = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
)  # --smoke: every part, in seconds on a CPU
PROMPTS, SAMPLES, BATCHES, ROUNDS = 8, 8, 3, 3  # the real-model runs' step: 8 prompts x 8 completions
GPU_PROMPTS = 32  # and a step four times larger, as a GPU trainer would take
PROMPT_LEN, COMPLETION_LEN, SHARED_PREFIX = (60, 110), (4, 64), 8
LORA_RANK = 16
TOKEN_BUDGET = 16384  # the trainer's default padded tokens per micro-batch
PUBLISH_REPEATS = 3


# --- models and batches ------------------------------------------------------------------------------------------


def llama_config(shape: dict[str, int]):
    from transformers import LlamaConfig

    config = LlamaConfig(**{**LLAMA, **shape})
    config._attn_implementation = "sdpa"  # the trainer's (it takes the prefix trees' 4D masks)
    return config


def builder(config, device: str, seed: int = 0) -> Callable[[], Any]:
    """A function that builds the same random-weight model on ``device`` at every call (fp32 master weights)."""
    import torch
    from transformers import AutoModelForCausalLM

    def build():
        torch.manual_seed(seed)
        with torch.device(device):
            return AutoModelForCausalLM.from_config(config, dtype=torch.float32)

    return build


def with_lora(model, seed: int = 1):
    """``model`` with trainable rank-16 adapters on every attention and MLP projection, as a LoRA trainer wraps it."""
    import torch

    from tba.model.adapters import wrap_for_training
    from tba.settings import DEFAULT_TARGETS

    torch.manual_seed(seed)
    return wrap_for_training(
        model, Path(tempfile.gettempdir()) / "base", LORA_RANK, 2.0 * LORA_RANK, 0.0, DEFAULT_TARGETS
    )


def synthetic_batches(vocab: int, prompts: int, samples: int, count: int, seed: int = 0) -> list:
    """``count`` batches of ``prompts`` x ``samples`` as ``POST /v1/sample`` answers them, random token ids with
    the real-model runs' lengths; the completions of one prompt start with 0..8 tokens of one common stem (the
    prefixes that sampling at T=0.7 shares between siblings), rewards 0 or 1."""
    import random

    from tba.schemas import SampledBatch, SampledGroup, SampledSample

    rng = random.Random(seed)
    batches = []
    for b in range(count):
        groups = []
        for p in range(prompts):
            prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(*PROMPT_LEN))]
            stem = [rng.randrange(3, vocab) for _ in range(SHARED_PREFIX)]
            group = []
            for _ in range(samples):
                n = rng.randint(*COMPLETION_LEN)
                shared = min(n, rng.randint(0, SHARED_PREFIX))
                completion = stem[:shared] + [rng.randrange(3, vocab) for _ in range(n - shared)]
                lp = -2.0 * n
                group.append(
                    SampledSample(
                        completion_ids=completion,
                        reward=float(rng.random() < 0.5),
                        logprob_sum=lp,
                        ref_logprob_sum=lp,
                        version=0,
                        staleness=0,
                    )
                )
            groups.append(SampledGroup(prompt_id=f"b{b}p{p}", prompt_ids=prompt, branch="recency", samples=group))
        batches.append(SampledBatch(trainer_version=0, groups=groups))
    return batches


def batch_shape(batches: list) -> dict[str, float]:
    prompt = [len(g.prompt_ids) for b in batches for g in b.groups]
    completion = [len(s.completion_ids) for b in batches for g in b.groups for s in g.samples]
    return {
        "prompts": len(batches[0].groups),
        "samples_per_prompt": len(batches[0].groups[0].samples),
        "batches": len(batches),
        "prompt_tokens_mean": statistics.mean(prompt),
        "completion_tokens_mean": statistics.mean(completion),
        "completion_tokens_max": max(completion),
    }


def _release() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# --- 1. learner vs bare loop --------------------------------------------------------------------------------------


def learner_part(config, batches: list, device: str, rounds: int) -> dict[str, Any]:
    """Full fine-tuning and LoRA: the Learner against the bare loop, bf16 autocast over fp32 weights."""
    out: dict[str, Any] = {}
    for mode, wrap in (("full", None), ("lora", with_lora)):
        arms = compare_learner(builder(config, device), batches, 0, rounds, device, "bfloat16", TOKEN_BUDGET, wrap)
        out[mode] = arms | {"ratio": arms["service"]["tokens_per_s"] / arms["bare"]["tokens_per_s"]}
        _release()
    return out


# --- 2. FSDP2 with one rank ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def process_group(device: str) -> Iterator[None]:
    """A process group of this process alone (NCCL on CUDA, gloo on the CPU), as torchrun would make rank 0."""
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    backend = "nccl" if device.startswith("cuda") else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def fsdp_part(config, batches: list, device: str, rounds: int) -> dict[str, Any]:
    """The Learner on the FSDP2-sharded model (one rank) against the plain Learner, same batches."""
    from services.trainer.batching import rows_from_batch
    from services.trainer.distributed import shard

    def stepper(learner):
        def step(batch) -> int:
            rows, _ = rows_from_batch(batch, config.vocab_size, config.max_position_embeddings)
            return learner.step(rows, BETA).tokens

        return step

    build = builder(config, device)
    with process_group(device):
        learners = {
            "plain": service_learner(build(), 0, "bfloat16", TOKEN_BUDGET),
            "fsdp2": service_learner(shard(build()), 0, "bfloat16", TOKEN_BUDGET),
        }
        rates = alternate({name: stepper(learner) for name, learner in learners.items()}, batches, rounds, device)
        del learners  # before the group goes: the sharded parameters hold its mesh
    return {name: {"tokens_per_s": rate} for name, rate in rates.items()} | {"ratio": rates["fsdp2"] / rates["plain"]}


def profile_step(config, batches: list, device: str, rows: int = 25) -> str:
    """Where one Learner step's time goes (torch.profiler, CPU and device time per operator): printed, not
    recorded, so that a ratio below target can be explained from the same run."""
    from torch.profiler import ProfilerActivity, profile

    from services.trainer.batching import rows_from_batch

    learner = service_learner(builder(config, device)(), 0, "bfloat16", TOKEN_BUDGET)
    samples, _ = rows_from_batch(batches[0], config.vocab_size, config.max_position_embeddings)
    learner.step(samples, BETA)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    with profile(activities=activities) as prof:
        learner.step(samples, BETA)
        synchronize(device)
    key = "self_cuda_time_total" if device.startswith("cuda") else "self_cpu_time_total"
    return (
        prof.key_averages().table(sort_by=key, row_limit=rows)
        + "\n"
        + prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)
    )


# --- 3. numerics: bf16 against fp32 -------------------------------------------------------------------------------


def numerics_part(config, batches: list, device: str) -> dict[str, Any]:
    """log pi per sequence and the TB loss under bf16 autocast against fp32, same weights and inputs."""
    import torch

    from services.trainer.batching import plan_micro_batches, rows_from_batch
    from services.trainer.learner import autocast
    from services.trainer.losses import LossInput, make_loss
    from tba.model.logprobs import sequence_logprobs, shared_prefix_logprobs

    model = builder(config, device)()
    rows, _ = rows_from_batch(batches[0], config.vocab_size, config.max_position_embeddings)
    (mb,) = plan_micro_batches(rows, 1 << 30)
    loss_fn = make_loss("tb")
    results: dict[str, dict[str, torch.Tensor]] = {}
    for dtype in ("float32", "bfloat16"):
        model.zero_grad(set_to_none=True)
        with autocast(torch.device(device), dtype):
            shared = shared_prefix_logprobs(model, mb.prompts, mb.completions, T, 0)
            with torch.no_grad():
                padded = sequence_logprobs(model, mb.prompts, mb.completions, T, 0)
        x = LossInput(
            log_pi=shared.float(),
            log_ref=mb.log_ref.to(device),
            reward=mb.reward.to(device),
            prompt_index=mb.prompt_index.to(device),
        )
        loss = loss_fn(x, BETA, len(rows)).loss
        loss.backward()
        grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        results[dtype] = {
            "shared": shared.detach().float(),
            "padded": padded.float(),
            "loss": loss.detach(),
            "grad": grad,
        }
    ref, low = results["float32"], results["bfloat16"]
    tokens = torch.tensor([len(c) for c in mb.completions], device=ref["shared"].device, dtype=torch.float32)
    out: dict[str, Any] = {"sequences": len(rows), "log_pi_fp32_mean": float(ref["shared"].mean())}
    for name in ("shared", "padded"):
        diff = (low[name] - ref[name]).abs()
        out[f"{name}_max_abs_diff"] = float(diff.max())
        out[f"{name}_mean_abs_diff"] = float(diff.mean())
        out[f"{name}_max_abs_diff_per_token"] = float((diff / tokens).max())
    out["shared_vs_padded_fp32_max_abs_diff"] = float((ref["shared"] - ref["padded"]).abs().max())
    out["loss_fp32"] = float(ref["loss"])
    out["loss_rel_diff"] = float((low["loss"] - ref["loss"]).abs() / ref["loss"].abs())
    out["grad_cosine"] = float(torch.nn.functional.cosine_similarity(low["grad"], ref["grad"], dim=0))
    return out


# --- 4. publishing from GPU memory --------------------------------------------------------------------------------


def publish_part(config, device: str, work: Path, repeats: int) -> dict[str, Any]:
    """The real ``save_checkpoint`` of the model in GPU memory: once with the optimizer's state (fsynced), then
    ``repeats`` weights-only publishes linking that optimizer file (medians)."""
    import torch

    from services.trainer.checkpointing import TrainerState, optimizer_path, save_checkpoint
    from services.trainer.optim import LRSchedule, build_optimizer
    from tba.checkpoints import TRAINER_STATE_DIR, CheckpointStore, content_hash
    from tba.model.tokenizer import build_tokenizer

    model = builder(config, device)()
    params = sum(p.numel() for p in model.parameters())
    optimizer, scheduler = build_optimizer(model, 1e-5, 0.0, LRSchedule())
    model(input_ids=torch.tensor([[1, 5, 6, 7]], device=device)).logits.sum().backward()
    optimizer.step()  # the Adam moments a resume point carries exist
    model.zero_grad(set_to_none=True)
    store = CheckpointStore(work / "publish")
    tokenizer = build_tokenizer()

    def publish(step: int, optimizer_file: Path | None) -> tuple[float, Path]:
        synchronize(device)
        t0 = time.perf_counter()
        manifest = save_checkpoint(
            store,
            model,
            tokenizer,
            optimizer,
            scheduler,
            TrainerState(step=step, beta=BETA, optimizer_step=None if optimizer_file is None else 1),
            optimizer_file=optimizer_file,
        )
        return time.perf_counter() - t0, store.resolve(manifest)

    full_seconds, first = publish(1, None)
    weights_mb = sum(f.stat().st_size for f in first.iterdir() if f.is_file()) / 2**20
    state_mb = sum(f.stat().st_size for f in (first / TRAINER_STATE_DIR).rglob("*") if f.is_file()) / 2**20
    linked = []
    for step in range(2, repeats + 2):
        seconds, directory = publish(step, optimizer_path(first))
        linked.append(seconds)
    t0 = time.perf_counter()
    content_hash(directory)  # the share of a publish that hashing the weights takes (from the page cache)
    hash_seconds = time.perf_counter() - t0
    weights_only = statistics.median(linked)
    shutil.rmtree(store.root)
    return {
        "params_m": params / 1e6,
        "weights_mb": weights_mb,
        "optimizer_and_state_mb": state_mb,
        "weights_only_seconds": weights_only,
        "weights_only_mb_per_s": weights_mb / weights_only,
        "with_optimizer_seconds": full_seconds,
        "with_optimizer_mb_per_s": (weights_mb + state_mb) / full_seconds,
        "hash_seconds": hash_seconds,
    }


# --- the run record -----------------------------------------------------------------------------------------------


def environment(device: str) -> dict[str, Any]:
    """What the figures were measured on: the accelerator, the CPU, the library versions, the commit (the
    checkout's, else ``TBA_COMMIT``: only the working tree travels to a GPU host, not its git history)."""
    import torch

    from tba.run_record import code, cpu, packages

    machine, versions = cpu(), packages(("torch", "transformers", "peft"))
    env: dict[str, Any] = {
        "commit": code()["commit"] or os.environ.get("TBA_COMMIT", "unknown"),
        "device": device,
        "cpu_model": machine["cpu_model"],
        "cpu_count": machine["machine_cores"],
        **versions,
    }
    if torch.device(device).type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env |= {
            "gpu": props.name,
            "gpu_memory_gb": props.total_memory / 2**30,
            "cuda": torch.version.cuda,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        }
    return env


def run(sizes: list[str], device: str, out: Path, smoke: bool = False) -> dict[str, Any]:
    """Every part at every size, the record rewritten to ``out`` after each part."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 in the numerics' reference
    shapes = {"smoke": SMOKE} if smoke else {name: SIZES[name] for name in sizes}
    rounds, count, repeats = (1, 1, 1) if smoke else (ROUNDS, BATCHES, PUBLISH_REPEATS)
    record: dict[str, Any] = {
        "benchmark": "gpu-trainer",
        "command": "python -m benchmarks.gpu " + " ".join(sys.argv[1:]),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "environment": environment(device),
        "settings": {
            "compute_dtype": "bfloat16",
            "master_weights": "float32",
            "temperature": T,
            "beta": BETA,
            "token_budget": TOKEN_BUDGET,
            "lora_rank": LORA_RANK,
            "rounds": rounds,
            "publish_repeats": repeats,
            "seed": 0,
        },
        "sizes": {},
    }
    work = Path(tempfile.mkdtemp(prefix="tba-bench-gpu-"))
    try:
        first = llama_config(next(iter(shapes.values())))
        print(profile_step(first, synthetic_batches(first.vocab_size, PROMPTS, SAMPLES, 1), device), flush=True)
        _release()
        for name, shape in shapes.items():
            config = llama_config(shape)
            vocab = config.vocab_size
            small = synthetic_batches(vocab, PROMPTS, SAMPLES, count, seed=0)
            large = synthetic_batches(vocab, 2 if smoke else GPU_PROMPTS, SAMPLES, count, seed=1)
            entry: dict[str, Any] = record["sizes"].setdefault(name, {"shape": shape})
            record["batches"] = {"real_run_step": batch_shape(small), "gpu_step": batch_shape(large)}
            parts: list[tuple[str, Callable[[], Any]]] = [
                ("publish", partial(publish_part, config, device, work, repeats)),
                ("numerics", partial(numerics_part, config, small, device)),
                ("learner", partial(learner_part, config, small, device, rounds)),
                ("learner_gpu_step", partial(learner_part, config, large, device, rounds)),
                ("fsdp", partial(fsdp_part, config, large, device, rounds)),
            ]
            for part, measure in parts:
                t0 = time.perf_counter()
                try:
                    entry[part] = measure()
                except Exception as err:  # noqa: BLE001 (a part that fails is recorded, the others still run)
                    entry[part] = {"error": f"{type(err).__name__}: {err}"}
                    traceback.print_exc()
                _release()  # the part's models and optimizer states, before the next part builds its own
                print(f"[gpu] {name} {part} ({time.perf_counter() - t0:.1f} s): {json.dumps(entry[part])}", flush=True)
                out.write_text(json.dumps(record, indent=1))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return record


# --- the results page ---------------------------------------------------------------------------------------------


def render(record: dict[str, Any]) -> str:
    """The results page of a run record: markdown, generated, never edited by hand."""
    env, settings = record["environment"], record["settings"]
    lines = [
        "# The trainer on a GPU",
        "",
        "<!-- generated by `python -m benchmarks.gpu --render docs/results/data/gpu-trainer.json`; edit the data, "
        "not this page -->",
        "",
        f"Measured on one **{env.get('gpu', env['device'])}** ({env.get('gpu_memory_gb', 0):.0f} GiB; CUDA "
        f"{env.get('cuda', '-')}, NCCL {env.get('nccl', '-')}), host CPU {env['cpu_model']} x {env['cpu_count']}; "
        f"torch {env['torch']}, transformers {env['transformers']}, peft {env['peft']}; commit `{env['commit']}`, "
        f"{record['started_at']}.",
        "",
        f"Command: `{record['command']}` (the module's docstring says what each part does). Models: Llama "
        "configurations with random weights built on the GPU, SmolLM2's 49,152-token vocabulary. fp32 master "
        f"weights, the forward under {settings['compute_dtype']} autocast, TB loss at T={settings['temperature']}, "
        f"beta={settings['beta']}, micro-batches of at most {settings['token_budget']:,} padded tokens, "
        f"LoRA rank {settings['lora_rank']} on every projection. Tokens/s over {settings['rounds']} alternating "
        "passes, after one warm-up step per arm.",
        "",
        _batches_line(record),
        "",
        "## Learner against a bare PyTorch loop (target: >= 0.9x)",
        "",
        "| model | params | batch | mode | learner tokens/s | bare tokens/s | ratio | learner peak GB | bare peak GB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, entry in record["sizes"].items():
        params = entry.get("publish", {}).get("params_m")
        for part, batch in (("learner", "8 x 8"), ("learner_gpu_step", "32 x 8")):
            for mode in ("full", "lora"):
                r = entry.get(part, {}).get(mode)
                if r is None:
                    lines.append(f"| {name} | | {batch} | {mode} | {_error(entry, part)} | | | | |")
                    continue
                lines.append(
                    f"| {name} | {_params(params)} | {batch} | {mode} | {r['service']['tokens_per_s']:,.0f} | "
                    f"{r['bare']['tokens_per_s']:,.0f} | **{r['ratio']:.2f}** | "
                    f"{r['service'].get('peak_gb', 0):.1f} | {r['bare'].get('peak_gb', 0):.1f} |"
                )
    lines += _table(
        record,
        "FSDP2 with one rank against the plain learner (target: >= 0.9x)",
        "",
        ["model", "batch", "FSDP2 tokens/s", "plain tokens/s", "ratio"],
        "fsdp",
        lambda f: [
            "32 x 8",
            f"{f['fsdp2']['tokens_per_s']:,.0f}",
            f"{f['plain']['tokens_per_s']:,.0f}",
            f"**{f['ratio']:.2f}**",
        ],
    )
    lines += _table(
        record,
        "bfloat16 against float32 on the same weights and inputs",
        "log pi is a completion's summed log-prob (the trainer's prefix-shared computation, and the padded one "
        "the bare loop uses); the loss is the TB loss of one 8 x 8 batch; the cosine is between the two "
        "gradients of all weights.",
        [
            "model",
            "mean log pi (fp32)",
            "max abs diff (shared)",
            "mean abs diff",
            "max per token",
            "max abs diff (padded)",
            "loss rel. diff",
            "grad cosine",
        ],
        "numerics",
        lambda n: [
            f"{n['log_pi_fp32_mean']:.1f}",
            f"{n['shared_max_abs_diff']:.3f}",
            f"{n['shared_mean_abs_diff']:.3f}",
            f"{n['shared_max_abs_diff_per_token']:.4f}",
            f"{n['padded_max_abs_diff']:.3f}",
            f"{n['loss_rel_diff']:.2e}",
            f"{n['grad_cosine']:.4f}",
        ],
    )
    lines += _table(
        record,
        "Checkpoint publishing from GPU memory (target: the ~0.5B model's weights in <= 2 s)",
        "The real `save_checkpoint` into a checkpoint store on the host's local disk: weights-only (the "
        "optimizer file of the last resume point linked, not fsynced; the median of "
        f"{settings['publish_repeats']}) and with the optimizer's state (a resume point, fsynced). fp32 weights.",
        [
            "model",
            "params",
            "weights MB",
            "weights-only s",
            "MB/s",
            "of it hashing s",
            "optimizer + state MB",
            "with optimizer s",
            "MB/s",
        ],
        "publish",
        lambda p: [
            _params(p["params_m"]),
            f"{p['weights_mb']:,.0f}",
            f"**{p['weights_only_seconds']:.2f}**",
            f"{p['weights_only_mb_per_s']:,.0f}",
            f"{p['hash_seconds']:.2f}",
            f"{p['optimizer_and_state_mb']:,.0f}",
            f"{p['with_optimizer_seconds']:.2f}",
            f"{p['with_optimizer_mb_per_s']:,.0f}",
        ],
    )
    notes = record.get("notes")
    if notes:
        lines += ["", "## Reading the figures", ""] + [f"- {note}" for note in notes]
    return "\n".join(lines) + "\n"


def _table(
    record: dict[str, Any],
    title: str,
    intro: str,
    columns: list[str],
    part: str,
    row: Callable[[dict[str, Any]], list[str]],
) -> list[str]:
    """One section of the page: a table with a row per model size of ``part``'s figures (``row``), or of the
    error that part ended with."""
    lines = ["", f"## {title}", ""] + ([intro, ""] if intro else [])
    lines += ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for name, entry in record["sizes"].items():
        figures = entry.get(part, {})
        cells = [_error(entry, part), *[""] * (len(columns) - 2)] if "error" in figures or not figures else row(figures)
        lines.append("| " + " | ".join([name, *cells]) + " |")
    return lines


def _batches_line(record: dict[str, Any]) -> str:
    parts = []
    for label, b in (("the real-model runs' step", "real_run_step"), ("a GPU-sized step", "gpu_step")):
        s = record["batches"][b]
        parts.append(
            f"{label}: {s['prompts']} prompts x {s['samples_per_prompt']} completions, prompts of "
            f"{s['prompt_tokens_mean']:.0f} tokens on average, completions of {s['completion_tokens_mean']:.0f} "
            f"(at most {s['completion_tokens_max']})"
        )
    return f"Batches ({record['batches']['real_run_step']['batches']} per pass, synthetic): " + "; ".join(parts) + "."


def _params(millions: float | None) -> str:
    return "" if millions is None else f"{millions / 1000:.2f}B" if millions >= 1000 else f"{millions:.0f}M"


def _error(entry: dict[str, Any], part: str) -> str:
    return f"failed: {entry.get(part, {}).get('error', 'not measured')}"


def cli(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the run record (JSON) here")
    parser.add_argument("--render", type=Path, metavar="RECORD", help="print the results page of a run record")
    parser.add_argument("--sizes", nargs="+", choices=list(SIZES), default=list(SIZES))
    parser.add_argument("--device", default="cuda", help="torch device (default cuda; cpu for a smoke run)")
    parser.add_argument("--smoke", action="store_true", help="every part on a tiny configuration: figures mean nothing")
    args = parser.parse_args(argv)
    if args.render:
        print(render(json.loads(args.render.read_text())), end="")
        return 0
    if args.out is None:
        parser.error("--out FILE is needed to measure (or --render RECORD)")
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: this torch ({torch.__version__}) sees no CUDA device")
    run(args.sizes, args.device, args.out, args.smoke)
    print(render(json.loads(args.out.read_text())), end="")
    return 0


if __name__ == "__main__":
    sys.exit(cli())
