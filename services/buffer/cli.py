"""`tba buffer`: start the buffer service (uvicorn; graceful shutdown on SIGTERM)."""

from __future__ import annotations

import argparse

from tba.settings import BufferSettings, add_settings_arguments, load_settings

HELP = "Run the buffer service: stream ingest into Redis and POST /v1/sample for the trainer."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_settings_arguments(parser, BufferSettings)


def main(args: argparse.Namespace) -> int:
    settings = load_settings(BufferSettings, args)
    settings.write_resolved("buffer")

    import uvicorn

    from services.buffer.app import create_app
    from tba.logs import setup_logging

    setup_logging(settings.log_level, settings.log_json)
    # uvicorn turns SIGTERM/SIGINT into a graceful shutdown: in-flight requests finish,
    # then the lifespan stops the ingest task between batches and closes Redis.
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_config=None,
        log_level=settings.log_level.lower(),
        timeout_graceful_shutdown=10,
        access_log=False,
    )
    return 0
