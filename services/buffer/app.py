"""The buffer service's FastAPI app: ``create_app(settings)``.

The lifespan owns the Redis client and the ingest task: it connects, makes sure
the consumer group exists, starts consuming the trajectory stream, and on
shutdown stops the consumer between batches (an entry is stored and acked in one
atomic call, so stopping at any point loses nothing) before closing Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from redis.asyncio.cluster import RedisCluster
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.buffer.api import router
from services.buffer.auth import BearerAuth
from services.buffer.errors import install_error_handlers
from services.buffer.ingest import Ingestor
from services.buffer.metrics import BufferMetrics
from services.buffer.sampler import Sampler
from services.buffer.store import BufferStore
from tba.redis_client import async_client
from tba.schemas import SampleRequest, ScoredGroup
from tba.settings import BufferSettings, redact_url

log = logging.getLogger(__name__)

# maxmemory policies that may delete buffer keys (ours carry no TTL, so volatile-* never touch them).
EVICTING_POLICIES = ("allkeys-lru", "allkeys-lfu", "allkeys-random")


def create_app(settings: BufferSettings) -> FastAPI:
    metrics = BufferMetrics()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        client = async_client(settings.redis_url, settings.redis_cluster)
        store = BufferStore(client, settings)
        app.state.redis, app.state.store = client, store
        app.state.sampler = Sampler(store)
        app.state.ingestor = Ingestor(client, store, settings, metrics)
        stop = asyncio.Event()
        task = None
        if settings.ingest_enabled:
            task = asyncio.create_task(app.state.ingestor.run(stop), name="ingest")
        app.state.ingest_task = task
        log.info(
            "buffer ready: redis %s, namespace %r, ingest %s",
            redact_url(settings.redis_url),
            settings.namespace,
            "on" if task else "off",
        )
        try:
            yield
        finally:
            stop.set()
            if task is not None:
                try:
                    await asyncio.wait_for(task, settings.ingest_block_ms / 1000 + 5)
                except TimeoutError:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            await client.aclose()
            log.info("buffer stopped")

    app = FastAPI(
        title="TBA replay buffer",
        version="1",
        lifespan=lifespan,
        description="Redis-backed replay buffer: stream ingest, reward-and-recency sampling.",
    )
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.auth = BearerAuth(settings.auth_token.get_secret_value() if settings.auth_token else None)
    app.state.readiness = lambda: readiness(app)
    app.state.ingest_status = lambda: ingest_status(app)
    install_error_handlers(app)
    app.include_router(router)

    app.add_middleware(RequestCounter, metrics=metrics)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


class RequestCounter:
    """Counts requests by route and status: a plain ASGI middleware (no per-request task or body copy)."""

    def __init__(self, app: ASGIApp, metrics: BufferMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = ["500"]

        async def send_counted(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = str(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_counted)
        finally:
            route = scope.get("route")
            self.metrics.requests.labels(getattr(route, "path", "unmatched"), status[0]).inc()


async def readiness(app: FastAPI) -> tuple[bool, str]:
    """Ready when Redis answers, will not evict our keys, and the ingest task is alive."""
    client = app.state.redis
    try:
        await client.ping()
        if isinstance(client, RedisCluster):  # every primary holds buffer data: each must be safe
            per_node = await client.info("memory", target_nodes=RedisCluster.PRIMARIES)
            policies = {info.get("maxmemory_policy", "unknown") for info in per_node.values()}
        else:
            policies = {(await client.info("memory")).get("maxmemory_policy", "unknown")}
    except Exception as err:  # noqa: BLE001 (any failure to reach Redis means not ready)
        return False, f"Redis at {redact_url(app.state.settings.redis_url)} is unreachable: {type(err).__name__}: {err}"
    policy = next((p for p in sorted(policies) if p in EVICTING_POLICIES), None)
    if policy is not None:
        return False, (
            f"Redis maxmemory-policy is {policy}: it would silently delete buffer data; "
            "configure `maxmemory-policy noeviction`"
        )
    task = app.state.ingest_task
    if task is not None and task.done():
        return False, "the ingest task has stopped; see the log"
    return True, "ready"


def ingest_status(app: FastAPI) -> dict[str, Any]:
    ing: Ingestor = app.state.ingestor
    return {
        "enabled": app.state.ingest_task is not None,
        "consumer": ing.consumer,
        "healthy": ing.healthy,
        "last_error": ing.last_error,
    }


def _openapi(app: FastAPI) -> dict[str, Any]:
    """The generated schema plus the hand-read request bodies (msgpack or JSON)."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for model in (SampleRequest, ScoredGroup):
        js = model.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(js.pop("$defs", {}))
        components[model.__name__] = js
    app.openapi_schema = schema
    return schema
