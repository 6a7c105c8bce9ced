"""The test harness's redis-server: a port another process took between ``free_port`` and
the server's start is chosen again, and a server that answers on that port but is not
ours is never taken for ours."""

from __future__ import annotations

import socket

import pytest
import redis

from resumeq.testing import RedisServer
from resumeq.testing import redis_server as harness


@pytest.mark.timeout(30)
def test_a_taken_port_is_chosen_again(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as squatter:  # listens, never answers: not a Redis
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        offered = iter([taken])
        real_free_port = harness.free_port
        monkeypatch.setattr(harness, "free_port", lambda: next(offered, None) or real_free_port())
        with RedisServer() as server:
            assert server.port != taken
            client = redis.Redis.from_url(server.url)
            try:
                assert client.info("server")["process_id"] == server.process.pid  # type: ignore[union-attr]
            finally:
                client.close()


@pytest.mark.timeout(30)
def test_a_port_given_is_never_changed(redis_server: RedisServer) -> None:
    other = RedisServer(port=redis_server.port)  # another Redis answers there
    with pytest.raises(RuntimeError, match=rf"port {redis_server.port} is taken"):
        other.start()
    other.close()
