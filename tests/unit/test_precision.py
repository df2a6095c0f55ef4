"""The trainer's compute dtype: bfloat16 only where it pays (GPUs, CPUs with bf16 arithmetic), float32 elsewhere."""

from __future__ import annotations

import logging

import pytest

from tba.model.precision import compute_dtype


@pytest.mark.parametrize(
    ("dtype", "device", "bf16_cpu", "expected"),
    [
        ("bfloat16", "cuda", False, "bfloat16"),  # the GPU computes it whatever the host CPU does
        ("bfloat16", "cpu", True, "bfloat16"),  # AMX or AVX512-BF16
        ("bfloat16", "cpu", False, "float32"),  # emulated: slower than float32
        ("float16", "cpu", False, "float16"),  # only bfloat16 is redirected
        ("float32", "cpu", True, "float32"),
    ],
)
def test_bfloat16_is_computed_only_where_the_hardware_does_it(
    dtype: str, device: str, bf16_cpu: bool, expected: str
) -> None:
    assert compute_dtype(dtype, device, bf16_cpu) == expected


def test_the_fallback_to_float32_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        compute_dtype("bfloat16", "cpu", bf16_cpu=False)
    assert "no bf16 arithmetic" in caplog.text
