"""Every Redis client of the system: one Redis or a Redis Cluster, from ``TBA_REDIS_URL`` and ``TBA_REDIS_CLUSTER``.

:func:`sync_client` serves the searchers, the trainer, ``tba up`` and the reliability harnesses;
:func:`async_client` serves the buffer (asyncio). Every key the searchers and the trainer touch (the
trajectory stream, the checkpoint manifest) is a single key, so a cluster client routes each
command to its node with no other change; the buffer's scripts keep each call within one hash slot.
How the project runs its own redis-server is tba/redis_server.py.
"""

from __future__ import annotations

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.cluster import RedisCluster
from redis.exceptions import AuthenticationError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry


def sync_client(
    url: str, cluster: bool = False, timeout: float | None = None, retry: bool = True
) -> redis.Redis | RedisCluster:
    """A client with ``timeout`` seconds for connecting and for each reply. ``retry=False`` fails
    fast (no hidden retries), for callers that own their retry policy."""
    options: dict = {"socket_timeout": timeout, "socket_connect_timeout": timeout}
    if not retry:
        options["retry"] = Retry(NoBackoff(), 0)
    if cluster:
        return RedisCluster.from_url(url, **options)
    return redis.Redis.from_url(url, **options)


class DroppedConnectionRetry(AsyncRetry):
    """Retries dropped connections, never refused credentials (an AuthenticationError is a ConnectionError):
    a wrong password stays wrong, and retrying it only makes every request, and the readiness probe, hang
    for seconds before saying so."""

    async def call_with_retry(self, do, fail, is_retryable=None, with_failure_count=False):
        def retryable(err: Exception) -> bool:
            return not isinstance(err, AuthenticationError) and (is_retryable is None or is_retryable(err))

        return await super().call_with_retry(do, fail, retryable, with_failure_count)


AsyncRedis = aioredis.Redis | AsyncRedisCluster  # the buffer's client: one Redis or a Redis Cluster


def async_client(url: str, cluster: bool = False) -> AsyncRedis:
    """The buffer's client: a dropped connection (Redis restarted, failover) is retried a few times
    with backoff before a request fails. Retrying a write is safe: the buffer's writes are
    idempotent by group id."""
    retry = DroppedConnectionRetry(ExponentialBackoff(cap=1.0, base=0.05), 4)
    if cluster:
        return AsyncRedisCluster.from_url(url, retry=retry, retry_on_error=[RedisConnectionError, RedisTimeoutError])
    return aioredis.Redis.from_url(
        url, retry=retry, retry_on_error=[RedisConnectionError, RedisTimeoutError], health_check_interval=30
    )
