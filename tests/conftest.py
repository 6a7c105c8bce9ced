"""Shared fixtures: a real redis-server for the session, flushed between tests, and the
store over it; contract tests run the store a second time on fakeredis."""

from __future__ import annotations

import os
from collections.abc import Iterator

import fakeredis
import pytest
import redis
from hypothesis import settings

from resumeq.fake import FakeProvider
from resumeq.fake.background import WINDOW_S
from resumeq.store import Store
from resumeq.testing import RedisServer

# ``HYPOTHESIS_PROFILE=thorough pytest tests/test_counting.py``: many more examples, for a
# change to the pure decision logic (the suite runs the default number).
settings.register_profile("thorough", max_examples=5_000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    server.start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def redis_client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def real_store(redis_client: redis.Redis) -> Store:
    return Store(redis_client)


@pytest.fixture(params=["redis-server", "fakeredis"])
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    """The store on a real redis-server, then on fakeredis (the embedded demo's Redis)."""
    if request.param == "redis-server":
        yield Store(request.getfixturevalue("redis_client"))
        return
    client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    try:
        yield Store(client)
    finally:
        client.close()


@pytest.fixture(scope="session")
def fake_server() -> Iterator[FakeProvider]:
    with FakeProvider() as server:
        yield server


@pytest.fixture
def fake(fake_server: FakeProvider) -> FakeProvider:
    """The fake provider over real HTTP on loopback, reset (faults, journal, cache)."""
    fake_server.reset()
    fake_server.completion_tokens = None
    fake_server.token_delay_ms = 0
    fake_server.configure_engine("vllm")  # the engine's quirks outlive a reset
    fake_server.state.background.window_s = WINDOW_S  # so do the background settings
    fake_server.state.background.queued_s = 0.0
    fake_server.state.background.ignores_starting_after = False
    return fake_server
