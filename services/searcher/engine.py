"""The vLLM engine of one searcher: generation with behaviour log-probs, and in-place weight reload.

The same code runs on vLLM's CPU build here and on CUDA hosts; only the
engine options differ (settings). ``logprobs_mode="processed_logprobs"``
makes vLLM report log-probs after temperature scaling, so a completion's
``cumulative_logprob`` is log pi(y|x) under logits/T, the quantity the trainer
computes with ``tba.model.logprobs``. Reload goes through vLLM's in-place
``reload_weights`` (one ``collective_rpc``, worker_ext.py): the engine is never
restarted to change weights. In a LoRA run (``lora_rank`` > 0) the engine keeps the base weights and a
checkpoint is an adapter: it is added under a new adapter id (its version), every
batch after that asks for it, and the previous one is removed. Build an
:class:`Engine` only from ``if __name__ == "__main__"`` (or a test): vLLM's
engine core is a spawned process.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, get_args

from services.searcher.cpus import pin_engine_core, spare_cpus
from services.searcher.startup import WEIGHT_PATTERNS
from services.searcher.worker_ext import CAST_DTYPE_ENV, SPIN_ENV
from tba.model.adapters import is_adapter, vllm_max_rank
from tba.model.precision import computes_bf16
from tba.schemas import FinishReason
from tba.settings import SearcherSettings

if TYPE_CHECKING:
    from vllm.lora.request import LoRARequest

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class Completion:
    """One sampled completion as the engine returned it (token ids include EOS if emitted), or one episode of
    a multi-turn task (:mod:`tba.model.episodes`): the model's turns and the environment's ``env_spans``, the
    environment's ``reward`` (None: the task's reward of the text), and why the environment failed."""

    token_ids: list[int]
    logprob_sum: float
    finish_reason: FinishReason
    token_logprobs: list[float] | None = None
    env_spans: list[list[int]] | None = None
    reward: float | None = None
    failure: str | None = None


def finish_reason(reason: object) -> FinishReason:
    """vLLM's reason as the wire schema states it: any reason other than a stop or the length limit (an
    aborted or failed request) ends the completion early, which the schema calls ``abort``."""
    text = str(reason)
    for known in get_args(FinishReason):
        if text == known:
            return known
    return "abort"


def chosen_logprob(step: dict[int, Any] | None, token: int) -> float:
    """The log-prob vLLM reported for the token it chose at one step (it always reports the chosen one)."""
    if step is None or token not in step:
        raise RuntimeError(f"vLLM returned no log-prob for generated token {token}")
    return float(step[token].logprob)


class ReloadError(RuntimeError):
    """The engine could not load a checkpoint; it still serves the weights it had."""


class EngineStopped(RuntimeError):
    """The engine core exited (a shutdown signal reached it): it can neither load nor generate any more."""


def engine_alive(llm) -> bool:
    """False once vLLM marked the engine dead or one of its engine-core processes exited."""
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    resources = getattr(core, "resources", None)
    if resources is None:  # an in-process engine core: it lives as long as we do
        return True
    if getattr(resources, "engine_dead", False):
        return False
    processes = getattr(getattr(resources, "engine_manager", None), "processes", None) or []
    return all(p.is_alive() for p in processes)


def guarded_call(fn: Callable[[], T], alive: Callable[[], bool], what: str, poll: float = 0.1) -> T:
    """``fn()``, but raise :class:`EngineStopped` instead of waiting forever on a dead engine.

    vLLM's synchronous client waits for a reply without a timeout: a call sent to an engine core that
    is exiting never returns. The call runs on a helper thread while this one watches the engine;
    once it is dead the helper is left behind (a daemon, blocked on a reply that will not come)."""
    result: list[T] = []
    error: list[BaseException] = []
    done = threading.Event()

    def target() -> None:
        try:
            result.append(fn())
        except BaseException as err:  # noqa: BLE001 (handed to the caller)
            error.append(err)
        finally:
            done.set()

    threading.Thread(target=target, name=f"engine-call-{what}", daemon=True).start()
    while not done.wait(poll):
        if not alive():
            done.wait(poll)  # a reply already on its way still counts
            if not done.is_set():
                raise EngineStopped(f"the engine core exited during {what}")
    if error:
        if not alive():
            raise EngineStopped(f"the engine core exited during {what} ({error[0]})") from error[0]
        raise error[0]
    return result[0]


def unloadable(weights_dir: Path) -> str | None:
    """Why ``weights_dir`` cannot be loaded at all (None: it looks loadable): checked before the engine is asked,
    so that a checkpoint gone from disk fails with the engine's weights untouched."""
    if not weights_dir.is_dir():
        return "the directory is gone"
    if is_adapter(weights_dir):
        return None
    if not (weights_dir / "config.json").is_file():
        return "it holds no config.json"
    if not any(next(weights_dir.glob(pattern), None) for pattern in WEIGHT_PATTERNS):
        return "it holds no weights"
    return None


def should_restore(stop_requested: bool, alive: bool) -> bool:
    """After a failed reload: load the previous weights back only into a live engine that is not stopping.

    A shutdown signal that reached the engine core too makes the load fail; restoring would then send
    another call to a dying engine (which hung before this check). Nothing is generated after a stop,
    so the old weights are not needed."""
    return alive and not stop_requested


def generation_dtype(settings: SearcherSettings, on_cpu: bool, bf16_cpu: Callable[[], bool] = computes_bf16) -> str:
    """The dtype the engine generates in: ``generation_dtype`` as set, or for ``auto`` bfloat16 on a CPU
    that computes it in hardware, else the model's ``dtype``.

    Lower precision changes only which completions are sampled: the trainer scores every sample with its
    own log-probs and the reference pass keeps ``dtype``, and TB is valid for samples from any policy."""
    if settings.generation_dtype != "auto":
        return settings.generation_dtype
    return "bfloat16" if on_cpu and bf16_cpu() else settings.dtype


def engine_options(settings: SearcherSettings, on_cpu: bool) -> tuple[dict[str, Any], dict[str, str]]:
    """The generation engine's ``LLM`` options, and the environment its processes must start with
    (vLLM's CPU build reads some settings only from there)."""
    options: dict[str, Any] = dict(
        dtype=generation_dtype(settings, on_cpu),
        tensor_parallel_size=settings.tensor_parallel_size,
        enforce_eager=on_cpu if settings.enforce_eager is None else settings.enforce_eager,
    )
    # Our worker methods (a tied output layer after a reload); on the CPU, importing them also makes idle
    # workers sleep instead of spinning on cores the trainer and the other engines need.
    options["worker_extension_cls"] = "services.searcher.worker_ext.QuietWorker"
    if settings.lora_rank:  # one adapter serves at a time; two fit while the next replaces the last
        options.update(enable_lora=True, max_lora_rank=vllm_max_rank(settings.lora_rank), max_loras=1, max_cpu_loras=2)
    env: dict[str, str] = {CAST_DTYPE_ENV: options["dtype"]}  # its processes drop the warning about that cast
    if on_cpu:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, math.ceil(settings.kv_cache_gib)))  # whole GiB
        env[SPIN_ENV] = repr(settings.worker_spin_seconds)
    return options, env


class Engine:
    """A vLLM ``LLM`` plus the policy version its weights carry."""

    def __init__(self, settings: SearcherSettings, weights_dir: Path, version: int, seed: int = 0) -> None:
        from vllm import LLM
        from vllm.platforms import current_platform

        on_cpu = current_platform.is_cpu()
        options, env = engine_options(settings, on_cpu)
        options.update(max_model_len=settings.max_model_len, logprobs_mode="processed_logprobs", seed=seed)
        if not on_cpu:
            options["gpu_memory_utilization"] = settings.gpu_memory_utilization
        os.environ.update(env)  # read by the engine's processes as they start
        started = time.monotonic()
        self.llm = LLM(model=str(weights_dir), **options)
        if on_cpu:  # the engine core schedules every step: keep it off the worker's cores (cpus.py)
            pin_engine_core(self.llm, spare_cpus())
        self.settings = settings
        self.on_cpu = on_cpu
        self.weights_dir = Path(weights_dir)
        self.version = version
        self.dtype: str = options["dtype"]
        self.adapter: LoRARequest | None = None  # the LoRARequest every batch asks for; None: the weights alone
        log.info(
            "vLLM engine up in %.1f s with %s (version %d, %s)",
            time.monotonic() - started,
            weights_dir,
            version,
            self.dtype,
        )

    def sampling_params(
        self, n: int, temperature: float, max_tokens: int, logprobs: bool = True, stop: Sequence[str] = ()
    ):
        """vLLM's parameters for S completions per prompt.

        A completion ends at one of the model's EOS tokens (vLLM reads them from the generation config and
        the tokenizer), at a configured stop string, or after ``max_tokens``. Rewards are computed on our own
        tokenizer's decode, so vLLM's detokenizer runs only where stop strings need it, and a completion keeps
        its stop string: the text the reward reads is the decode of exactly the ids the trainer scores.
        ``stop``: more stop strings (a multi-turn task's turn ends)."""
        from vllm import SamplingParams

        stops = list(self.settings.stop) + list(stop)
        return SamplingParams(
            n=n,
            temperature=temperature,
            max_tokens=max_tokens,
            logprobs=0 if logprobs else None,
            stop=stops or None,
            include_stop_str_in_output=bool(stops),
            detokenize=bool(stops),
        )

    def generate(self, prompt_ids: Sequence[Sequence[int]], params) -> list[list[Completion]]:
        """S completions per prompt, in prompt order (``params``: one for all, or one per prompt)."""
        from vllm.inputs import TokensPrompt

        prompts = [TokensPrompt(prompt_token_ids=list(ids)) for ids in prompt_ids]
        outputs = self.llm.generate(prompts, params, use_tqdm=False, lora_request=self.adapter)
        per_token = self.settings.per_token_logprobs
        result = []
        for out in outputs:
            group = []
            for c in out.outputs:
                ids = list(c.token_ids)
                token_lp = None
                if per_token and c.logprobs is not None:
                    token_lp = [chosen_logprob(step, tok) for step, tok in zip(c.logprobs, ids, strict=True)]
                logprob_sum = c.cumulative_logprob if c.cumulative_logprob is not None else math.nan
                group.append(Completion(ids, float(logprob_sum), finish_reason(c.finish_reason), token_lp))
            result.append(group)
        return result

    def alive(self) -> bool:
        return engine_alive(self.llm)

    def reload(self, weights_dir: Path, version: int, stopping: Callable[[], bool] = lambda: False) -> float:
        """Load ``weights_dir`` in place; returns the pause in seconds. On failure the engine serves the weights
        it served before (:class:`ReloadError`), loaded back from their directory when the failed load may have
        touched them: never the base model, unless that is what it served.

        ``stopping`` tells whether a shutdown was requested: a reload that fails then (the signal
        reached the engine core too) raises :class:`EngineStopped` instead of restoring."""
        started = time.monotonic()
        missing = unloadable(Path(weights_dir))
        if missing is not None:  # nothing was sent to the engine: its weights are untouched
            raise ReloadError(f"could not load {weights_dir}: {missing}")
        if is_adapter(weights_dir):
            self._load_adapter(Path(weights_dir), version)
            self.version = version
            return time.monotonic() - started
        try:
            self._load(weights_dir)
        except Exception as err:
            if not should_restore(stopping(), self.alive()):
                raise EngineStopped(
                    f"reload of {weights_dir} cut short by shutdown ({err}); the previous weights are not restored"
                ) from err
            log.error(
                "reload of %s failed (%s); loading back v%d from %s", weights_dir, err, self.version, self.weights_dir
            )
            try:
                self._load(self.weights_dir)
            except EngineStopped:
                raise
            except Exception as restore_err:
                raise RuntimeError(
                    f"reload of {weights_dir} failed and the weights served before, v{self.version} in "
                    f"{self.weights_dir}, could not be loaded back ({restore_err}): refusing to generate with mixed "
                    "weights"
                ) from err
            raise ReloadError(f"could not load {weights_dir}: {err}") from err
        self.weights_dir = Path(weights_dir)
        self.version = version
        self._drop_adapter()
        return time.monotonic() - started

    def _load_adapter(self, adapter_dir: Path, version: int) -> None:
        """Add ``adapter_dir`` as adapter ``version``; the previous adapter is removed once the new one is in.

        A failed load leaves the engine serving what it served (:class:`ReloadError`)."""
        from vllm.lora.request import LoRARequest

        if not self.settings.lora_rank:
            raise ReloadError(
                f"{adapter_dir} is a LoRA adapter but TBA_LORA_RANK is 0 (the engine was started "
                "without adapters): set TBA_LORA_RANK to the trainer's rank"
            )
        request = LoRARequest(f"policy-v{version}", version, str(adapter_dir))
        try:
            added = guarded_call(lambda: self.llm.llm_engine.add_lora(request), self.alive, "add_lora")
        except EngineStopped:
            raise
        except Exception as err:
            raise ReloadError(f"could not load adapter {adapter_dir}: {err}") from err
        if not added:
            raise ReloadError(f"vLLM did not take adapter {adapter_dir}")
        self._drop_adapter()
        self.adapter = request

    def _drop_adapter(self) -> None:
        if self.adapter is not None:
            old, self.adapter = self.adapter, None
            guarded_call(lambda: self.llm.llm_engine.remove_lora(old.lora_int_id), self.alive, "remove_lora")

    def _load(self, weights_dir: Path) -> None:
        def load() -> None:
            # vLLM's reload, and a tied output layer put on the new embeddings (worker_ext.py)
            self.llm.collective_rpc("reload_in_place", args=(str(weights_dir),))
            # Cached prompt KV was computed with the old weights: it must not serve the new ones.
            self.llm.reset_prefix_cache()

        guarded_call(load, self.alive, "reload_weights")

    def close(self) -> None:
        """Stop the engine core process now rather than at interpreter exit."""
        core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
