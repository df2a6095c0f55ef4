"""``tba model``: make the tiny base model (init) and teach it a task (sft)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = "Build the tiny base model: `init` a fresh one, `sft` a short supervised warm-up on a task."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="model_command", required=True, metavar="ACTION")
    p = sub.add_parser("init", help="Write a fresh tiny Llama and its char-level tokenizer (HF format).")
    p.add_argument("--out", type=Path, required=True, help="Output directory.")
    p.add_argument("--seed", type=int, default=0, help="Initialisation seed.")
    p.add_argument("--hidden-size", type=int, default=256, help="Hidden size (head_dim stays 64).")
    p.add_argument("--layers", type=int, default=4, help="Number of decoder layers.")

    from tba.model import sft

    s = sub.add_parser("sft", help=sft.HELP, description=sft.HELP)
    sft.add_arguments(s)


def main(args: argparse.Namespace) -> int:
    if args.model_command == "init":
        from tba.model.tiny import TinyModelSpec, init_model

        if args.hidden_size < 64 or args.hidden_size % 64 or args.layers < 1:
            print(f"tba model init: --hidden-size must be a multiple of 64 (head_dim 64) and --layers >= 1, "
                  f"got {args.hidden_size} and {args.layers}", file=sys.stderr)
            return 2
        spec = TinyModelSpec(
            hidden_size=args.hidden_size, num_layers=args.layers, num_heads=args.hidden_size // 64,
            intermediate_size=3 * args.hidden_size,
        )
        out = init_model(args.out, spec, seed=args.seed)
        print(f"wrote tiny model to {out}")
        return 0
    from tba.model import sft

    return sft.main(args)
