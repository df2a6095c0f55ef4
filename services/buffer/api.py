"""Routes of the buffer service, and nothing else: the logic lives in store, sampler and ingest."""

from __future__ import annotations

import logging
import time
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, Field

from services.buffer.auth import require_token
from services.buffer.errors import ApiError, ErrorResponse
from services.buffer.protocol import parse_body, respond
from services.buffer.sampler import BufferChanging, NotEnoughGenerated, NotEnoughPrompts
from services.buffer.store import WriteResult
from tba.codec import JSON_MEDIA_TYPE, MSGPACK_MEDIA_TYPE, PayloadError
from tba.schemas import SampledBatch, SampleRequest, ScoredGroup

log = logging.getLogger(__name__)
router = APIRouter()

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse, "description": why}
    for code, why in {
        400: "Empty or unparseable body",
        401: "Missing or wrong bearer token",
        413: "Body over the size limit",
        415: "Content-Type neither msgpack nor JSON",
        422: "Body fails schema validation",
        503: "Redis unavailable",
    }.items()
}
_BINARY = {"schema": {"type": "string", "format": "binary"}}
_TEXT = {"text/plain": {"schema": {"type": "string"}}}


def _body_doc(name: str) -> dict[str, Any]:
    """OpenAPI for a body read by hand: msgpack (binary) or JSON of the named schema."""
    return {
        "requestBody": {
            "required": True,
            "content": {
                MSGPACK_MEDIA_TYPE: _BINARY,
                JSON_MEDIA_TYPE: {"schema": {"$ref": f"#/components/schemas/{name}"}},
            },
        }
    }


class GroupAccepted(BaseModel):
    """Answer of ``POST /v1/groups``: what storing the group did, in samples."""

    group_id: str
    added: int = Field(description="New samples stored.")
    duplicates: int = Field(description="Samples that were exact duplicates (or the whole group, if resent).")
    evicted: int = Field(description="Samples evicted to respect the capacities.")
    resent: bool = Field(description="The group id was already stored: nothing changed.")


async def _check_objective(request: Request, temperature: float | None, reference: str | None, what: str) -> None:
    """409 with the reason when the objective differs from the run's (see BufferStore.objective_mismatch)."""
    mismatch = await request.app.state.store.objective_mismatch(temperature, reference)
    if mismatch is not None:
        log.warning("refused %s: %s", what, mismatch)
        raise ApiError(409, "objective_mismatch", mismatch)


@router.post(
    "/v1/sample",
    dependencies=[Depends(require_token)],
    response_model=SampledBatch,
    responses={
        **_ERRORS,
        409: {
            "model": ErrorResponse,
            "description": "Not enough eligible prompts yet (not_enough_samples), fewer generated samples than "
            "min_samples_generated (reuse_bound), or another objective (objective_mismatch)",
        },
        200: {"description": "The batch: msgpack, or JSON when asked for", "content": {MSGPACK_MEDIA_TYPE: _BINARY}},
    },
    openapi_extra=_body_doc("SampleRequest"),
    summary="Draw P prompts x K samples by the recency/reward rule (msgpack unless Accept: JSON)",
)
async def sample(request: Request) -> Response:
    state = request.app.state
    req = await parse_body(request, SampleRequest, state.settings.max_payload_bytes)
    if req.temperature is not None or req.reference is not None:
        await _check_objective(request, req.temperature, req.reference, "sample request")
    t0 = time.perf_counter()
    try:
        batch = await state.sampler.sample(req)
    except NotEnoughPrompts as err:
        raise ApiError(409, "not_enough_samples", str(err)) from None
    except NotEnoughGenerated as err:
        raise ApiError(409, "reuse_bound", str(err)) from None
    except BufferChanging as err:
        raise ApiError(503, "buffer_changing", str(err), {"Retry-After": "1"}) from None
    state.metrics.sample_seconds.observe(time.perf_counter() - t0)
    return respond(request, batch)


@router.post(
    "/v1/groups",
    dependencies=[Depends(require_token)],
    response_model=GroupAccepted,
    responses={
        **_ERRORS,
        409: {
            "model": ErrorResponse,
            "description": "The group's objective (temperature, reference model) is not the run's",
        },
    },
    openapi_extra=_body_doc("ScoredGroup"),
    summary="Store one scored group (for producers that cannot reach Redis); idempotent by group_id",
)
async def post_group(request: Request) -> JSONResponse:
    state = request.app.state
    group = await parse_body(request, ScoredGroup, state.settings.max_payload_bytes)
    await _check_objective(request, group.temperature, group.reference, f"group {group.group_id}")
    try:
        result: WriteResult = await state.store.write_group(group)
    except PayloadError as err:
        raise ApiError(422, "invalid_payload", f"invalid ScoredGroup: {err}") from None
    state.metrics.observe_ingest("http", len(group.samples), result)
    body = GroupAccepted(
        group_id=group.group_id,
        added=result.added,
        duplicates=result.duplicates,
        evicted=result.evicted,
        resent=result.resent,
    )
    return JSONResponse(body.model_dump())


@router.get("/v1/stats", summary="Buffer-wide figures: sizes, per-version counts, counters in samples, rates")
async def stats(request: Request) -> JSONResponse:
    state = request.app.state
    out = await state.store.stats()
    out.update(state.metrics.rates.update(out["samples_ingested"], out["samples_served"]))
    out["ingest"] = state.ingest_status()
    return JSONResponse(out)


@router.get("/healthz", response_class=PlainTextResponse, summary="The process is alive")
async def healthz() -> str:
    return "ok\n"


@router.get(
    "/readyz",
    response_class=PlainTextResponse,
    summary="Redis reachable and configured not to evict keys",
    responses={503: {"description": "Not ready, with the reason", "content": _TEXT}},
)
async def readyz(request: Request) -> PlainTextResponse:
    ok, reason = await request.app.state.readiness()
    return PlainTextResponse(reason + "\n", status_code=200 if ok else 503)


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    response_class=PlainTextResponse,
    responses={200: {"description": "Prometheus text exposition format", "content": _TEXT}},
)
async def metrics(request: Request) -> Response:
    state = request.app.state
    return Response(state.metrics.render(await state.store.stats()), media_type=CONTENT_TYPE_LATEST)
