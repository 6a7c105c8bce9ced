"""Security: Redis with TLS and an ACL user; no API key or prompt text where it must not be."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from e2e_support import World, make_world

from resumeq.fake import FakeProvider
from resumeq.store import Store
from resumeq.testing import RedisServer

pytestmark = pytest.mark.timeout(90)

SECRET = "sk-test-DO-NOT-STORE-4f1c2a9e7b"


@pytest.fixture(scope="module")
def tls_server() -> Iterator[RedisServer]:
    with RedisServer(tls=True, username="resumeq", password="s3cret-pw") as server:
        yield server


@pytest.fixture
def world(tmp_path: Path, tls_server: RedisServer, fake: FakeProvider) -> Iterator[World]:
    store = Store.from_url(tls_server.url)
    store.redis.flushall()
    for w in make_world(tmp_path, store, fake, tls_server.url):
        w.cluster.env["RESUMEQ_TEST_API_KEY"] = SECRET
        yield w
    store.redis.close()


def everything_in(client: redis.Redis) -> bytes:
    """Every key name and value in Redis, whatever its type."""
    out = []
    for key in client.scan_iter("*"):
        out.append(key)
        kind = client.type(key)
        if kind == b"string":
            out.append(client.get(key) or b"")
        elif kind == b"hash":
            out += [b"%s=%s" % kv for kv in client.hgetall(key).items()]
        elif kind == b"list":
            out += client.lrange(key, 0, -1)
        elif kind == b"set":
            out += list(client.smembers(key))
        elif kind == b"zset":
            out += [m for m, _ in client.zrange(key, 0, -1, withscores=True)]
        elif kind == b"stream":
            for _, fields in client.xrange(key):
                out += [b"%s=%s" % kv for kv in fields.items()]
    return b"\n".join(out)


def test_a_run_over_tls_with_an_acl_user_stores_no_key_and_logs_no_text(world: World) -> None:
    config = world.config.read_text().replace(
        "[providers.fake]\n", '[providers.fake]\napi_key_env = "RESUMEQ_TEST_API_KEY"\n'
    )
    world.config.write_text(config)
    world.cluster.worker()
    world.cluster.janitor()
    prompts = ["The first secret-free prompt.", "The second secret-free prompt."]
    world.fake.add_faults([{"kind": "disconnect", "after_tokens": 25}])
    ids = [world.enqueue(p) for p in prompts]
    for job_id, prompt in zip(ids, prompts, strict=True):
        assert world.wait_state(job_id, {"done", "failed", "spilled"}).state.value == "done"
        assert world.store.text(job_id) == world.canonical(prompt)

    stored = everything_in(world.store.redis)
    assert prompts[0].encode() in stored  # the scan does read the values
    assert SECRET.encode() not in stored
    assert SECRET[-10:].encode() not in stored

    logs = world.cluster.logs()
    assert "attempt 2" in logs or "resume" in logs  # the logs were written
    for prompt in prompts:
        assert prompt not in logs
        assert world.canonical(prompt)[:40] not in logs
    assert SECRET not in logs


def test_a_wrong_password_is_one_clear_line(tls_server: RedisServer) -> None:
    url = tls_server.url.replace("s3cret-pw", "wrong")
    out = subprocess.run(
        [sys.executable, "-m", "resumeq", "--redis-url", url, "status", "abc"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert out.returncode == 1 and out.stderr.count("\n") == 1
    assert "Redis" in out.stderr and "Traceback" not in out.stderr
