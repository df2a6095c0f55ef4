"""The searcher engine's pure parts: the engine-call guard and restore decision that keep a shutdown
during a reload from hanging, the shortened spin of vLLM's queues, where the processes and the
scoring thread run on a CPU host, and the dtype it generates in."""

from __future__ import annotations

import os
import threading
import time

import pytest

from services.searcher.cpus import computes_bf16, generation_cpus, lower_thread_priority, pinned, spare_cpus
from services.searcher.engine import EngineStopped, generation_dtype, guarded_call, should_restore
from tba.procs import parse_cpu_list
from tba.settings import SearcherSettings


def test_restore_only_into_a_live_engine_that_is_not_stopping() -> None:
    assert should_restore(stop_requested=False, alive=True)
    assert not should_restore(stop_requested=True, alive=True)  # shutting down: nothing will be generated
    assert not should_restore(stop_requested=False, alive=False)  # dead: a call would never return
    assert not should_restore(stop_requested=True, alive=False)


def test_guarded_call_returns_and_raises_like_the_call() -> None:
    assert guarded_call(lambda: 42, lambda: True, "t") == 42
    with pytest.raises(ValueError, match="boom"):
        guarded_call(lambda: (_ for _ in ()).throw(ValueError("boom")), lambda: True, "t")


def test_guarded_call_gives_up_on_a_dead_engine_instead_of_hanging() -> None:
    never = threading.Event()  # a reply that will not come, as from an engine core that exited
    dead = threading.Event()
    threading.Timer(0.3, dead.set).start()
    t0 = time.monotonic()
    try:
        with pytest.raises(EngineStopped, match="reload_weights"):
            guarded_call(never.wait, lambda: not dead.is_set(), "reload_weights", poll=0.05)
    finally:
        never.set()  # release the helper thread
    assert time.monotonic() - t0 < 5
    # A call that failed because the engine died reports the death, not the call's own error.
    with pytest.raises(EngineStopped):
        guarded_call(lambda: (_ for _ in ()).throw(RuntimeError("socket closed")), lambda: False, "t")


def test_shorten_spin_sets_the_queue_readers_default() -> None:
    from vllm.distributed.device_communicators.shm_broadcast import SpinCondition

    from services.searcher.worker_ext import shorten_spin

    before = SpinCondition.__init__.__defaults__
    try:
        assert shorten_spin(0.02) is True
        assert SpinCondition.__init__.__defaults__ == (0.02,)
    finally:
        SpinCondition.__init__.__defaults__ = before


def test_cpu_lists_parse_as_vllm_writes_them() -> None:
    assert parse_cpu_list("3") == [3]
    assert parse_cpu_list("0-2,5|6-7") == [0, 1, 2, 5, 6, 7]  # '|' separates tensor-parallel ranks
    with pytest.raises(ValueError, match="VLLM_CPU_OMP_THREADS_BIND='0-x': '0-x' is not a CPU id or range"):
        parse_cpu_list("0-x", "VLLM_CPU_OMP_THREADS_BIND")
    with pytest.raises(ValueError, match="'3-1' is not a CPU id or range"):
        parse_cpu_list("3-1")


def test_spare_cpus_are_the_allowed_ones_the_generation_worker_leaves() -> None:
    allowed = sorted(os.sched_getaffinity(0))
    assert generation_cpus({"VLLM_CPU_OMP_THREADS_BIND": "nobind"}) is None
    assert spare_cpus({"VLLM_CPU_OMP_THREADS_BIND": "nobind"}) == []  # the kernel places everything
    assert spare_cpus({"VLLM_CPU_OMP_THREADS_BIND": str(allowed[0])}) == allowed[1:]
    gen = generation_cpus({})  # vLLM's automatic binding: every core but the last
    assert gen and set(gen) <= set(allowed)
    assert spare_cpus({}) == [c for c in allowed if c not in gen]
    if len(allowed) > 1:
        assert spare_cpus({}) and not set(spare_cpus({})) & set(gen)


def test_lower_thread_priority_changes_only_the_calling_thread() -> None:
    seen: dict[str, int] = {}

    def background() -> None:
        lower_thread_priority(7)
        seen["nice"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        lower_thread_priority(3)  # never raises a priority back (it could not, unprivileged)
        seen["after"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    thread = threading.Thread(target=background)
    thread.start()
    thread.join()
    assert seen == {"nice": 7, "after": 7}
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == 0  # this thread is untouched


def test_pinned_moves_the_calling_thread_and_puts_it_back() -> None:
    before = os.sched_getaffinity(0)
    cpu = sorted(before)[-1]
    with pinned([cpu]):
        assert os.sched_getaffinity(0) == {cpu}
        started: dict[str, set[int]] = {}
        thread = threading.Thread(target=lambda: started.update(cpus=os.sched_getaffinity(0)))
        thread.start()
        thread.join()
        assert started["cpus"] == {cpu}  # threads started inside inherit the placement
    assert os.sched_getaffinity(0) == before
    with pinned([]):  # nothing spare (nobind): nothing changes
        assert os.sched_getaffinity(0) == before


SAPPHIRE_RAPIDS = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
SKYLAKE = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512bw\nbugs\t\t: amx_bf16\n"


def test_bf16_arithmetic_is_read_from_the_cpu_flags_only() -> None:
    assert computes_bf16(SAPPHIRE_RAPIDS)
    assert computes_bf16("flags\t\t: avx2 avx512_bf16\n")  # AVX512-BF16 without AMX (Cooper Lake, Zen 4)
    assert not computes_bf16(SKYLAKE)  # the word elsewhere than on the flags line does not count
    assert not computes_bf16("")


def test_generation_dtype_auto_is_bf16_only_on_a_cpu_that_computes_it() -> None:
    auto = SearcherSettings(dtype="float32")
    assert generation_dtype(auto, on_cpu=True, bf16_cpu=lambda: True) == "bfloat16"
    assert generation_dtype(auto, on_cpu=True, bf16_cpu=lambda: False) == "float32"
    assert generation_dtype(auto, on_cpu=False, bf16_cpu=lambda: True) == "float32"  # GPUs: TBA_DTYPE
    assert generation_dtype(SearcherSettings(dtype="bfloat16"), on_cpu=False) == "bfloat16"
    pinned_fp32 = SearcherSettings(generation_dtype="float32")
    assert generation_dtype(pinned_fp32, on_cpu=True, bf16_cpu=lambda: True) == "float32"
    with pytest.raises(ValueError, match="generation_dtype"):
        SearcherSettings(generation_dtype="int8")
