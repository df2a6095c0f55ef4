"""`tba searcher`: settings and start-up checks first, then vLLM (so ``--help`` stays instant)."""

from __future__ import annotations

import argparse
import sys

from tba.settings import SearcherSettings, add_settings_arguments, load_settings

HELP = (
    "Run a searcher: generate S completions per prompt with vLLM, score them (task reward, reference "
    "log-probs), stream them to the buffer, and hot-reload the trainer's checkpoints."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_settings_arguments(parser, SearcherSettings)


def main(args: argparse.Namespace) -> int:
    from services.searcher.startup import StartupError, check_all
    from tba.logs import setup_logging

    settings = load_settings(SearcherSettings, args)
    setup_logging(settings.log_level, settings.log_json)
    settings.write_resolved("searcher")
    try:
        task = check_all(settings)
        from services.searcher.service import run_service

        return run_service(settings, task)
    except StartupError as err:
        print(f"tba searcher: {err}", file=sys.stderr)
        return 2
