"""`tba envserver`: serve a multi-turn task as an OpenEnv environment (uvicorn; graceful shutdown on SIGTERM)."""

from __future__ import annotations

import argparse
import json

INSTALL = "pip install openenv-core==0.3.0 (or pip install -e '.[envs]')"
HELP = "Serve a multi-turn task (the calculator, or package.module:Class) as an OpenEnv environment server."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--task", default="calculator", help="A multi-turn task (default: calculator).")
    parser.add_argument("--task-options", default="{}", help='Its options as JSON, e.g. {"digits": 2}.')
    parser.add_argument("--host", default="127.0.0.1", help="Address to listen on (default 127.0.0.1).")
    parser.add_argument("--port", type=int, default=8010, help="Port (default 8010).")
    parser.add_argument(
        "--max-sessions", type=int, default=256, help="Episodes at once (a batch's P x S, at least; default 256)."
    )


def main(args: argparse.Namespace) -> int:
    try:
        options = json.loads(args.task_options)
    except ValueError as err:
        raise SystemExit(f"tba envserver: --task-options is not JSON: {err}") from None
    if not isinstance(options, dict):
        raise SystemExit("tba envserver: --task-options must be a JSON object")
    if not 1 <= args.max_sessions <= 100_000 or not 0 < args.port < 65536:
        raise SystemExit("tba envserver: --max-sessions must be in [1, 100000] and --port in [1, 65535]")

    import uvicorn

    from services.envserver.app import create_app

    try:
        app = create_app(args.task, options, args.max_sessions)
    except ImportError as err:
        raise SystemExit(f"tba envserver: {err}; {INSTALL}") from None
    except ValueError as err:
        raise SystemExit(f"tba envserver: {err}") from None
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=5)
    return 0
