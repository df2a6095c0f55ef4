"""The searcher engine's pure parts: the engine-call guard and restore decision that keep a shutdown
during a reload from hanging, what a failed reload loads back (the last good weights, with vLLM's calls
stubbed), the shortened spin of vLLM's queues, where the processes and the scoring thread run on a CPU
host, the dtype it generates in, and the one vLLM warning an in-place reload silences."""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import time
from pathlib import Path

import pytest

from services.searcher.cpus import generation_cpus, lower_thread_priority, pinned, spare_cpus
from services.searcher.engine import (
    Engine,
    EngineStopped,
    ReloadError,
    engine_options,
    generation_dtype,
    guarded_call,
    should_restore,
    unloadable,
)
from services.searcher.worker_ext import (
    CAST_DTYPE_ENV,
    CAST_LOGGER,
    CAST_WARNING,
    IntendedCasts,
    configure_process,
)
from tba.model.precision import computes_bf16
from tba.procs import parse_cpu_list, pin_threads, threads
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


def test_pin_threads_moves_the_threads_a_process_already_runs() -> None:
    """``sched_setaffinity(0, ...)`` moves only the caller: a helper started before must be moved too."""
    before = os.sched_getaffinity(0)
    cpu = sorted(before)[-1]
    go, done = threading.Event(), threading.Event()
    seen: dict[str, set[int]] = {}

    def helper() -> None:
        go.wait(10)
        seen["cpus"] = os.sched_getaffinity(0)
        done.set()

    thread = threading.Thread(target=helper)
    thread.start()
    try:
        pin_threads(os.getpid(), {cpu})
        assert os.sched_getaffinity(0) == {cpu}
    finally:
        go.set()
        done.wait(10)
        thread.join()
        pin_threads(os.getpid(), before)
    assert seen["cpus"] == {cpu}
    assert os.sched_getaffinity(0) == before
    assert threads(2**22 + 1) == []  # no such process: nothing to pin


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


class StubLLM:
    """Stands in for vLLM's ``LLM`` in :meth:`Engine.reload`'s decisions: records each in-place load and fails
    those of the directories in ``failing``."""

    def __init__(self, failing: set[Path]) -> None:
        self.failing = failing
        self.loads: list[Path] = []

    def collective_rpc(self, method: str, args: tuple = ()) -> list[None]:
        assert method == "reload_in_place"
        path = Path(args[0])
        self.loads.append(path)
        if path in self.failing:
            raise RuntimeError(f"cannot load {path}")
        return [None]

    def reset_prefix_cache(self) -> None:
        pass


def model_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    (path / "model.safetensors").write_bytes(b"weights")
    return path


def stub_engine(serving: Path, version: int, failing: set[Path], base: Path) -> Engine:
    engine = object.__new__(Engine)  # the decisions around vLLM's calls, without starting vLLM
    engine.llm = StubLLM(failing)
    engine.settings = SearcherSettings(model=base)
    engine.weights_dir, engine.version, engine.adapter, engine.on_cpu = serving, version, None, True
    return engine


def test_a_failed_reload_loads_back_the_last_good_weights_never_the_base(tmp_path: Path) -> None:
    base, good, bad = (model_dir(tmp_path / n) for n in ("base", "v7", "v9"))
    engine = stub_engine(good, 7, {bad}, base)
    with pytest.raises(ReloadError, match="cannot load"):
        engine.reload(bad, 9)
    assert engine.llm.loads == [bad, good]  # tried, then the weights it served loaded back
    assert (engine.weights_dir, engine.version) == (good, 7)


def test_a_searcher_that_never_loaded_anything_else_restores_the_base(tmp_path: Path) -> None:
    base, bad = model_dir(tmp_path / "base"), model_dir(tmp_path / "v3")
    engine = stub_engine(base, 0, {bad}, base)
    with pytest.raises(ReloadError):
        engine.reload(bad, 3)
    assert engine.llm.loads == [bad, base] and (engine.weights_dir, engine.version) == (base, 0)


def test_a_checkpoint_gone_from_disk_is_not_sent_to_the_engine(tmp_path: Path) -> None:
    base, good = model_dir(tmp_path / "base"), model_dir(tmp_path / "v7")
    engine = stub_engine(good, 7, set(), base)
    with pytest.raises(ReloadError, match="the directory is gone"):
        engine.reload(tmp_path / "v8", 8)
    assert engine.llm.loads == [] and engine.version == 7  # weights untouched: nothing to restore
    assert engine.reload(model_dir(tmp_path / "v9"), 9) >= 0 and (engine.version, engine.weights_dir.name) == (9, "v9")


def test_when_the_last_good_weights_cannot_be_loaded_back_it_refuses_to_go_on(tmp_path: Path) -> None:
    base, good, bad = (model_dir(tmp_path / n) for n in ("base", "v7", "v9"))
    engine = stub_engine(good, 7, {bad, good}, base)
    with pytest.raises(RuntimeError, match="refusing to generate with mixed weights"):
        engine.reload(bad, 9)
    assert base not in engine.llm.loads


def test_unloadable_names_what_is_missing(tmp_path: Path) -> None:
    assert unloadable(tmp_path / "nothing") == "the directory is gone"
    (tmp_path / "empty").mkdir()
    assert unloadable(tmp_path / "empty") == "it holds no config.json"
    (tmp_path / "empty" / "config.json").write_text("{}")
    assert unloadable(tmp_path / "empty") == "it holds no weights"
    assert unloadable(model_dir(tmp_path / "whole")) is None


def record(msg: str, *args: object, level: int = logging.WARNING) -> logging.LogRecord:
    return logging.LogRecord(CAST_LOGGER, level, "utils.py", 1, msg, args, None)


def test_only_the_intended_float32_cast_warning_is_dropped() -> None:
    import torch

    casts = IntendedCasts(torch.bfloat16)
    assert not casts.filter(record(CAST_WARNING, "layers.0.mlp.down_proj.weight", torch.float32, torch.bfloat16))
    assert casts.filter(record(CAST_WARNING, "w", torch.float16, torch.bfloat16))  # not our float32 master weights
    assert casts.filter(record(CAST_WARNING, "w", torch.float32, torch.float16))  # not the engine's dtype
    assert casts.filter(record("RotaryEmbedding: Failed to load weights"))  # every other warning passes
    assert casts.dropped == 1


def test_the_engine_names_its_dtype_to_its_processes_which_drop_only_that_cast(monkeypatch) -> None:
    import torch

    options, env = engine_options(SearcherSettings(generation_dtype="bfloat16"), on_cpu=True)
    assert env[CAST_DTYPE_ENV] == options["dtype"] == "bfloat16"
    logger = logging.getLogger(CAST_LOGGER)
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, r: logging.LogRecord) -> None:
            seen.append(r.getMessage())

    handler = Keep()
    monkeypatch.setenv(CAST_DTYPE_ENV, env[CAST_DTYPE_ENV])
    monkeypatch.setattr(multiprocessing, "parent_process", lambda: object())  # as in a process vLLM started
    monkeypatch.setattr(logger, "filters", [])
    monkeypatch.setattr(logger, "disabled", False)
    level = logger.level
    logger.setLevel(logging.WARNING)  # whatever an earlier test left the root logger at
    logger.addHandler(handler)
    try:
        configure_process()
        configure_process()  # as plugin and as extension: one filter
        logger.warning(CAST_WARNING, "norm.weight", torch.float32, torch.bfloat16)
        logger.warning("Following weights were not loaded from checkpoint: %s", {"x"})
        logger.warning(CAST_WARNING, "norm.weight", torch.float16, torch.bfloat16)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    (casts,) = logger.filters
    assert isinstance(casts, IntendedCasts) and casts.dropped == 1
    assert len(seen) == 2 and "not loaded" in seen[0] and "torch.float16" in seen[1]
