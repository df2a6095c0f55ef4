"""Wire handling of the HTTP API: body limit, msgpack/JSON bodies in, msgpack/JSON answers out.

The schemas themselves live in :mod:`tba.schemas`; this module only decides the
format (``Content-Type`` in, ``Accept`` out, msgpack by default) and turns every
malformed body into an :class:`ApiError` with a reason.
"""

from __future__ import annotations

import json
import logging
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import Response
from pydantic import BaseModel
from starlette.requests import ClientDisconnect

from services.buffer.errors import ApiError
from tba.codec import JSON_MEDIA_TYPE, MSGPACK_MEDIA_TYPE, PayloadError, decode, pack

log = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)
_MSGPACK_TYPES = (MSGPACK_MEDIA_TYPE, "application/x-msgpack", "application/vnd.msgpack")


async def read_limited(request: Request, max_bytes: int) -> bytes:
    """The body, refused with 413 as soon as it exceeds ``max_bytes`` (declared or actual)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise ApiError(413, "payload_too_large", f"body is {declared} bytes, over the limit of {max_bytes}")
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_bytes:
                raise ApiError(413, "payload_too_large", f"body exceeds the limit of {max_bytes} bytes")
            chunks.append(chunk)
    except ClientDisconnect:  # the client's business, not a fault of ours: one line, no traceback
        client = request.client.host if request.client else "?"
        log.info(
            "%s %s: the client (%s) went away after %d bytes of the body",
            request.method,
            request.url.path,
            client,
            size,
        )
        raise ApiError(400, "client_disconnected", f"the client went away after {size} bytes of the body") from None
    return b"".join(chunks)


def body_format(request: Request) -> str:
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype in _MSGPACK_TYPES:
        return "msgpack"
    if ctype in (JSON_MEDIA_TYPE, ""):
        return "json"
    raise ApiError(
        415,
        "unsupported_media_type",
        f"Content-Type {ctype!r} is not supported: send {MSGPACK_MEDIA_TYPE} or {JSON_MEDIA_TYPE}",
    )


async def parse_body(request: Request, schema: type[M], max_bytes: int) -> M:
    fmt = body_format(request)
    data = await read_limited(request, max_bytes)
    if not data:
        raise ApiError(400, "empty_body", f"the request body is empty: send a {schema.__name__}")
    try:
        return decode(data, schema, fmt, max_bytes=max_bytes)  # type: ignore[arg-type]
    except PayloadError as err:
        raise ApiError(422, "invalid_payload", f"invalid {schema.__name__}: {err}") from None


def wants_json(request: Request) -> bool:
    accept = request.headers.get("accept", "").lower()
    return JSON_MEDIA_TYPE in accept and not any(t in accept for t in _MSGPACK_TYPES)


def respond(request: Request, obj: dict[str, Any], status: int = 200) -> Response:
    """msgpack unless the client asks for JSON (``Accept: application/json``)."""
    if wants_json(request):
        return Response(json.dumps(obj, separators=(",", ":")), status, media_type=JSON_MEDIA_TYPE)
    return Response(pack(obj), status, media_type=MSGPACK_MEDIA_TYPE)
