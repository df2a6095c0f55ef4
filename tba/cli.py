"""The ``tba`` command: one sub-command per service, plus the tools around them.

The composition root: the one module of the shared package that names the services (by module path,
imported when the command runs), so that ``tba/`` below it never depends on ``services/``
(scripts/check_layers.py checks it).

Each sub-command lives in its own module exposing ``HELP``, ``add_arguments``
and ``main(args) -> int``. Those modules import torch, vLLM and friends only
inside ``main``, so ``tba --help`` and ``tba buffer --help`` stay instant.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from tba.settings import SettingsError

COMMANDS: dict[str, str] = {
    "buffer": "services.buffer.cli",
    "searcher": "services.searcher.cli",
    "trainer": "services.trainer.cli",
    "envserver": "services.envserver.cli",
    "up": "tba.local.up",
    "model": "tba.model.cli",
    "eval": "tba.local.evaluate",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tba",
        description="Trajectory Balance with Asynchrony: searchers generate, a Redis-backed buffer "
        "replays, a trainer learns with the TB loss and publishes hot-reloadable checkpoints.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(module_name)
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(_main=module.main)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args._main(args) or 0)
    except SettingsError as err:
        print(f"tba {args.command}: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
