"""Redis clients whose commands are sent once.

redis-py re-sends a command on its own after a timeout or a dropped connection (recent
versions do by default, several times). For a script that was in fact applied that is a
second write: a flush refused as stale, a finish answered "lease lost" although the job is
done. resumeq's clients turn that off; the store re-sends its writes itself, with the
request id that makes a re-send recognisable (:mod:`resumeq.store`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import redis
import redis.asyncio
import redis.asyncio.sentinel
import redis.sentinel
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
    options = {**_driver_info(), **options}
    target = parse_sentinel_url(url)
    if target is not None:
        # The Sentinel pool is not bounded: ``pool_size`` is a ceiling the callers keep.
        return _sentinel_client(target, retry=Retry(NoBackoff(), 0), **options)
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


def _driver_info() -> dict[str, Any]:
    """The client library's name and version for ``CLIENT SETINFO``, given: redis-py 8
    would look its version up in the installed packages' metadata for every connection it
    makes (a few ms, most of a command line's own work). Earlier versions looked once, at
    import."""
    try:
        from redis.driver_info import DriverInfo  # noqa: PLC0415
    except ImportError:
        return {}
    return {"driver_info": DriverInfo(lib_version=redis.__version__)}


def connect_async(url: str, **options: Any) -> redis.asyncio.Redis:
    """The asyncio counterpart of :func:`connect`: bytes mode, never re-sends a command by
    itself. Connects on first use (no running event loop needed to build it). Raises
    ``ValueError`` for a URL redis-py cannot read; a ``redis+sentinel://`` URL's client
    follows a failover, as :func:`connect`'s does."""
    target = parse_sentinel_url(url)
    if target is not None:
        timeout = options.get("socket_connect_timeout") or options.get("socket_timeout") or 2.0
        sentinel = redis.asyncio.sentinel.Sentinel(  # type: ignore[no-untyped-call,unused-ignore]
            list(target.sentinels), sentinel_kwargs={"socket_timeout": timeout}
        )
        client = sentinel.master_for(
            target.service,
            redis_class=_AsyncSentinelManaged,
            db=target.db,
            username=target.username,
            password=target.password,
            retry=AsyncRetry(NoBackoff(), 0),
            **options,
        )
        assert isinstance(client, _AsyncSentinelManaged)
        client.sentinels = list(sentinel.sentinels)
        return client
    return redis.asyncio.Redis.from_url(url, retry=AsyncRetry(NoBackoff(), 0), **options)


#: ``redis+sentinel://[user:password@]host:port[,host:port...]/SERVICE[/DB]``
SENTINEL_SCHEME = "redis+sentinel"


@dataclass(frozen=True)
class SentinelURL:
    """A Sentinel deployment: where its sentinels listen, the primary's service name, the
    database, and the credentials (for the primary and its replicas; the sentinels are
    asked without them)."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None


def parse_sentinel_url(url: str) -> SentinelURL | None:
    """The Sentinel deployment ``url`` names, or None for another scheme. Raises
    ``ValueError`` naming what is wrong."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme != SENTINEL_SCHEME:
        return None
    credentials, at, where = rest.rpartition("@")
    hosts, _, path = where.partition("/")
    parts = [p for p in path.split("/") if p]
    if not hosts or not parts or len(parts) > 2:
        raise ValueError(
            f"a Sentinel URL is {SENTINEL_SCHEME}://[user:password@]host:port[,host:port...]"
            f"/SERVICE_NAME[/DB], not {url!r}"
        )
    sentinels = []
    for item in hosts.split(","):
        host, colon, port = item.rpartition(":")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"sentinel {item!r} in the URL is not host:port")
        sentinels.append((host.strip("[]"), int(port)))
    if len(parts) == 2 and not parts[1].isdigit():
        raise ValueError(f"database {parts[1]!r} in the Sentinel URL is not a number")
    username, password = None, None
    if at:
        user, colon, secret = credentials.partition(":")
        username, password = unquote(user) or None, unquote(secret) if colon else None
    return SentinelURL(
        sentinels=tuple(sentinels),
        service=unquote(parts[0]),
        db=int(parts[1]) if len(parts) == 2 else 0,
        username=username,
        password=password,
    )


def _sentinel_client(target: SentinelURL, **options: Any) -> redis.Redis:
    """A client of the primary the sentinels name, found again after a failover (redis-py's
    Sentinel pool asks them at each new connection)."""
    timeout = options.get("socket_connect_timeout") or options.get("socket_timeout") or 2.0
    sentinel = redis.sentinel.Sentinel(  # type: ignore[no-untyped-call,unused-ignore]
        list(target.sentinels), sentinel_kwargs={"socket_timeout": timeout}
    )
    client = sentinel.master_for(  # type: ignore[no-untyped-call,unused-ignore]
        target.service,
        redis_class=_SentinelManaged,
        db=target.db,
        username=target.username,
        password=target.password,
        **options,
    )
    assert isinstance(client, _SentinelManaged)
    client.sentinels = list(sentinel.sentinels)
    return client


class _SentinelManaged(redis.Redis):
    """The primary's client; closing it closes the connections to the sentinels too (they
    are kept to find the primary again after a failover)."""

    sentinels: list[redis.Redis] = []  # noqa: RUF012 - set per client by _sentinel_client

    def close(self) -> None:
        super().close()
        for sentinel in self.sentinels:
            sentinel.close()


class _AsyncSentinelManaged(redis.asyncio.Redis):
    """:class:`_SentinelManaged` for asyncio."""

    sentinels: list[redis.asyncio.Redis] = []  # noqa: RUF012 - set per client by connect_async

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        for sentinel in self.sentinels:
            await sentinel.aclose()


def check_sentinel(target: SentinelURL, timeout_s: float = 2.0) -> None:
    """Raise ``ConnectionError`` with one line naming what is wrong: no sentinel answers,
    none knows the service, or the primary they name refuses the connection."""
    answered: list[str] = []
    for host, port in target.sentinels:
        probe = redis.Redis(host=host, port=port, socket_timeout=timeout_s,
                            socket_connect_timeout=timeout_s)  # fmt: skip
        try:
            masters = probe.sentinel_masters()
        except redis.RedisError:
            continue
        finally:
            probe.close()
        answered.append(f"{host}:{port}")
        if target.service in masters:
            break
    else:
        if not answered:
            where = ", ".join(f"{h}:{p}" for h, p in target.sentinels)
            raise redis.ConnectionError(f"no sentinel answers at {where}")
        raise redis.ConnectionError(
            f"no sentinel ({', '.join(answered)}) knows a service named {target.service!r}"
        )
    client = _sentinel_client(target, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    try:
        client.ping()
    except redis.AuthenticationError as exc:
        raise redis.ConnectionError(
            f"the primary of {target.service!r} refuses the credentials: {exc}"
        ) from None
    except redis.RedisError as exc:
        raise redis.ConnectionError(f"the primary of {target.service!r}: {exc}") from None
    finally:
        client.close()
