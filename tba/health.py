"""A tiny health and metrics HTTP server for the services that are not web apps.

The trainer and the searchers are loops, not request handlers; they expose
``/healthz`` (process alive), ``/readyz`` (their own readiness test) and
``/metrics`` (Prometheus) from a daemon thread, so probes never wait on a
training step or a generation batch.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` right now (the OS picks it): no fixed ports, in runs or in tests."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class HealthServer:
    def __init__(
        self,
        host: str,
        port: int,
        ready: Callable[[], tuple[bool, str]],
        registry: CollectorRegistry = REGISTRY,
        status: Callable[[], dict] | None = None,
    ) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                if self.path == "/healthz":
                    outer._send(self, 200, b"ok\n", "text/plain")
                elif self.path == "/readyz":
                    ok, reason = ready()
                    outer._send(self, 200 if ok else 503, (reason + "\n").encode(), "text/plain")
                elif self.path == "/metrics":
                    outer._send(self, 200, generate_latest(registry), CONTENT_TYPE_LATEST)
                elif self.path == "/status" and status is not None:
                    outer._send(self, 200, json.dumps(status(), default=str).encode(), "application/json")
                else:
                    outer._send(self, 404, b"not found\n", "text/plain")

            def log_message(self, *args) -> None:  # probes every few seconds: keep logs quiet
                pass

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="health", daemon=True)

    @staticmethod
    def _send(handler: BaseHTTPRequestHandler, code: int, body: bytes, ctype: str) -> None:
        try:
            handler.send_response(code)
            handler.send_header("Content-Type", ctype)
            handler.send_header("Content-Length", str(len(body)))
            handler.end_headers()
            handler.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the probe gave up waiting: nobody to answer

    def start(self) -> HealthServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
