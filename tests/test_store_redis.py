"""The store against a real redis-server: unreachable Redis, script cache loss, restarts."""

from __future__ import annotations

import pytest

from resumeq.core.errors import RedisUnavailable
from resumeq.core.models import JobState
from resumeq.store import Store
from resumeq.testing import RedisServer, free_port

SPEC = {"prompt": "hi", "provider": "local", "model": "m", "budget_tokens": 100}


def test_unreachable_redis_raises_redis_unavailable() -> None:
    store = Store.from_url(f"redis://127.0.0.1:{free_port()}/0")
    with pytest.raises(RedisUnavailable):
        store.get("abc")
    with pytest.raises(RedisUnavailable):
        store.create(SPEC)


def test_scripts_survive_a_script_flush(real_store: Store) -> None:
    job_id = real_store.create(SPEC).id
    real_store.redis.script_flush()
    got = real_store.acquire(job_id, worker="w1", ttl_ms=5000)
    assert got.record.state is JobState.RUNNING


@pytest.mark.timeout(60)
def test_job_survives_a_redis_restart_with_aof() -> None:
    with RedisServer(appendonly=True) as server:
        store = Store.from_url(server.url)
        job_id = store.create(SPEC).id
        got = store.acquire(job_id, worker="w1", ttl_ms=30_000)
        store.flush(got.lease, expected_revision=1, delta="kept", tokens=1)
        server.restart()
        # The pooled connection died with the old server; the client reconnects, and the
        # scripts are loaded again into the new server's empty script cache.
        rev = store.flush(got.lease, expected_revision=2, delta=" and more", tokens=2).revision
        assert store.text(job_id) == "kept and more" and rev == 3
        store.redis.close()
