"""msgpack on the wire, JSON for humans, one size limit for both.

Every decode goes through :func:`decode`, which enforces the payload limit
before parsing and validates against a schema, so a service never holds an
unchecked message. Errors are :class:`PayloadError` with a reason fit for a
4xx response or a dead-letter entry.
"""

from __future__ import annotations

import json
from typing import Any, Literal, TypeVar

import msgpack
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)
Format = Literal["msgpack", "json"]

MSGPACK_MEDIA_TYPE = "application/msgpack"
JSON_MEDIA_TYPE = "application/json"
DEFAULT_MAX_PAYLOAD_BYTES = 8 * 1024 * 1024


class PayloadError(ValueError):
    """A message that cannot be accepted; ``str(err)`` is the reason."""


def format_validation_error(err: ValidationError) -> str:
    """One line per problem, each naming the field path (``samples.0.reward: ...``)."""
    parts = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "<root>"
        parts.append(f"{loc}: {e['msg']}")
    return "; ".join(parts)


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=True)


def encode(model: BaseModel, fmt: Format = "msgpack") -> bytes:
    """Serialise a schema object; msgpack by default."""
    obj = model.model_dump(mode="python")
    if fmt == "json":
        return json.dumps(obj, separators=(",", ":")).encode()
    return pack(obj)


def decode(
    data: bytes,
    schema: type[M],
    fmt: Format = "msgpack",
    *,
    max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    vocab_size: int | None = None,
) -> M:
    """Parse and validate ``data`` as ``schema``; raise :class:`PayloadError` on anything wrong."""
    if len(data) > max_bytes:
        raise PayloadError(f"payload is {len(data)} bytes, over the limit of {max_bytes}")
    try:
        obj = json.loads(data) if fmt == "json" else unpack(data)
    except RecursionError:  # json nests by recursion; msgpack's own limit is a StackError
        raise PayloadError(f"not valid {fmt}: nested too deeply") from None
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, TypeError) as err:
        raise PayloadError(f"not valid {fmt}: {str(err) or type(err).__name__}") from None
    if not isinstance(obj, dict):
        raise PayloadError(f"expected a {fmt} map at the top level, got {type(obj).__name__}")
    try:
        return schema.model_validate(obj, context={"vocab_size": vocab_size})
    except ValidationError as err:
        raise PayloadError(format_validation_error(err)) from None
