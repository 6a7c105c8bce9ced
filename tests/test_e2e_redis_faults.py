"""End to end: Redis restarted (AOF) or unreachable while a job streams (SPEC §8)."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_support import World, make_world

from resumeq.fake import FakeProvider
from resumeq.store import Store
from resumeq.testing import RedisServer
from resumeq.testing.processes import wait_for

pytestmark = [pytest.mark.timeout(120), pytest.mark.xdist_group("cpu-heavy")]


@pytest.fixture
def aof_server() -> Iterator[RedisServer]:
    with RedisServer(appendonly=True) as server:
        yield server


@pytest.fixture
def world(tmp_path: Path, aof_server: RedisServer, fake: FakeProvider) -> Iterator[World]:
    store = Store.from_url(aof_server.url)
    yield from make_world(tmp_path, store, fake, aof_server.url, lease_ttl_ms=4000)


def test_redis_restart_mid_stream_loses_nothing(world: World, aof_server: RedisServer) -> None:
    world.fake.completion_tokens = 300
    world.fake.token_delay_ms = 10
    world.cluster.worker()
    world.cluster.janitor()
    prompt = "Write down everything, twice over."
    job_id = world.enqueue(prompt)
    world.wait_spent(job_id, 40)
    aof_server.restart()
    record = world.wait_state(job_id, {"done", "failed", "spilled", "abandoned"}, timeout_s=60)
    assert record.state.value == "done"
    assert world.store.text(job_id) == world.canonical(prompt)
    # The restart was shorter than the lease: the same attempt carried on.
    assert [a["kind"] for a in world.store.ledger(job_id)] == ["fresh"]


def test_redis_unreachable_past_the_lease_stops_the_stream_then_resumes(
    world: World, aof_server: RedisServer
) -> None:
    world.fake.completion_tokens = 3000
    world.fake.token_delay_ms = 10
    world.cluster.worker()
    world.cluster.janitor()
    prompt = "A long answer through a Redis outage."
    job_id = world.enqueue(prompt, budget_tokens=4000)
    world.wait_spent(job_id, 40)
    assert aof_server.process is not None
    aof_server.process.send_signal(signal.SIGSTOP)  # Redis stops answering
    try:
        # The worker closes the stream once its lease would be gone (4 s): the provider
        # stopped, long before the answer's end.
        stopped = time.monotonic()
        wait_for(
            lambda: world.requests_for(prompt)[0]["outcome"] != "in_progress",
            timeout_s=10,
            what="the stream closed",
        )
        assert time.monotonic() - stopped >= 2.0  # not before the lease's end drew near
        assert world.requests_for(prompt)[0]["tokens_emitted"] < 1500
    finally:
        world.fake.token_delay_ms = 0
        aof_server.process.send_signal(signal.SIGCONT)
    record = world.wait_state(job_id, {"done", "failed", "spilled", "abandoned"}, timeout_s=60)
    assert record.state.value == "done"
    assert world.store.text(job_id) == world.canonical(prompt)
    kinds = [a["kind"] for a in world.store.ledger(job_id)]
    assert kinds[0] == "fresh" and "resume" in kinds
    billed = sum(r["output_tokens_billed"] for r in world.requests_for(prompt))
    assert billed < 3000 + 1500  # a continuation, not a replay


def test_redis_unreachable_past_the_lease_stops_fifty_streams_then_resumes_them(
    world: World, aof_server: RedisServer
) -> None:
    world.fake.completion_tokens = 600
    world.fake.token_delay_ms = 20
    world.cluster.worker(concurrency=50)
    world.cluster.janitor()
    prompts = [f"Stream {i:02d} of fifty through a Redis outage." for i in range(50)]
    job_ids = [world.enqueue(p, budget_tokens=800) for p in prompts]
    for job_id in job_ids:
        world.wait_spent(job_id, 16, timeout_s=40)
    assert aof_server.process is not None
    aof_server.process.send_signal(signal.SIGSTOP)
    try:
        # Every stream is closed once its lease would be gone (4 s): the provider stopped.
        stopped = time.monotonic()
        wait_for(
            lambda: all(world.requests_for(p)[0]["outcome"] != "in_progress" for p in prompts),
            timeout_s=10,
            what="every stream closed",
        )
        assert time.monotonic() - stopped >= 2.0  # not before the lease's end drew near
    finally:
        world.fake.token_delay_ms = 0
        aof_server.process.send_signal(signal.SIGCONT)
    for job_id, prompt in zip(job_ids, prompts, strict=True):
        record = world.wait_state(job_id, {"done", "failed", "spilled", "abandoned"}, timeout_s=90)
        assert record.state.value == "done", (job_id, record.error)
        # nothing written after the fence: the text is exactly the canonical answer
        assert world.store.text(job_id) == world.canonical(prompt)
