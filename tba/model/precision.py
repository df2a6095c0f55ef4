"""Which precision a model computes in on this host: bfloat16 pays on GPUs and on CPUs that do bf16 arithmetic
in hardware; on other CPUs it is emulated and costs more than float32.

A SmolLM2-135M training step under bf16 autocast takes about 0.65x the float32 time on a CPU with AVX512-BF16,
and about twice the float32 time on one with AVX-512 but without it.
"""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger(__name__)

BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # /proc/cpuinfo flags of bf16 arithmetic in hardware


def computes_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this CPU does bf16 arithmetic in hardware (AMX or AVX512-BF16). ``cpuinfo``: the text of
    /proc/cpuinfo (read when None; no such file: False)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
    flags = {f for line in cpuinfo.splitlines() if line.startswith("flags") for f in line.split(":", 1)[-1].split()}
    return any(flag in flags for flag in BF16_FLAGS)


def compute_dtype(dtype: str, device_type: str, bf16_cpu: bool | None = None) -> str:
    """The dtype a trainer computes in for the setting ``dtype`` (``TBA_DTYPE``) on ``device_type``: as set,
    except bfloat16 on a CPU without bf16 arithmetic (``bf16_cpu``; None: this CPU), which computes in float32,
    the faster there; the weights stay float32 masters either way."""
    if dtype != "bfloat16" or device_type != "cpu":
        return dtype
    if computes_bf16() if bf16_cpu is None else bf16_cpu:
        return dtype
    log.warning("TBA_DTYPE=bfloat16: this CPU has no bf16 arithmetic (AMX or AVX512-BF16); computing in float32")
    return "float32"
