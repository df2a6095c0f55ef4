"""The synchronous Redis client of the searchers and the trainer: one Redis or a Redis Cluster.

The buffer (asyncio) builds its own client in ``services.buffer.store.connect``; both read the
same two settings, ``TBA_REDIS_URL`` and ``TBA_REDIS_CLUSTER``. Every key the searchers and the
trainer touch (the trajectory stream, the checkpoint manifest) is a single key, so a cluster
client routes each command to its node with no other change.
"""

from __future__ import annotations

import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry


def sync_client(url: str, cluster: bool = False, timeout: float | None = None,
                retry: bool = True) -> redis.Redis | RedisCluster:
    """A client with ``timeout`` seconds for connecting and for each reply. ``retry=False`` fails
    fast (no hidden retries), for callers that own their retry policy."""
    options: dict = {"socket_timeout": timeout, "socket_connect_timeout": timeout}
    if not retry:
        options["retry"] = Retry(NoBackoff(), 0)
    if cluster:
        return RedisCluster.from_url(url, **options)
    return redis.Redis.from_url(url, **options)
