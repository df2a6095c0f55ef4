"""The reference backends' pure parts: the temperature-scaled copy, the CPU binding choice, and the
engine-call guard and restore decision that keep a shutdown during a reload from hanging."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from services.searcher.engine import EngineStopped, guarded_call, should_restore
from services.searcher.reference import TEMPERED_MARK, reference_cpu_bind, resolve_backend, tempered_copy
from tba.model.tiny import TinyModelSpec, init_model
from tba.settings import SearcherSettings

T = 0.7
SMALL = TinyModelSpec(hidden_size=128, num_layers=1, num_heads=2, intermediate_size=256)


def settings(**kw) -> SearcherSettings:
    return SearcherSettings(model=Path("m"), **kw)


def logits(model_dir: Path, ids: list[int]) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0]


def tied_model(out: Path) -> Path:
    """A tiny Llama whose lm_head shares the input embeddings (as many released models do)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from tba.model.tokenizer import build_tokenizer

    tok = build_tokenizer()
    config = LlamaConfig(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, head_dim=64, tie_word_embeddings=True,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.mark.parametrize("tied", [False, True])
def test_tempered_copy_has_logits_over_t(tmp_path: Path, tied: bool) -> None:
    base = tied_model(tmp_path / "base") if tied else init_model(tmp_path / "base", SMALL, seed=0)
    copy = tempered_copy(base, T, "float32", tmp_path / "cache")
    ids = [1, 5, 9, 14, 20, 2]
    torch.testing.assert_close(logits(copy, ids), logits(base, ids) / T, atol=1e-5, rtol=1e-5)
    from transformers import AutoConfig

    assert AutoConfig.from_pretrained(str(copy)).tie_word_embeddings is False
    # The input embeddings are the base model's (only the output head is scaled).
    from safetensors.torch import load_file

    emb = "model.embed_tokens.weight"
    torch.testing.assert_close(load_file(copy / "model.safetensors")[emb], load_file(base / "model.safetensors")[emb])


def test_tempered_copy_is_written_once_per_model_and_temperature(tmp_path: Path) -> None:
    base = init_model(tmp_path / "base", SMALL, seed=0)
    cache = tmp_path / "cache"
    first = tempered_copy(base, T, "float32", cache)
    stamp = (first / TEMPERED_MARK).stat().st_mtime_ns
    assert tempered_copy(base, T, "float32", cache) == first and (first / TEMPERED_MARK).stat().st_mtime_ns == stamp
    assert tempered_copy(base, 1.3, "float32", cache) != first  # another T, another copy
    init_model(base, SMALL, seed=1)  # the base model changed on disk: a fresh copy
    assert tempered_copy(base, T, "float32", cache) != first
    assert not list(cache.glob(".tmp-*"))


def test_reference_cpu_binding() -> None:
    assert reference_cpu_bind(settings(ref_cpu_bind="3"), {}) == "3"  # the setting wins
    assert reference_cpu_bind(settings(), {"VLLM_CPU_OMP_THREADS_BIND": "1"}) == "1"  # same as the engine's
    assert reference_cpu_bind(settings(), {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}) == "nobind"
    import os

    auto = reference_cpu_bind(settings(), {})  # vLLM's reserved core: one this process may run on
    assert int(auto) in os.sched_getaffinity(0)


def test_backend_choice() -> None:
    assert resolve_backend(settings(), on_cpu=True) == "vllm"
    assert resolve_backend(settings(), on_cpu=False) == "transformers"
    assert resolve_backend(settings(ref_backend="transformers"), on_cpu=True) == "transformers"
    assert resolve_backend(settings(ref_backend="vllm"), on_cpu=False) == "vllm"


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
