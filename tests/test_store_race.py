"""Two worker processes race to acquire the same queued job: exactly one wins, every time."""

from __future__ import annotations

import multiprocessing as mp
from multiprocessing.synchronize import Barrier

import pytest

from resumeq.core.errors import InvalidTransition
from resumeq.store import Store, keys
from resumeq.testing import RedisServer

ROUNDS = 200


def _racer(url: str, name: str, job_ids: list[str], barrier: Barrier, out: mp.Queue) -> None:  # type: ignore[type-arg]
    store = Store.from_url(url)
    results = []
    for job_id in job_ids:
        barrier.wait(timeout=10)
        try:
            store.acquire(job_id, worker=name, ttl_ms=60_000)
            results.append((job_id, "won"))
        except InvalidTransition as exc:
            results.append((job_id, f"lost:{exc.state}"))
    out.put((name, results))


@pytest.mark.timeout(120)
def test_exactly_one_of_two_processes_acquires(
    redis_server: RedisServer, real_store: Store
) -> None:
    spec = {"prompt": "race", "provider": "local", "model": "m", "budget_tokens": 100}
    job_ids = [real_store.create(spec).id for _ in range(ROUNDS)]
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(2)
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_racer, args=(redis_server.url, name, job_ids, barrier, out))
        for name in ("A", "B")
    ]
    for p in procs:
        p.start()
    try:
        reports = dict(out.get(timeout=90) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
    a, b = dict(reports["A"]), dict(reports["B"])
    for job_id in job_ids:
        outcomes = sorted([a[job_id], b[job_id]])
        assert outcomes == ["lost:running", "won"], (job_id, outcomes)
        rec = real_store.get(job_id)
        assert rec.attempt == 1 and rec.revision == 1
        assert real_store.redis.xlen(keys.events(job_id)) == 1
    wins = sum(1 for v in a.values() if v == "won")
    assert 0 < wins < ROUNDS or ROUNDS < 20, "one process won every race: not a race"
