"""Redis clients whose commands are sent once.

redis-py re-sends a command on its own after a timeout or a dropped connection (recent
versions do by default, several times). For a script that was in fact applied that is a
second write: a flush refused as stale, a finish answered "lease lost" although the job is
done. resumeq's clients turn that off; the store re-sends its writes itself, with the
request id that makes a re-send recognisable (:mod:`resumeq.store`).
"""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry


def connect(
    url: str, *, pool_size: int | None = None, pool_timeout_s: float = 5.0, **options: Any
) -> redis.Redis:
    """A bytes-mode client for ``url`` that never re-sends a command by itself. Raises
    ``ValueError`` for a URL redis-py cannot read.

    With ``pool_size`` its pool holds at most that many connections, and a caller that
    finds them all busy waits for one up to ``pool_timeout_s`` (then a ConnectionError):
    a process with hundreds of threads never opens hundreds of connections."""
    if pool_size is None:
        return redis.Redis.from_url(url, retry=Retry(NoBackoff(), 0), **options)
    pool = redis.BlockingConnectionPool.from_url(
        url,
        retry=Retry(NoBackoff(), 0),
        max_connections=pool_size,
        timeout=pool_timeout_s,
        **options,
    )
    client = redis.Redis(connection_pool=pool)
    client.auto_close_connection_pool = True
    return client


def connect_async(url: str, **options: Any) -> redis.asyncio.Redis:
    """The asyncio counterpart of :func:`connect`: bytes mode, never re-sends a command by
    itself. Connects on first use (no running event loop needed to build it). Raises
    ``ValueError`` for a URL redis-py cannot read."""
    return redis.asyncio.Redis.from_url(url, retry=AsyncRetry(NoBackoff(), 0), **options)
