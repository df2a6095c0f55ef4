"""Each core's utilization over a run, from the kernel's counters (``/proc/stat``): the console's observer records
the counters with every timeline row, and the summary turns the first and last into a busy fraction per core.

Busy is everything but idle and iowait, for every process on the core (the run's and anything else the machine
runs), so a figure near 1.0 says the core was full, not that the run alone filled it.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

STAT = Path("/proc/stat")
IDLE_FIELDS = (3, 4)  # idle, iowait: of user nice system idle iowait irq softirq steal


def read_cpu_times(path: Path = STAT) -> dict[str, list[int]]:
    """Per core (``cpu0``, ``cpu1``, ...): [busy, total] jiffies since boot; {} where the file cannot be read."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    out = {}
    for line in lines:
        name, *fields = line.split()
        if name.startswith("cpu") and name != "cpu" and fields:
            counts = [int(f) for f in fields[:8]]
            idle = sum(counts[i] for i in IDLE_FIELDS if i < len(counts))
            out[name] = [sum(counts) - idle, sum(counts)]
    return out


def utilization(rows: Iterable[dict[str, Any]], key: str = "cpus") -> dict[str, float]:
    """Each core's busy fraction between the first and the last of ``rows`` that carry counters under ``key``."""
    with_counts = [r[key] for r in rows if r.get(key)]
    if len(with_counts) < 2:
        return {}
    first, last = with_counts[0], with_counts[-1]
    out = {}
    for cpu, (busy, total) in last.items():
        if cpu in first and total > first[cpu][1]:
            out[cpu] = round((busy - first[cpu][0]) / (total - first[cpu][1]), 4)
    return out
