"""The buffer client's retry policy: back off on transport errors and 5xx, wait on 409, never retry other 4xx.

The HTTP exchanges are scripted with httpx's MockTransport so that each status
code is hit deterministically; the client against the real buffer is covered by
tests/integration/test_trainer_loop.py.
"""

from __future__ import annotations

import itertools
import logging
import threading

import httpx
import pytest

from services.trainer.client import BufferClient, BufferRequestError, NotServed, StopRequested
from tba.codec import MSGPACK_MEDIA_TYPE, decode, encode
from tba.schemas import SampledBatch, SampleRequest

REQUEST = SampleRequest(num_prompts=1, samples_per_prompt=2, trainer_version=4)
BATCH = SampledBatch(trainer_version=4, groups=[])


def scripted(*responses):
    """A transport answering with ``responses`` in turn (an exception instance is raised)."""
    seen: list[httpx.Request] = []
    it = iter(responses)

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        r = next(it)
        if isinstance(r, Exception):
            raise r
        return r

    return httpx.MockTransport(handler), seen


def client(transport, **kw) -> BufferClient:
    return BufferClient("http://buffer:8400", transport=transport, delays=itertools.repeat(0.0), **kw)


def ok_batch() -> httpx.Response:
    return httpx.Response(200, content=encode(BATCH), headers={"content-type": MSGPACK_MEDIA_TYPE})


def test_sample_sends_msgpack_with_the_token_and_decodes_the_batch() -> None:
    transport, seen = scripted(ok_batch())
    out = client(transport, auth_token="s3cret").sample(REQUEST)
    assert out == BATCH
    req = seen[0]
    assert req.url.path == "/v1/sample" and req.headers["authorization"] == "Bearer s3cret"
    assert req.headers["content-type"] == MSGPACK_MEDIA_TYPE
    assert decode(req.content, SampleRequest) == REQUEST


def test_transient_failures_are_retried_and_logged(caplog) -> None:
    caplog.set_level(logging.INFO)
    transport, seen = scripted(
        httpx.ConnectError("refused"), httpx.Response(503, text="redis down"), httpx.ReadTimeout("slow"), ok_batch()
    )
    c = client(transport)
    assert c.sample(REQUEST) == BATCH
    assert len(seen) == 4 and c.failures == 3 and c.reachable
    assert "ConnectError" in caplog.text and "HTTP 503" in caplog.text and "reachable again" in caplog.text


def test_409_means_not_served_yet_with_the_buffers_reason() -> None:
    error = {"error": {"status": 409, "code": "reuse_bound", "message": "fewer than min_samples_generated=9"}}
    transport, seen = scripted(httpx.Response(409, json=error), httpx.Response(409, json={"detail": "not enough"}))
    c = client(transport)
    assert c.sample(REQUEST) == NotServed("reuse_bound", "fewer than min_samples_generated=9")
    assert c.sample(REQUEST) == NotServed("not_enough_samples", '{"detail":"not enough"}') and len(seen) == 2


def test_a_long_poll_gets_an_http_timeout_longer_than_its_wait() -> None:
    transport, seen = scripted(ok_batch())
    c = client(transport)
    c.sample(REQUEST.model_copy(update={"wait_seconds": 7.5}))
    assert seen[0].extensions["timeout"]["read"] == c.timeout + 7.5


def test_409_for_another_objective_is_raised_with_the_buffers_reason() -> None:
    """Waiting would never help: the buffer's run samples at another temperature or reference."""
    error = {"error": {"status": 409, "code": "objective_mismatch", "message": "objective mismatch: temperature 1"}}
    transport, seen = scripted(httpx.Response(409, json=error))
    with pytest.raises(BufferRequestError, match="refuses this trainer: objective mismatch: temperature 1"):
        client(transport).sample(REQUEST)
    assert len(seen) == 1


@pytest.mark.parametrize("code", [400, 401, 413, 422])
def test_other_4xx_are_raised_at_once(code: int) -> None:
    transport, seen = scripted(httpx.Response(code, text="bad field num_prompts"))
    with pytest.raises(BufferRequestError, match=f"HTTP {code}.*num_prompts"):
        client(transport).sample(REQUEST)
    assert len(seen) == 1


def test_an_invalid_batch_is_an_error_not_a_crash() -> None:
    transport, _ = scripted(httpx.Response(200, content=b"\x93garbage", headers={"content-type": MSGPACK_MEDIA_TYPE}))
    with pytest.raises(BufferRequestError, match="invalid batch"):
        client(transport).sample(REQUEST)


def test_stop_interrupts_the_retries() -> None:
    stop = threading.Event()
    calls = []

    def handler(request):
        calls.append(1)
        if len(calls) == 3:
            stop.set()
        raise httpx.ConnectError("refused")

    c = BufferClient(
        "http://buffer:8400", transport=httpx.MockTransport(handler), stop=stop, delays=itertools.repeat(0.0)
    )
    with pytest.raises(StopRequested):
        c.stats()
    assert len(calls) == 3


def test_stats_returns_the_json_object() -> None:
    transport, seen = scripted(httpx.Response(200, json={"samples": 12, "prompts": 3}))
    assert client(transport).stats()["samples"] == 12
    assert seen[0].url.path == "/v1/stats"
