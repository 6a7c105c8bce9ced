"""Shared fixtures: a real redis-server for the session, flushed between tests, and the
store over it; contract tests run the store a second time on fakeredis."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import fakeredis
import pytest
import redis
from hypothesis import settings

from resumeq.fake import FakeProvider
from resumeq.fake.background import WINDOW_S
from resumeq.fake.server import THREAD_NAME
from resumeq.store import Store
from resumeq.testing import RedisServer
from resumeq.testing.processes import descendants

# ``HYPOTHESIS_PROFILE=thorough pytest tests/test_counting.py``: many more examples, for a
# change to the pure decision logic (the suite runs the default number).
settings.register_profile("thorough", max_examples=5_000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


#: How long a test's threads and processes may take to end once it is torn down.
LEAK_GRACE_S = 3.0
#: Threads a longer-lived fixture's event loop starts when first needed and keeps: its
#: default executor's (a test's own loop shuts them down when it closes).
KEPT_THREADS = ("asyncio_",)


#: The session's fake provider: its connections are the tests' own, and end with them.
_SESSION_FAKES: set[str] = set()


def _kept(thread: threading.Thread, before: set[str]) -> bool:
    """A thread that belongs to something longer-lived than the test: a default executor's,
    or a connection of a module's fake provider from that module's own worker processes
    (kept alive across its tests)."""
    if thread.name.startswith(KEPT_THREADS):
        return True
    server, _, conn = thread.name.rpartition(":")
    return conn == "conn" and server in before and server not in _SESSION_FAKES


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _of_an_elder(pid: int, before: set[int]) -> bool:
    """Whether ``pid`` was started by a process that was there before the test (a module's
    browser opening a renderer for a page): that process's, not the test's."""
    me = os.getpid()
    parent = _parent(pid)
    while parent is not None and parent != me:
        if parent in before:
            return True
        parent = _parent(parent)
    return False


def _ended(pid: int) -> bool:
    """Gone, a zombie, or multiprocessing's resource tracker (one per interpreter, started
    with the first semaphore and kept on purpose)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True
    tracker = b"multiprocessing.resource_tracker" in command
    return tracker or stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


@pytest.fixture(scope="session", autouse=True)
def a_cache_of_its_own(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The command line keeps config digests in the user's cache directory
    (:mod:`resumeq.core.config_digest`): the suite's go to a directory of its own, which every
    process it starts inherits, and nothing is left in the user's."""
    before = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))
    yield
    if before is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = before


@pytest.fixture(autouse=True)
def nothing_left_behind() -> Iterator[None]:
    """A test leaves no thread, timer or process of its own behind: what it started has
    ended once it (and its fixtures) are torn down. What the session's and modules'
    fixtures run was started before this fixture and is not counted."""
    threads = set(threading.enumerate())
    servers = {t.name for t in threads}
    processes = set(descendants(os.getpid()))
    yield
    deadline = time.monotonic() + LEAK_GRACE_S
    while True:
        left = [
            t
            for t in threading.enumerate()
            if t not in threads and t.is_alive() and not _kept(t, servers)
        ]
        born = [
            p
            for p in descendants(os.getpid())
            if p not in processes and not _ended(p) and not _of_an_elder(p, processes)
        ]
        if not (left or born) or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    assert not left, f"threads left running: {[t.name for t in left]}"
    assert not born, f"processes left running: {born}"


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
def store(request: pytest.FixtureRequest, redis_server: RedisServer) -> Iterator[Store]:
    """The store on a real redis-server, then on fakeredis (the embedded demo's Redis). The
    session's redis-server is asked for either way: started before the test, never during
    it (what a test starts, it must stop)."""
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
        _SESSION_FAKES.add(f"{THREAD_NAME}:{server.port}")
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
