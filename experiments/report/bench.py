"""The benchmarks' pages: one per subject, each from the records ``python -m benchmarks.run`` writes (and those
converted from earlier text), under docs/results/data/<benchmark>/.

A page opens with what is measured, then one section per benchmark and model: its newest full record (the
current result), the command that reproduces it, then its earlier records; smoke runs (``--quick``) come
last, and what is tested closes it. A page exists once a record of it does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiments import records as data
from experiments.report import md

Record = dict[str, Any]
Named = tuple[str, Record]
SMOLLM2 = "smollm2-135m-instruct"
MODEL_NAMES = {"tiny": "the tiny model", SMOLLM2: "SmolLM2-135M-Instruct"}
DOCKER_PHASES = ("engine", "base_images", "build", "up", "run", "down")


def any_model(_: str | None) -> bool:
    return True


def not_smollm2(model: str | None) -> bool:
    return model != SMOLLM2


def smollm2(model: str | None) -> bool:
    return model == SMOLLM2


@dataclass(frozen=True)
class Part:
    """A benchmark's records on a page: those whose model ``models`` admits, a section per model (per CPU where
    ``by_cpu``: a figure of the hardware compares only on the same CPU)."""

    benchmark: str
    heading: str
    models: Callable[[str | None], bool] = any_model
    by_cpu: bool = False


@dataclass(frozen=True)
class Page:
    file: str
    title: str
    what: str  # the index's line
    intro: tuple[str, ...]
    parts: tuple[Part, ...]
    tested: tuple[str, ...] = ()


PAGES = (
    Page(
        "cores.md",
        "The CPU's cores: do they compute in parallel?",
        "each core's rate with every core busy against its rate alone",
        (
            "`python -m benchmarks.run cores` (benchmarks/cores.py): a float32 and a bfloat16 matrix product and a "
            "streaming add, one pinned process per core with one torch thread, on each core alone and then on every "
            "core at once. Asynchrony on a CPU host runs a searcher and the trainer side by side, a core each: it "
            "pays in proportion to this ratio. Near 1 the cores are independent; near 1 / cores they are "
            "hyperthreads of one physical core, or share what the kernel saturates, and the two services take "
            "that share from each other ([../scaling.md](../scaling.md)).",
        ),
        (Part("cores", "Current result", by_cpu=True),),
        ("tests/unit/test_bench_cores.py: the rates are measured on the cores named, alone and together",),
    ),
    Page(
        "buffer-benchmark.md",
        "The buffer: ingest and sampling against raw Redis",
        "the buffer's ingest and sampling throughput, latency and memory against raw Redis",
        (
            "`python -m benchmarks.run buffer` (benchmarks/buffer.py) fills a redis-server of its own, configured as "
            "production (AOF everysec, noeviction), through the production write path: prompts of 100 samples (5 "
            "groups of 20, 32 tokens each). At 10^3, 10^5 and 10^6 stored samples it measures ingest from the stream "
            "and sampling over HTTP from a `tba buffer` process (8 prompts x 20 samples a call).",
            "The baselines: pipelined raw `SET` and `GET` of one sample's msgpack payload from the same Python client, "
            "alternating with ours three times; the best of each is kept. The p99 latency's baseline is the p99 at "
            "10^3 stored samples; the memory's is the payload.",
        ),
        (Part("buffer", "Current result"),),
    ),
    Page(
        "searcher-throughput.md",
        "The searcher against bare vLLM",
        "the searcher's throughput against bare `LLM.generate`, its reload pause and reference pass",
        (
            "`python -m benchmarks.run searcher` (benchmarks/searcher.py): one vLLM engine; the same prompts and "
            "sampling parameters go through bare `LLM.generate` and through the whole searcher loop (generate, "
            "reference log-probs, rewards, msgpack, XADD to Redis), alternating. At the base weights the reference "
            "log-probs are vLLM's own; after a reload every batch also pays a reference pass (prefix trees on the "
            "spare core), overlapped with the next batch's generation. Target: 0.9 of bare generation or more.",
            "The tiny model's random weights are the hard case: every completion runs to the token limit and none "
            "shares more than the prompt. The arithmetic SFT base is what a run generates: short answers, many "
            "repeated, which the reference pass scores once each. SmolLM2-135M-Instruct: "
            "[real-model-throughput.md](real-model-throughput.md).",
        ),
        (Part("searcher", "Current result", not_smollm2),),
    ),
    Page(
        "trainer-throughput.md",
        "The trainer against a bare PyTorch loop",
        "the trainer's learner and service loop against a bare PyTorch loop, and checkpoint publishing",
        (
            "`python -m benchmarks.run trainer` (benchmarks/trainer.py): the same batches, drawn by the real buffer, "
            "through a bare PyTorch TB loop and through the service's learner; the whole trainer loop against a real "
            "buffer; checkpoint publishing against a durable bare save. SmolLM2-135M-Instruct: "
            "[real-model-throughput.md](real-model-throughput.md).",
        ),
        (Part("trainer", "Current result", not_smollm2),),
    ),
    Page(
        "episodes-throughput.md",
        "Multi-turn episodes: what the environment loop costs a searcher",
        "multi-turn episodes against single-turn generation of the same length",
        (
            "`python -m benchmarks.run episodes` (benchmarks/episodes.py): the whole searcher loop on the calculator "
            "task's SFT base, after a reload, against bare single-turn `LLM.generate` of the same prompts forced to "
            "the trajectories' mean length.",
        ),
        (Part("episodes", "Current result"),),
    ),
    Page(
        "evaluation-throughput.md",
        "Evaluation: the greedy decoder against transformers",
        "the batched greedy decoder of `tba eval` against transformers' `generate`",
        (
            "`python -m benchmarks.run evaluate` (benchmarks/evaluate.py): the held-out arithmetic prompts decoded "
            "greedily with the tiny model, by `tba eval`'s batched KV-cache decoder, by transformers' `generate` on "
            "the same batch, and by `generate` one prompt at a time.",
        ),
        (Part("evaluate", "Current result"),),
    ),
    Page(
        "lora-fsdp.md",
        "LoRA and FSDP2 on the CPU",
        "LoRA adapters against full checkpoints, FSDP2 ranks against one process",
        (
            "LoRA: `python -m benchmarks.run lora` (benchmarks/lora.py) publishes an adapter-only checkpoint (rank 16 "
            "on every attention and MLP projection) and a full one of the same model, each with its AdamW state, "
            "and has a searcher's engine switch to each: the checkpoint's size, the publish, and the time from the "
            "publish to the searcher serving it (medians).",
            "FSDP2: `python -m benchmarks.run fsdp` (benchmarks/fsdp.py) runs the learner on the same batches (8 "
            "prompts x 8 samples of 16-47 tokens) as one process with one thread, one process with two threads, and "
            "two FSDP2 ranks (gloo, torchrun) with one thread each. On 2 cores the ranks share the machine's "
            "compute: every forward and backward gathers each layer's weights and reduces the gradients over gloo, "
            "which one process with both cores does not pay. Sharding buys memory per rank: the weights, gradients "
            "and AdamW state are split; activations and the runtime are not.",
            f"`--model {SMOLLM2}` measures SmolLM2-135M-Instruct instead of the tiny model.",
        ),
        (Part("lora", "LoRA"), Part("fsdp", "FSDP2")),
        (
            "tests/integration/test_lora.py: adapter log-probs, steps, checkpoints, resume, merge, the searcher "
            "serving each adapter",
            "tests/integration/test_fsdp.py: 2 ranks and 1 process take the same step and publish the same checkpoint",
            "tests/integration/test_trainer_loop.py: a LoRA trainer and a 2-rank trainer killed and resumed",
            "tests/e2e/test_lora_run.py, tests/e2e/test_sharded_run.py: `tba up` with LoRA, with 2 trainer ranks",
            "tests/deploy/test_compose.py, tests/deploy/test_k8s.py: the multi-GPU Compose file and Kubernetes "
            "components",
        ),
    ),
    Page(
        "real-model-throughput.md",
        "SmolLM2-135M-Instruct through the system: throughput and smoke figures",
        "SmolLM2-135M-Instruct's import, trainer and searcher figures",
        (
            f"`tba model fetch {SMOLLM2}` imports the model; `python -m benchmarks.run --model {SMOLLM2} trainer "
            "searcher` measures it on the CPU. The trainer: the learner against a bare PyTorch loop on the model's "
            "own samples of chat-form arithmetic prompts, and the checkpoint publish against a durable bare save. "
            "The searcher: the whole searcher loop against bare `LLM.generate`, at the base weights and after a "
            "reload, the reload pause against a fresh engine's start, and the reference pass. `--quick` is a smoke "
            "run: the fewest batches that exercise every path.",
            "LoRA and FSDP2 at this model: [lora-fsdp.md](lora-fsdp.md).",
        ),
        (
            Part("model-import", "The import", smollm2),
            Part("trainer", "The trainer", smollm2),
            Part("searcher", "The searcher", smollm2),
        ),
        (
            "tests/integration/test_model_import.py: import, cache, checks and errors",
            "tests/integration/test_real_model.py: chat-template prompt ids, completions, stop strings, the reference "
            "pass against the trainer's computation, behaviour log-probs after a trained step",
            "tests/e2e/test_real_model_run.py: `tba up --base-model smollm2-135m-instruct`: steps, tied checkpoints "
            "with the tokenizer and chat template, in-place reloads, nothing left running",
            "tests/unit/test_logprobs.py: prefix-tree log-probs and gradients with GQA, tied embeddings and long "
            "prompts",
        ),
    ),
    Page(
        "docker-smoke.md",
        "The Docker smoke run",
        "the Docker smoke run's phases, cold and warm",
        (
            "`scripts/docker-smoke.sh`: the engine, the base images, the image builds, then the CPU stack with two "
            "searcher replicas under Docker Compose, training on the calculator served by the OpenEnv environment "
            "server. It passes when the trainer has published checkpoints, both searchers have reloaded one and "
            "played episodes, and `docker compose down` leaves nothing behind.",
            "In `make test` the cold part runs in the background: `scripts/docker-smoke.sh --build-only` starts when "
            "collection ends, at nice 19, while the tests that need no image run (tests/prewarm.py); the smoke test "
            "runs last, on a warm cache.",
        ),
        (Part("docker-smoke", "Phases"),),
        ("tests/deploy/test_docker_smoke.py",),
    ),
)
BENCHMARKS = tuple(dict.fromkeys(part.benchmark for page in PAGES for part in page.parts))


def load(root: Path = data.DATA) -> dict[str, list[Named]]:
    """Every benchmark's records, oldest first."""
    return {benchmark: list(data.load(benchmark, root)) for benchmark in BENCHMARKS}


def render_all(recs: dict[str, list[Named]]) -> dict[str, str]:
    """Page file name -> text, for every page that has a record."""
    out = {}
    for page in PAGES:
        if any(selected(recs, part) for part in page.parts):
            out[page.file] = render(page, recs)
    return out


def selected(recs: dict[str, list[Named]], part: Part) -> list[Named]:
    return [(n, r) for n, r in recs.get(part.benchmark, []) if part.models(r.get("model"))]


def by_model(named: list[Named]) -> dict[str | None, list[Named]]:
    """Records by model, the tiny model first, then by name; each model's newest first."""
    groups: dict[str | None, list[Named]] = {}
    for n, r in named:
        groups.setdefault(r.get("model"), []).append((n, r))
    order = sorted(groups, key=lambda m: (m != "tiny", m or ""))
    return {m: list(reversed(groups[m])) for m in order}


def by_cpu(named: list[Named]) -> dict[str, list[Named]]:
    """Records by the CPU they were measured on, named as the pages name it; each CPU's newest first."""
    groups: dict[str, list[Named]] = {}
    for n, r in reversed(named):
        groups.setdefault(md.cpu(r.get("machine") or {}), []).append((n, r))
    return groups


def render(page: Page, recs: dict[str, list[Named]]) -> str:
    lines = [f"# {page.title}", "", md.BANNER, ""]
    for paragraph in page.intro:
        lines += [paragraph, ""]
    smoke: list[tuple[Part, Named]] = []
    for part in page.parts:
        named = selected(recs, part)
        groups: dict[Any, list[Named]] = by_cpu(named) if part.by_cpu else by_model(named)
        for key, named in groups.items():
            full = [(n, r) for n, r in named if not r.get("quick")]
            smoke += [(part, (n, r)) for n, r in named if r.get("quick")]
            if not full:
                continue
            label = key if part.by_cpu else model_name(key)
            heading = part.heading if len(groups) == 1 else f"{part.heading}: {label}"
            lines += [f"## {heading}", ""]
            lines += section(part.benchmark, *full[0])
            for name, record in full[1:]:
                lines += [f"### Earlier: {name}", ""]
                lines += section(part.benchmark, name, record, reproduce=False)
    if smoke:
        lines += [
            "## Smoke runs (`--quick`)",
            "",
            "The fewest batches that exercise every path: not the benchmark's figures.",
            "",
        ]
        for part, (name, record) in smoke:
            lines += [f"### {part.heading}: {model_name(record.get('model'))}", ""]
            lines += section(part.benchmark, name, record)
    if page.tested:
        lines += ["## What is tested", "", *(f"- {t}" for t in page.tested), ""]
    return "\n".join(lines)


def model_name(model: str | None) -> str:
    return MODEL_NAMES.get(model or "", model or "no model")


def section(benchmark: str, name: str, record: Record, reproduce: bool = True) -> list[str]:
    """One record: where it was measured, its figures, its notes, and what reproduces it."""
    lines = [provenance(benchmark, name, record), ""]
    if record.get("settings"):
        lines += ["Settings: " + ", ".join(f"`{k}={show(v)}`" for k, v in record["settings"].items()) + ".", ""]
    if record.get("imported"):
        lines += [imported(record["imported"]), ""]
    if record.get("cases"):
        lines += [*docker_table(record["cases"]), ""]
    if record.get("figures"):
        lines += [*figure_table(record["figures"]), ""]
    lines += [f"- {note}" for note in record.get("notes", [])]
    if record.get("notes"):
        lines.append("")
    if reproduce:
        lines += [f"Reproduce: `{record['command']}`, then `python -m experiments.report`.", ""]
    return lines


def provenance(benchmark: str, name: str, record: Record) -> str:
    """The code, the CPU, the load and the record's file; a converted record's code is where it was recorded."""
    machine = record.get("machine") or {}
    parts = [measured(record), f"CPU: {md.cpu(machine)}, {machine.get('cores', '?')} cores"]
    load = record.get("load_average")
    if load:
        parts.append(f"load average {number(load[0])} to {number(load[1])}")
    if record.get("runs"):
        parts.append(f"{record['runs']} runs")
    parts.append(f"data {md.data_link(benchmark, name)}")
    return "; ".join(parts) + "."


def measured(record: Record) -> str:
    """The code a record measured; for a record converted from text whose code is unknown, where its figures were
    recorded (``git show`` that commit for the text)."""
    if record.get("commit"):
        return f"Code: commit `{record['commit']}`" + (" with uncommitted changes" if record.get("dirty") else "")
    return f"Code: not recorded (figures recorded in `{record.get('recorded_in')}`)"


def show(value: Any) -> str:
    """A setting or a figure: a number as the tables show it, a [low, high] range as low-high."""
    if value is None:
        return "-"
    if isinstance(value, bool) or isinstance(value, str):
        return str(value)
    if isinstance(value, int | float):
        return number(value)
    if isinstance(value, list) and len(value) == 2 and all(isinstance(v, int | float) for v in value):
        return f"{number(value[0])}-{number(value[1])}"
    if isinstance(value, list):
        return "; ".join(show(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k} {show(v)}" for k, v in value.items())
    return str(value)


def number(x: float) -> str:
    """Whole numbers with thousands separators, three significant digits below 100 (0.041, 6.2, 41.6)."""
    if float(x).is_integer() or abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.3g}"


def with_unit(value: Any, unit: str) -> str:
    return "-" if value is None else f"{show(value)} {unit}"


def ratio(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return f"{value[0]:.2f}-{value[1]:.2f}"
    return f"{value:.2f}"


def figure_table(figures: Iterable[Record]) -> list[str]:
    return md.table(
        ["figure", "value", "bare baseline", "ratio", "target"],
        [
            [
                f["name"],
                with_unit(f["value"], f["unit"]),
                with_unit(f["baseline"], f["unit"]),
                ratio(f["ratio"]),
                f.get("target") or "",
            ]
            for f in figures
        ],
    )


def docker_table(cases: list[Record]) -> list[str]:
    """The smoke run's phases, one row per case: seconds, a range where the text gave one, '-' where none ran."""

    def cell(phases: Record, phase: str) -> str:
        return "" if phase not in phases else "-" if phases[phase] is None else f"{show(phases[phase])} s"

    return md.table(
        ["case", *(p.replace("_", " ") for p in DOCKER_PHASES), "total"],
        [[r["case"], *(cell(r["phases"], p) for p in DOCKER_PHASES), f"{show(r['total_seconds'])} s"] for r in cases],
    )


def imported(facts: Record) -> str:
    """What the import made of the model, in one sentence."""
    return (
        f"The model: {facts['architecture']}, {facts['parameters_m']}M parameters, {facts['layers']} layers, hidden "
        f"size {facts['hidden_size']}, {facts['attention_heads']} attention heads and {facts['key_value_heads']} "
        f"key-value heads, a vocabulary of {facts['vocab_size']:,}, "
        f"{'tied' if facts['tied_embeddings'] else 'untied'} embeddings, EOS `{facts['eos']}`"
        f"{', a chat template' if facts.get('chat_template') else ''}."
    )
