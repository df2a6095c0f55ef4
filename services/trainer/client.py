"""The trainer's HTTP client of the buffer service.

Transient failures (connection errors, timeouts, 5xx) are retried with bounded
exponential backoff and jitter (:func:`tba.retry.backoff_delays`), logged on
each attempt, for as long as it takes: the trainer never crashes because the
buffer restarted. A 409 on ``/v1/sample`` means "not enough eligible samples
yet" and is returned to the caller, who waits, unless the buffer says the
trainer's objective (temperature, reference model) is not the run's. Any other
4xx is a bug on our side (bad request, wrong token) and is raised at once,
never retried.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import httpx

from tba.codec import JSON_MEDIA_TYPE, MSGPACK_MEDIA_TYPE, Format, PayloadError, decode, encode
from tba.retry import backoff_delays
from tba.schemas import SampledBatch, SampleRequest

log = logging.getLogger(__name__)


def _error(resp: httpx.Response) -> tuple[str | None, str]:
    """The code and message of the buffer's error answer (no code, and the text's head, if it is not one)."""
    try:
        error = resp.json()["error"]
        return error["code"], str(error["message"])
    except (ValueError, KeyError, TypeError):
        return None, resp.text[:200]


@dataclass(frozen=True)
class NotServed:
    """A 409 answer to ``/v1/sample``: the batch cannot be served yet. ``code`` says why: not_enough_samples
    (too few eligible prompts: none of this version yet in sync mode, too few fresh enough under the
    staleness bound) or reuse_bound (too few samples generated for the trainer's reuse bound)."""

    code: str
    message: str


class BufferRequestError(RuntimeError):
    """The buffer refused a request (4xx other than 409): retrying would not help."""


class StopRequested(Exception):
    """The trainer was asked to stop while waiting on the buffer."""


class BufferClient:
    def __init__(
        self,
        base_url: str,
        *,
        auth_token: str | None = None,
        timeout: float = 30.0,
        max_bytes: int = 8 << 20,
        stop: threading.Event | None = None,
        delays: Iterator[float] | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {auth_token}"} if auth_token else {}
        self.http = httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout, transport=transport)
        self.base_url = base_url
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.stop = stop or threading.Event()
        self._delays_factory = (lambda: delays) if delays is not None else backoff_delays
        self.failures = 0  # transient failures so far (a metric)
        self.reachable = False

    def close(self) -> None:
        self.http.close()

    def sample(self, request: SampleRequest) -> SampledBatch | NotServed:
        """A batch, or why the buffer cannot serve one yet (409), after holding the request up to
        ``request.wait_seconds`` (the HTTP timeout must be longer)."""
        resp = self._send(
            "POST",
            "/v1/sample",
            content=encode(request),
            headers={"Content-Type": MSGPACK_MEDIA_TYPE, "Accept": MSGPACK_MEDIA_TYPE},
            timeout=self.timeout + request.wait_seconds,  # the buffer may hold the request that long
        )
        if resp.status_code == 409:
            code, message = _error(resp)
            code = code or "not_enough_samples"
            if code == "objective_mismatch":
                raise BufferRequestError(f"the buffer refuses this trainer: {message}")
            return NotServed(code, message)
        fmt: Format = "json" if resp.headers.get("content-type", "").startswith(JSON_MEDIA_TYPE) else "msgpack"
        try:
            return decode(resp.content, SampledBatch, fmt, max_bytes=self.max_bytes)
        except PayloadError as err:
            raise BufferRequestError(f"the buffer answered /v1/sample with an invalid batch: {err}") from None

    def stats(self) -> dict:
        """``GET /v1/stats`` as a dict (``samples`` is the number of stored samples)."""
        resp = self._send("GET", "/v1/stats", headers={"Accept": JSON_MEDIA_TYPE})
        try:
            out = resp.json()
        except ValueError:
            raise BufferRequestError(f"/v1/stats did not return JSON: {resp.text[:200]!r}") from None
        if not isinstance(out, dict):
            raise BufferRequestError(f"/v1/stats returned {type(out).__name__}, expected an object")
        return out

    def _send(self, method: str, path: str, **kwargs) -> httpx.Response:
        """One request, retried on transient failures until it gets an answer or the trainer stops."""
        delays = self._delays_factory()
        attempt = 0
        while True:
            if self.stop.is_set():
                raise StopRequested
            try:
                resp = self.http.request(method, path, **kwargs)
            except httpx.TransportError as err:
                reason = f"{type(err).__name__}: {err}"
            else:
                if resp.status_code < 500:
                    return self._accept(resp, method, path, attempt)
                reason = f"HTTP {resp.status_code}: {resp.text[:200]}"
            attempt += 1
            self.failures += 1
            self.reachable = False
            delay = next(delays)
            log.warning("buffer %s%s failed (%s); retry %d in %.1f s", self.base_url, path, reason, attempt, delay)
            self.stop.wait(delay)

    def _accept(self, resp: httpx.Response, method: str, path: str, attempt: int) -> httpx.Response:
        if attempt:
            log.info("buffer %s reachable again after %d failed attempts", self.base_url, attempt)
        self.reachable = True
        if resp.status_code >= 400 and not (resp.status_code == 409 and path == "/v1/sample"):
            raise BufferRequestError(f"{method} {path} refused with HTTP {resp.status_code}: {resp.text[:500]}")
        return resp
