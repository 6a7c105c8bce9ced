"""Retries paced by time, not counted out: a provider outage longer than five quick attempts
no longer spills every job. On the worker's code path, a real redis-server and the fake
provider over HTTP; attempts are run one after the other (their delays are not waited for,
but recorded in the outbox)."""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest
from worker_support import attempt_runner, run_to_rest

from resumeq.core import gate
from resumeq.fake import FakeProvider
from resumeq.queue import due
from resumeq.queue.queueing import attempt_rq_id
from resumeq.store import Store
from resumeq.testing import RedisServer

pytestmark = pytest.mark.timeout(60)


def due_in_ms(store: Store, job_id: str) -> int:
    """How long until the job's next attempt is due, from the due-time index."""
    record = store.get(job_id)
    (at,) = due.due_at(store.redis, [attempt_rq_id(job_id, record.attempt + 1)])
    assert at is not None, "the next attempt is not in the due-time index"
    return int(at - time.time() * 1000)


def profile(fake: FakeProvider) -> dict[str, Any]:
    return {"kind": "openai", "base_url": fake.openai_base_url, "counting": "usage"}


def test_an_outage_longer_than_max_attempts_is_waited_out(
    fake: FakeProvider, redis_server: RedisServer, real_store: Store
) -> None:
    """Before: 503s for 20 s spilled every job after five attempts within 19 s."""
    fake.completion_tokens = 60
    prompt = "Answer once the provider is back"
    fake.add_faults([{"kind": "status", "status": 503, "times": 7, "match": prompt}])
    spec = {"prompt": prompt, "provider": "p", "model": "m", "budget_tokens": 200}
    job_id = real_store.create(spec).id
    delays = []
    with attempt_runner(redis_server.url, {"p": profile(fake)}) as runner:
        for _ in range(7):
            runner.run(job_id)
            record = real_store.get(job_id)
            assert record.state.value == "queued", record.reason  # never spilled
            delays.append(due_in_ms(real_store, job_id))
        assert record.failures == 7 and record.failing_since_ms
        record = run_to_rest(runner, job_id)
    assert record.state.value == "done" and record.attempt == 8 > spec.get("max_attempts", 5)
    assert record.failures == 0 and record.failing_since_ms is None  # progress resets it
    # Backoff grows with each failure ("equal" jitter: between half and all of 2^(n-1) s)
    # until the ceiling reaches its cap: the seventh's (60 s, capped from 64) gives between
    # 30 and 60 s, which may be less than the sixth's up to 32 s (a rare flake, before).
    assert delays[0] <= 1_000 and delays[5] > 10_000
    assert all(b >= a - 50 for a, b in itertools.pairwise(delays[:6]))
    assert gate.BACKOFF_CAP_S * 500 - 50 <= delays[6] <= gate.BACKOFF_CAP_S * 1000


def test_a_failure_longer_than_the_retry_window_takes_the_jobs_exit(
    fake: FakeProvider, redis_server: RedisServer, real_store: Store
) -> None:
    prompt = "The provider stays down"
    fake.add_faults([{"kind": "status", "status": 503, "times": 100, "match": prompt}])
    spec = {"prompt": prompt, "provider": "p", "model": "m", "budget_tokens": 200}
    job_id = real_store.create(spec).id
    with attempt_runner(redis_server.url, {"p": profile(fake)}, retry_window_s=1.0) as runner:
        runner.run(job_id)
        assert real_store.get(job_id).state.value == "queued"
        time.sleep(1.1)
        runner.run(job_id)
    record = real_store.get(job_id)
    assert record.state.value == "spilled"
    assert "no output for" in (record.reason or "") and "retry window 1 s" in (record.reason or "")


def test_a_429_retry_after_is_honoured_and_not_counted_out(
    fake: FakeProvider, redis_server: RedisServer, real_store: Store
) -> None:
    """Before: a 429 with Retry-After 2 gave five attempts 3 s apart, then a spill."""
    prompt = "Rate limited for a while"
    fake.add_faults(
        [{"kind": "status", "status": 429, "retry_after": 2, "times": 6, "match": prompt}]
    )
    spec = {"prompt": prompt, "provider": "p", "model": "m", "budget_tokens": 200}
    job_id = real_store.create(spec).id
    with attempt_runner(redis_server.url, {"p": profile(fake)}) as runner:
        for _ in range(6):
            runner.run(job_id)
            assert 1_900 < due_in_ms(real_store, job_id) <= 2_000  # 2 s, to the millisecond
        record = run_to_rest(runner, job_id)
    assert record.state.value == "done" and record.attempt == 7
