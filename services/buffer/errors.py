"""One error model for every failure of the buffer's HTTP API, and its handlers.

Every error answer is ``{"error": {"status", "code", "message"}}`` with a real
status code: 4xx says what was wrong with the request, 409 that the buffer
does not hold enough eligible data yet, 503 that Redis is unavailable.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from redis.exceptions import RedisError
from starlette.exceptions import HTTPException as StarletteHTTPException

from tba.codec import format_validation_error

log = logging.getLogger(__name__)


class ErrorBody(BaseModel):
    status: int
    code: str
    message: str


class ErrorResponse(BaseModel):
    error: ErrorBody


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers


def error_response(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    body = ErrorResponse(error=ErrorBody(status=status, code=code, message=message))
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_: Request, err: ApiError) -> JSONResponse:
        return error_response(err.status, err.code, err.message, err.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, err: RequestValidationError) -> JSONResponse:
        parts = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors()]
        return error_response(422, "invalid_request", "; ".join(parts))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, err: StarletteHTTPException) -> JSONResponse:
        return error_response(err.status_code, "http_error", str(err.detail), getattr(err, "headers", None))

    @app.exception_handler(RedisError)
    async def _redis(_: Request, err: RedisError) -> JSONResponse:
        log.warning("redis error on a request: %s", err)
        return error_response(
            503, "redis_unavailable", f"Redis is unavailable: {type(err).__name__}: {err}", {"Retry-After": "1"}
        )


__all__ = ["ApiError", "ErrorResponse", "error_response", "format_validation_error", "install_error_handlers"]
