"""The reference model's log-probs, log pi_ref(y|x) under logits/T, by one of two backends.

Both compute exactly what :func:`tba.model.logprobs.sequence_logprobs` computes on the base model
(the trainer's definition): the sum over the completion ids (EOS included when emitted) of
log softmax(logits / T) at the token that follows.

* ``transformers``: that function itself, a forward pass on ``ref_device`` (the choice on GPUs,
  where the pass is cheap and a second engine would need its own share of GPU memory).
* ``vllm``: a second vLLM engine scores prompt+completion as one prompt with ``prompt_logprobs=0``
  and ``max_tokens=1``. vLLM's prompt log-probs are log softmax of the raw logits whatever
  ``logprobs_mode`` says (prompt tokens skip the sampler), so the engine loads a temperature-scaled
  copy of the base model, written once to a cache directory: lm_head (weight and bias) divided by T,
  untied from the input embeddings if they were tied, so its raw logits are logits/T. On the CPU its
  worker is bound to the core vLLM leaves beside the generation worker, so the two engines never
  fight for a core; scoring batch i then overlaps generating batch i+1 (the loop's worker thread)
  at about a third of the transformers pass's cost (measured with ``benchmarks/searcher.py``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Protocol

from services.searcher.engine import engine_alive, engine_options, guarded_call
from tba.settings import SearcherSettings

log = logging.getLogger(__name__)

TEMPERED_MARK = "tba_reference.json"  # written last: a copy without it is incomplete


class Reference(Protocol):
    backend: str

    def logprobs(self, prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]]) -> list[float]:
        """log pi_ref(y_i|x_i) under logits/T for each pair, in order."""

    def close(self) -> None: ...


def token_budget_chunks(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Indices grouped so each chunk's padded size (rows x longest) stays within ``budget`` tokens.

    Indices are taken in order of length, so rows of a chunk pad to similar lengths."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    chunks: list[list[int]] = []
    current: list[int] = []
    for i in order:
        if current and (len(current) + 1) * lengths[i] > budget:
            chunks.append(current)
            current = []
        current.append(i)
    if current:
        chunks.append(current)
    return chunks


def resolve_backend(settings: SearcherSettings, on_cpu: bool) -> str:
    """``auto``: the vLLM reference engine on CPU hosts, the transformers pass on GPU hosts."""
    if settings.ref_backend != "auto":
        return settings.ref_backend
    return "vllm" if on_cpu else "transformers"


class TransformersReference:
    """The trainer's own function on the base model, batched within ``ref_token_budget`` tokens."""

    backend = "transformers"

    def __init__(self, settings: SearcherSettings, pad_id: int) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.settings = settings
        self.pad_id = pad_id
        self.model = AutoModelForCausalLM.from_pretrained(str(settings.model), dtype=getattr(torch, settings.dtype))
        self.model.to(settings.ref_device).eval()
        # vLLM's CPU worker binds its OpenMP threads to all cores but one, which it leaves to this process:
        # more reference threads would fight the worker's spinning threads and slow both down.
        threads = settings.ref_threads or (1 if torch.device(settings.ref_device).type == "cpu" else None)
        if threads is not None:
            torch.set_num_threads(threads)

    def logprobs(self, prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]]) -> list[float]:
        import torch

        from tba.model.logprobs import sequence_logprobs

        out = [0.0] * len(prompt_ids)
        lengths = [len(p) + len(c) for p, c in zip(prompt_ids, completion_ids, strict=True)]
        with torch.inference_mode():
            for chunk in token_budget_chunks(lengths, self.settings.ref_token_budget):
                sums = sequence_logprobs(
                    self.model, [prompt_ids[i] for i in chunk], [completion_ids[i] for i in chunk],
                    self.settings.temperature, self.pad_id,
                )
                for i, v in zip(chunk, sums.tolist(), strict=True):
                    out[i] = v
        return out

    def close(self) -> None:
        pass


# --- the vLLM backend ---

def _copy_key(model_dir: Path, temperature: float, dtype: str) -> str:
    """Names the tempered copy: the base model's files (name, size, mtime), T and dtype."""
    files = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in model_dir.iterdir() if p.is_file())
    blob = json.dumps([str(model_dir.resolve()), repr(float(temperature)), dtype, files])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def tempered_copy(model_dir: Path, temperature: float, dtype: str, cache_dir: Path) -> Path:
    """A copy of ``model_dir`` whose raw logits are the original's divided by ``temperature``.

    Written once per (model files, T, dtype) under ``cache_dir`` (temporary name, then rename, so
    replicas sharing the cache never see half a copy) and reused by later starts."""
    import torch
    from transformers import AutoModelForCausalLM

    from tba.model.tokenizer import load_tokenizer

    model_dir = Path(model_dir)
    out = Path(cache_dir) / f"tempered-{_copy_key(model_dir, temperature, dtype)}"
    if (out / TEMPERED_MARK).is_file():
        return out
    Path(cache_dir).mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-tempered-", dir=cache_dir))
    try:
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=getattr(torch, dtype))
        config = model.config
        if getattr(config, "final_logit_softcapping", None):
            raise ValueError(f"{model_dir}: logit soft-capping does not commute with dividing the logits by T; "
                             "use TBA_REF_BACKEND=transformers")
        head = model.get_output_embeddings()
        tied = head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
        with torch.no_grad():
            head.weight = torch.nn.Parameter(head.weight.detach().clone() / temperature)  # clone: unties
            if getattr(head, "bias", None) is not None:
                head.bias = torch.nn.Parameter(head.bias.detach().clone() / temperature)
        if tied or getattr(config, "tie_word_embeddings", False):
            config.tie_word_embeddings = False
            if hasattr(model, "_tied_weights_keys"):
                model._tied_weights_keys = None
        model.save_pretrained(tmp, safe_serialization=True)
        load_tokenizer(model_dir).save_pretrained(tmp)
        (tmp / TEMPERED_MARK).write_text(json.dumps({"source": str(model_dir.resolve()), "temperature": temperature,
                                                     "dtype": dtype, "untied": bool(tied)}))
        try:
            os.replace(tmp, out)
        except OSError:  # another replica renamed its copy first: use that one
            if not (out / TEMPERED_MARK).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("temperature-scaled reference copy (T=%s) of %s written to %s", temperature, model_dir, out)
    return out


def allowed_cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


def reference_cpu_bind(settings: SearcherSettings, environ: dict[str, str] | None = None) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for the reference engine's worker.

    ``ref_cpu_bind`` if set. Otherwise, when the generation engine's binding was chosen explicitly
    (VLLM_CPU_OMP_THREADS_BIND set, e.g. by ``tba up`` or a manifest), the same binding. Under vLLM's
    automatic binding (the worker takes all cores of the first NUMA node but the last, which it
    reserves for this process), the reserved core: the reference worker then never competes with
    the generation worker."""
    environ = os.environ if environ is None else environ
    if settings.ref_cpu_bind:
        return settings.ref_cpu_bind
    explicit = environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto")
    if explicit != "auto":
        return explicit
    try:
        from vllm.utils import cpu_resource_utils as cr

        cpus = cr.get_allowed_cpu_list()
        node = cr.get_visible_memory_node()[0]
        on_node: dict[int, int] = {}
        for cpu in cpus:  # one logical CPU per physical core (the highest id), as vLLM's x86 auto binding
            if cpu.numa_node == node:
                on_node[cpu.physical_core] = max(cpu.id, on_node.get(cpu.physical_core, -1))
        return str(max(on_node.values()))
    except Exception as err:  # noqa: BLE001 (vLLM internals moved: fall back to the last allowed CPU)
        log.debug("cannot read vLLM's CPU topology (%s); binding the reference engine to the last CPU", err)
        return str(allowed_cpus()[-1])


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """Set variables while the engine's processes spawn (they read them at start), then restore."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class VllmReference:
    """A second vLLM engine on the temperature-scaled base model; scores with ``prompt_logprobs``."""

    backend = "vllm"

    def __init__(self, settings: SearcherSettings) -> None:
        from vllm import LLM, SamplingParams
        from vllm.platforms import current_platform

        self.settings = settings
        cache = settings.ref_cache_dir or Path(tempfile.gettempdir()) / "tba-reference"
        self.model_dir = tempered_copy(Path(settings.model), settings.temperature, settings.dtype, cache)
        on_cpu = current_platform.is_cpu()
        options, env = engine_options(settings, on_cpu)
        options.update(
            # prompt+completion fills up to max_model_len; the one token generated after it needs a slot.
            max_model_len=settings.max_model_len + 1,
            enable_prefix_caching=False,  # requests with prompt log-probs never read the prefix cache
            seed=settings.seed,
        )
        # The extra slot holds the throwaway generated token, never fed through the model: no position
        # beyond the model's limit is computed, so allow max_model_len + 1 even at the model's limit.
        env["VLLM_ALLOW_LONG_MAX_MODEL_LEN"] = "1"
        if on_cpu:
            env["VLLM_CPU_OMP_THREADS_BIND"] = reference_cpu_bind(settings)
        else:
            options["gpu_memory_utilization"] = settings.ref_gpu_memory_utilization
        started = time.monotonic()
        with _environment(env):
            self.llm = LLM(model=str(self.model_dir), **options)
        self.params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False, temperature=1.0,
                                     flat_logprobs=True)
        self.logprobs([[0, 1]], [[1]])  # warm-up: the first request of an engine is slow
        log.info("reference engine up in %.1f s on %s (cores %s)", time.monotonic() - started, self.model_dir,
                 env.get("VLLM_CPU_OMP_THREADS_BIND", "-"))

    def logprobs(self, prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]]) -> list[float]:
        from vllm.inputs import TokensPrompt

        seqs = [list(p) + list(c) for p, c in zip(prompt_ids, completion_ids, strict=True)]
        prompts = [TokensPrompt(prompt_token_ids=s) for s in seqs]
        # Guarded: a reference engine that a shutdown signal reached raises EngineStopped instead of hanging.
        outputs = guarded_call(lambda: self.llm.generate(prompts, self.params, use_tqdm=False),
                               lambda: engine_alive(self.llm), "reference scoring")
        return [_completion_sum(o.prompt_logprobs, seq, len(prompt))
                for o, seq, prompt in zip(outputs, seqs, prompt_ids, strict=True)]

    def close(self) -> None:
        core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()


def _completion_sum(prompt_logprobs, seq: list[int], start: int) -> float:
    """Sum of log p(seq[i] | seq[:i]) over the completion positions ``start..len(seq)-1``.

    ``prompt_logprobs`` holds, per position, the scored token's entry (and no others: top-0); read
    flat (no per-position dict) when vLLM returns :class:`FlatLogprobs`."""
    starts = getattr(prompt_logprobs, "start_indices", None)
    if starts is not None:
        ids, values = prompt_logprobs.token_ids, prompt_logprobs.logprobs
        picked = [starts[i] for i in range(start, len(seq))]
        if all(ids[j] == seq[i] for i, j in zip(range(start, len(seq)), picked, strict=True)):
            return math.fsum(values[j] for j in picked)
    return math.fsum(prompt_logprobs[i][seq[i]].logprob for i in range(start, len(seq)))


def make_reference(settings: SearcherSettings, pad_id: int) -> Reference:
    from vllm.platforms import current_platform

    backend = resolve_backend(settings, current_platform.is_cpu())
    if backend == "vllm":
        return VllmReference(settings)
    return TransformersReference(settings, pad_id)
