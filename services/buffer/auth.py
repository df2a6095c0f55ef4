"""Bearer-token auth for writes and sampling, as a FastAPI dependency.

Tokens are compared by SHA-256 digest with :func:`hmac.compare_digest`: equal-length
inputs and constant time, so neither the length nor a prefix of the token leaks
through timing.
"""

from __future__ import annotations

import hashlib
import hmac

from fastapi import Request

from services.buffer.errors import ApiError


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class BearerAuth:
    def __init__(self, token: str | None) -> None:
        self._digest = _digest(token) if token else None

    def check(self, authorization: str | None) -> None:
        if self._digest is None:
            return
        scheme, _, given = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not given:
            raise ApiError(
                401,
                "unauthorized",
                "missing bearer token: send 'Authorization: Bearer <TBA_AUTH_TOKEN>'",
                {"WWW-Authenticate": 'Bearer realm="tba-buffer"'},
            )
        if not hmac.compare_digest(_digest(given.strip()), self._digest):
            raise ApiError(
                401,
                "unauthorized",
                "invalid bearer token",
                {"WWW-Authenticate": 'Bearer realm="tba-buffer", error="invalid_token"'},
            )


async def require_token(request: Request) -> None:
    """Dependency: the app's :class:`BearerAuth` decides (no token configured: open)."""
    request.app.state.auth.check(request.headers.get("authorization"))
