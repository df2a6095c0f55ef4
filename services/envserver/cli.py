"""`tba envserver`: serve a multi-turn task as an OpenEnv environment (uvicorn; graceful shutdown on SIGTERM)."""

from __future__ import annotations

import argparse
import json
import os

INSTALL = "pip install openenv-core==0.3.0 (or pip install -e '.[envs]')"
HELP = "Serve a multi-turn task (the calculator, or package.module:Class) as an OpenEnv environment server."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--task", default="calculator", help="A multi-turn task (default: calculator).")
    parser.add_argument("--task-options", default="{}", help='Its options as JSON, e.g. {"digits": 2} (empty: none).')
    parser.add_argument(
        "--host",
        default=os.environ.get("TBA_HOST", "127.0.0.1"),
        help="Address to listen on (env TBA_HOST; default 127.0.0.1).",
    )
    parser.add_argument("--port", default=os.environ.get("TBA_PORT", "8010"), help="Port (env TBA_PORT; default 8010).")
    parser.add_argument(
        "--max-sessions", type=int, default=256, help="Episodes at once (a batch's P x S, at least; default 256)."
    )


def main(args: argparse.Namespace) -> int:
    try:
        options = json.loads(args.task_options or "{}")
    except ValueError as err:
        raise SystemExit(f"tba envserver: --task-options is not JSON: {err}") from None
    if not isinstance(options, dict):
        raise SystemExit("tba envserver: --task-options must be a JSON object")
    port = int(args.port) if str(args.port).isdigit() else 0
    if not 0 < port < 65536:
        raise SystemExit(f"tba envserver: --port / TBA_PORT must be in [1, 65535], got {args.port!r}")
    if not 1 <= args.max_sessions <= 100_000:
        raise SystemExit(f"tba envserver: --max-sessions must be in [1, 100000], got {args.max_sessions}")

    import uvicorn

    from services.envserver.app import create_app, quiet_disconnects

    try:
        app = create_app(args.task, options, args.max_sessions)
    except ImportError as err:
        raise SystemExit(f"tba envserver: {err}; {INSTALL}") from None
    except ValueError as err:
        raise SystemExit(f"tba envserver: {err}") from None
    uvicorn.run(quiet_disconnects(app), host=args.host, port=port, log_level="warning", timeout_graceful_shutdown=5)
    return 0
