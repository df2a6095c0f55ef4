"""Runs inside the processes vLLM starts on CPU hosts: their idle loops sleep instead of spinning.

vLLM's engine core and workers wait for each other on shared-memory queues, and after every message
the reader spins (``sched_yield``) for a whole second before it sleeps on a socket. Where searchers
and the trainer share a few cores, those seconds are taken from the others: in a ``tba up`` run on 2
cores the idle engine workers used 1.3 cores while the trainer got 0.36, and in the searcher
benchmark the engine core, spinning while its worker computes, used 0.93 of a core (0.24 with the
short window). :func:`configure_process` shortens the window to ``TBA_WORKER_SPIN_SECONDS`` (set by
the engine from the searcher's settings) before the process builds its queues. The cost is a socket
wake-up, well under a millisecond, on a wait longer than the window. Two ways in, one function: vLLM
loads it as a general plugin in every process it starts (entry point ``vllm.general_plugins``, so
the engine core too), and importing this module as the worker extension (``worker_extension_cls``)
runs it in the workers where the package's entry points are not installed.

The worker extension also carries the searcher's in-place reload (:meth:`QuietWorker.reload_in_place`):
vLLM's reload plus what it leaves undone for a model with tied embeddings.

Models and checkpoints hold float32 master weights, which the engine casts into its own dtype (bfloat16
where the CPU computes it) when it starts and at every reload: vLLM warns once per weight about that cast
(about twenty lines a reload for the tiny model, thousands an hour). The engine names its dtype in
:data:`CAST_DTYPE_ENV`, and in every process vLLM starts :class:`IntendedCasts` drops exactly that warning
for exactly that cast; every other line passes.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
from typing import TYPE_CHECKING, Any

log = logging.getLogger(__name__)
SPIN_ENV = "TBA_WORKER_SPIN_SECONDS"
# vLLM's per-weight warning when a checkpoint tensor's dtype differs from its parameter's (0.32), and its logger.
CAST_WARNING = "Attempted to load weight %s with dtype %s into parameter with dtype %s"
CAST_LOGGER = "vllm.model_executor.models.utils"
CAST_DTYPE_ENV = "TBA_ENGINE_DTYPE"  # set by the engine for its own processes (not a setting): the dtype it casts to


class IntendedCasts(logging.Filter):
    """Drops vLLM's :data:`CAST_WARNING` for a float32 checkpoint tensor loaded into a parameter of ``dtype``
    (the cast every reload of a master-weights checkpoint makes on purpose); lets every other record through."""

    def __init__(self, dtype: object) -> None:
        super().__init__()
        text = str(dtype)
        self.dtype = text if text.startswith("torch.") else f"torch.{text}"  # "bfloat16" or torch.bfloat16
        self.dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        intended = (
            record.msg == CAST_WARNING
            and isinstance(args, tuple)
            and len(args) == 3
            and str(args[1]) == "torch.float32"
            and str(args[2]) == self.dtype
        )
        self.dropped += intended
        return not intended


def shorten_spin(seconds: float) -> bool:
    """Make ``seconds`` the default busy-loop window of vLLM's shared-memory queue readers.

    Returns False (and changes nothing) on a vLLM whose queue does not look as expected."""
    try:
        from vllm.distributed.device_communicators.shm_broadcast import SpinCondition
    except ImportError:
        return False
    init = SpinCondition.__init__
    if init.__defaults__ is None or len(init.__defaults__) != 1:
        log.warning("vLLM's SpinCondition changed shape; leaving its busy loop alone")
        return False
    init.__defaults__ = (float(seconds),)
    return True


def configure_process() -> None:
    """The vLLM plugin: in a process vLLM started (never the searcher's own), apply the spin window and drop
    the intended casts' warnings."""
    if multiprocessing.parent_process() is None:
        return
    if SPIN_ENV in os.environ:
        shorten_spin(float(os.environ[SPIN_ENV]))
    if CAST_DTYPE_ENV in os.environ and not any(isinstance(f, IntendedCasts) for f in _cast_logger().filters):
        _cast_logger().addFilter(IntendedCasts(os.environ[CAST_DTYPE_ENV]))


def _cast_logger() -> logging.Logger:
    return logging.getLogger(CAST_LOGGER)


class QuietWorker:
    """The extension class vLLM mixes into its worker (every platform): importing the module applies the spin
    window above; its methods are called through ``collective_rpc``."""

    if TYPE_CHECKING:  # what the worker it is mixed into provides
        model_runner: Any

        def reload_weights(self, weights_path: str) -> None: ...

    def reload_in_place(self, weights_path: str) -> None:
        """vLLM's in-place reload of ``weights_path``, then a tied output layer brought onto the new weights.

        On CPU hosts vLLM packs each matrix for its GEMM kernels when weights are loaded (a layer's packed
        copy lives in its ``cpu_linear``). Its in-place reload (0.32) re-processes every layer that loaded
        tensors from the checkpoint; a tied output layer has none of its own there (``lm_head.weight`` is
        not saved: it is the embeddings), so it would keep the packed copy of the OLD embeddings while the
        embedding lookup uses the new ones ("ParallelLMHead: Failed to load weights" in vLLM's log). The
        reload does re-pack the embedding layer itself, from the very tensor the output layer shares: that
        kernel is taken over when the reload visibly rebuilt it (a new ``cpu_linear``); otherwise the output
        layer is packed again (~70 ms for 49k x 576 on one core). On GPUs neither layer has a packed copy."""
        model = self.model_runner.get_model()
        head = getattr(model, "lm_head", None)
        embed = getattr(getattr(model, "model", None), "embed_tokens", None)
        before = getattr(embed, "cpu_linear", None)
        self.reload_weights(weights_path=weights_path)
        method = getattr(head, "quant_method", None)
        tied = getattr(getattr(model, "config", None), "tie_word_embeddings", False)
        if not tied or head is None or method is None:
            return
        after = getattr(embed, "cpu_linear", None)
        if embed is not None and after is not None and after is not before and head.weight is embed.weight:
            head.cpu_linear = after  # the kernel the reload just packed from the shared tensor
        else:
            method.process_weights_after_loading(head)

    def spin_window(self) -> float | None:
        """The busy-loop window this worker's queues use (``collective_rpc("spin_window")``)."""
        from vllm.distributed.device_communicators.shm_broadcast import SpinCondition

        defaults = SpinCondition.__init__.__defaults__
        return float(defaults[0]) if defaults else None


configure_process()
