"""How many CPU threads torch should use for in-process training and evaluation.

On a shared CPU, torch's intra-op thread pool degrades badly when its threads
outnumber the idle cores: measured here with other jobs running on both cores,
an SFT step took 60x longer with 2 threads than with 1. So ``0`` ("auto")
takes only the cores the load average leaves idle, at least one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager


def auto_threads() -> int:
    cores = os.cpu_count() or 1
    try:
        busy = os.getloadavg()[0]
    except OSError:
        return cores
    return max(1, min(cores, round(cores - busy)))


@contextmanager
def torch_threads(requested: int = 0) -> Iterator[int]:
    """Run the block with ``requested`` torch threads (0: :func:`auto_threads`), then restore."""
    import torch

    before = torch.get_num_threads()
    n = requested or auto_threads()
    torch.set_num_threads(n)
    try:
        yield n
    finally:
        torch.set_num_threads(before)
