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
"""

from __future__ import annotations

import logging
import multiprocessing
import os

log = logging.getLogger(__name__)
SPIN_ENV = "TBA_WORKER_SPIN_SECONDS"


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
    """The vLLM plugin: in a process vLLM started (never the searcher's own), apply the spin window."""
    if multiprocessing.parent_process() is not None and SPIN_ENV in os.environ:
        shorten_spin(float(os.environ[SPIN_ENV]))


class QuietWorker:
    """The extension class vLLM mixes into its worker (every platform): importing the module applies the spin
    window above; its methods are called through ``collective_rpc``."""

    def refresh_tied_output_layer(self) -> bool:
        """After ``reload_weights``, rebuild a tied output layer's kernel from the new embeddings; True if it did.

        On CPU hosts vLLM packs each matrix for its GEMM kernels when weights are loaded (the output layer's
        packed copy lives in ``lm_head.cpu_linear``). Its in-place reload (0.32) re-processes every layer that
        loaded tensors from the checkpoint; a tied output layer has none of its own there (``lm_head.weight``
        is not saved: it is the embeddings), so it keeps the packed copy of the old embeddings while the
        embedding lookup uses the new ones ("ParallelLMHead: Failed to load weights" in vLLM's log).
        Processing it again packs the current, shared tensor (tens of ms for 49k x 576)."""
        model = self.model_runner.get_model()
        head = getattr(model, "lm_head", None)
        method = getattr(head, "quant_method", None)
        if not getattr(getattr(model, "config", None), "tie_word_embeddings", False) or method is None:
            return False
        method.process_weights_after_loading(head)
        return True

    def spin_window(self) -> float | None:
        """The busy-loop window this worker's queues use (``collective_rpc("spin_window")``)."""
        from vllm.distributed.device_communicators.shm_broadcast import SpinCondition

        defaults = SpinCondition.__init__.__defaults__
        return float(defaults[0]) if defaults else None


configure_process()
