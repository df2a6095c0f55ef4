"""Imported into vLLM's worker processes on CPU hosts (``worker_extension_cls``): idle workers sleep.

vLLM's CPU worker waits for its next step on a shared-memory queue, and after every message it spins
(``sched_yield``) for a whole second before it sleeps on a socket. Where searchers, their reference
engines and the trainer share a few cores, that second after every batch is taken from the others:
in a ``tba up`` run on 2 cores the four engine workers used 1.3 cores while the trainer got 0.36.
Importing this module shortens the window to ``TBA_WORKER_SPIN_SECONDS`` (set by the engine from
the searcher's settings) before the worker builds its queues. The cost is a socket wake-up, well
under a millisecond, on the first step after a pause; steps of one batch follow each other faster
than the window, so generation itself never sleeps.
"""

from __future__ import annotations

import logging
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


class QuietWorker:
    """The extension class vLLM mixes into its worker; importing the module is what matters."""

    def spin_window(self) -> float | None:
        """The busy-loop window this worker's queues use (``collective_rpc("spin_window")``)."""
        from vllm.distributed.device_communicators.shm_broadcast import SpinCondition

        defaults = SpinCondition.__init__.__defaults__
        return float(defaults[0]) if defaults else None


if SPIN_ENV in os.environ:
    shorten_spin(float(os.environ[SPIN_ENV]))
