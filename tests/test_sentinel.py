"""``redis+sentinel://`` URLs (SPEC §17): parsed with errors that name what is wrong, and
connected through a real sentinel (``redis-server --sentinel``) to the primary it names;
each way it can be misconfigured is one line naming which."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from resumeq.producer.async_client import AsyncClient
from resumeq.store import Store
from resumeq.store.connection import SentinelURL, check_sentinel, connect, parse_sentinel_url
from resumeq.testing import RedisServer, free_port

pytestmark = pytest.mark.timeout(60)


def test_sentinel_urls_are_parsed_and_bad_ones_named() -> None:
    assert parse_sentinel_url("redis://localhost:6379/0") is None
    got = parse_sentinel_url("redis+sentinel://u:p%40ss@s1:26379,[::1]:26380/mymaster/2")
    assert got == SentinelURL(
        sentinels=(("s1", 26379), ("::1", 26380)),
        service="mymaster",
        db=2,
        username="u",
        password="p@ss",
    )
    assert parse_sentinel_url("redis+sentinel://s1:26379/mymaster") == SentinelURL(
        sentinels=(("s1", 26379),), service="mymaster"
    )
    for bad, what in [
        ("redis+sentinel://s1:26379", "SERVICE_NAME"),
        ("redis+sentinel://s1:26379/a/b/c", "SERVICE_NAME"),
        ("redis+sentinel://s1/mymaster", "sentinel 's1' in the URL is not host:port"),
        ("redis+sentinel://s1:99999/mymaster", "is not host:port"),
        ("redis+sentinel://s1:26379/mymaster/zero", "database 'zero'"),
    ]:
        with pytest.raises(ValueError, match=what):
            parse_sentinel_url(bad)


@pytest.fixture
def primary() -> Iterator[RedisServer]:
    with RedisServer(password="right") as server:
        yield server


@pytest.fixture
def sentinel(tmp_path: Path, primary: RedisServer) -> Iterator[int]:
    port = free_port()
    conf = tmp_path / "sentinel.conf"
    conf.write_text(
        f"port {port}\nbind 127.0.0.1\ndir {tmp_path}\n"
        f"sentinel monitor mymaster 127.0.0.1 {primary.port} 1\n"
        "sentinel auth-pass mymaster right\n"
    )
    proc = subprocess.Popen(
        ["redis-server", str(conf), "--sentinel"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        probe = redis.Redis(port=port, socket_timeout=1)
        deadline = time.monotonic() + 10
        while True:
            try:
                if "mymaster" in probe.sentinel_masters():
                    break
            except redis.RedisError:
                pass
            assert time.monotonic() < deadline, "the sentinel did not start"
            time.sleep(0.05)
        probe.close()
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def test_a_sentinel_url_reaches_the_primary_it_names(sentinel: int) -> None:
    url = f"redis+sentinel://:right@127.0.0.1:{sentinel}/mymaster/0"
    check_sentinel(parse_sentinel_url(url))  # type: ignore[arg-type]
    client = connect(url, socket_timeout=2)
    try:
        store = Store(client)
        job_id = store.create(
            {"prompt": "through a sentinel", "provider": "p", "model": "m", "budget_tokens": 10}
        ).id
        assert store.get(job_id).state.value == "queued"
    finally:
        client.close()


def test_each_misconfiguration_is_one_line_naming_it(sentinel: int) -> None:
    closed = free_port()
    cases = [
        (f"redis+sentinel://:right@127.0.0.1:{closed}/mymaster",
         f"no sentinel answers at 127.0.0.1:{closed}"),
        (f"redis+sentinel://:right@127.0.0.1:{sentinel}/other", "knows a service named 'other'"),
        (f"redis+sentinel://:wrong@127.0.0.1:{sentinel}/mymaster", "refuses the credentials"),
    ]  # fmt: skip
    for url, message in cases:
        target = parse_sentinel_url(url)
        assert target is not None
        with pytest.raises(redis.ConnectionError, match=message) as caught:
            check_sentinel(target, timeout_s=1.0)
        assert "\n" not in str(caught.value)


def test_the_command_line_names_what_is_wrong_in_one_line(sentinel: int) -> None:
    closed = free_port()
    for url, message in [
        (f"redis+sentinel://127.0.0.1:{closed}/mymaster", "no sentinel answers"),
        (f"redis+sentinel://:right@127.0.0.1:{sentinel}/other", "no sentinel"),
        (f"redis+sentinel://:wrong@127.0.0.1:{sentinel}/mymaster", "refuses the credentials"),
        ("redis+sentinel://127.0.0.1/mymaster", "is not host:port"),
    ]:
        out = subprocess.run(
            [sys.executable, "-m", "resumeq", "status", "some-job"],
            env={**os.environ, "RESUMEQ_REDIS_URL": url},
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert out.returncode != 0 and message in out.stderr, (url, out.stderr)
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    good = f"redis+sentinel://:right@127.0.0.1:{sentinel}/mymaster"
    out = subprocess.run(
        [sys.executable, "-m", "resumeq", "status", "some-job"],
        env={**os.environ, "RESUMEQ_REDIS_URL": good},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert "no job some-job" in out.stderr, out.stderr  # it reached the primary


def test_the_async_client_of_resumeq_serve_goes_through_the_sentinel(sentinel: int) -> None:
    """``resumeq serve`` reads and follows with the asyncio client: a Sentinel URL gives
    it the primary the sentinels name, as the sync one."""
    url = f"redis+sentinel://:right@127.0.0.1:{sentinel}/mymaster/0"
    spec = {"prompt": "served through a sentinel", "provider": "p", "model": "m",
            "budget_tokens": 10}  # fmt: skip

    async def through() -> tuple[str, str]:
        async with AsyncClient.from_url(url, socket_timeout=2.0) as client:
            job_id = await client.enqueue(spec)
            record = await client.record(job_id)
            return job_id, record.state.value

    job_id, state = asyncio.run(through())
    assert state == "queued"
    client = connect(url, socket_timeout=2)
    try:
        assert Store(client).get(job_id).spec.prompt == "served through a sentinel"
    finally:
        client.close()
