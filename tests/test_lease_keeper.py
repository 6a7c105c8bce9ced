"""One thread keeps every lease of a process: due leases are renewed in one pipelined
round trip per tick, a refused renew stops exactly that attempt, Redis out of reach for a
whole TTL stops them all, and closing leaves no thread behind."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import pytest

from resumeq.core.errors import RedisUnavailable, StoreError
from resumeq.core.models import Lease
from resumeq.store import Store, keys
from resumeq.worker.heartbeat import LeaseKeeper

SPEC = {"prompt": "hi", "provider": "p", "model": "m", "budget_tokens": 100}


class CountingStore(Store):
    """Counts batched renewals; ``down`` makes Redis out of reach for them."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.batches: list[int] = []
        self.down = False

    def renew_many(self, leases: Sequence[Lease]) -> list[Lease | StoreError]:
        if self.down:
            raise RedisUnavailable("renew: Redis unreachable (test)")
        self.batches.append(len(leases))
        return super().renew_many(leases)


def keeper_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "resumeq-lease-keeper"]


@pytest.mark.timeout(20)
def test_many_leases_are_renewed_together_and_a_cancel_stops_only_its_own(
    real_store: Store,
) -> None:
    store = CountingStore(real_store.redis)
    keeper = LeaseKeeper(store)
    lost: dict[str, BaseException] = {}
    held = []
    try:
        for _ in range(50):
            got = store.acquire(store.create(SPEC).id, worker="w", ttl_ms=600)
            job_id = got.lease.job_id
            held.append(keeper.hold(got.lease, on_lost=lambda e, j=job_id: lost.setdefault(j, e),
                                    confirmed=lambda: 0.0))  # fmt: skip
        time.sleep(1.5)  # several TTLs: only renewals keep the leases
        assert all(real_store.redis.pttl(keys.lease(h.lease.job_id)) > 0 for h in held)
        assert lost == {}
        assert max(store.batches) == 50  # one round trip renewed them all
        assert len(store.batches) <= 1.5 / 0.2 + 2  # about once a TTL/3, not per lease
        assert keeper.worst_lag_s < 0.2
        cancelled = held[7].lease.job_id
        real_store.cancel(cancelled)
        deadline = time.monotonic() + 2
        while cancelled not in lost and time.monotonic() < deadline:
            time.sleep(0.02)
        assert set(lost) == {cancelled} and held[7].lost is lost[cancelled]
        assert keeper.held() == 49
    finally:
        keeper.close()
    assert keeper_threads() == []


@pytest.mark.timeout(20)
def test_redis_out_of_reach_for_a_whole_ttl_stops_every_stream(real_store: Store) -> None:
    store = CountingStore(real_store.redis)
    keeper = LeaseKeeper(store)
    lost = threading.Semaphore(0)
    try:
        for _ in range(3):
            got = store.acquire(store.create(SPEC).id, worker="w", ttl_ms=300)
            keeper.hold(got.lease, on_lost=lambda e: lost.release(), confirmed=lambda: 0.0)
        store.down = True
        for _ in range(3):
            assert lost.acquire(timeout=2)
        assert keeper.held() == 0
    finally:
        keeper.close()


@pytest.mark.timeout(20)
def test_a_recent_flush_spares_a_renew_and_release_stops_renewing(real_store: Store) -> None:
    store = CountingStore(real_store.redis)
    keeper = LeaseKeeper(store)
    try:
        got = store.acquire(store.create(SPEC).id, worker="w", ttl_ms=300)
        flushed = [time.monotonic()]
        held = keeper.hold(got.lease, on_lost=lambda e: None, confirmed=lambda: flushed[0])
        for _ in range(6):  # a flush every 50 ms extends the lease: no renew needed
            time.sleep(0.05)
            flushed[0] = time.monotonic()
        assert store.batches == []
        held.release()
        time.sleep(0.5)
        assert store.batches == [] and keeper.held() == 0
    finally:
        keeper.close()
    with pytest.raises(RuntimeError, match="closed"):
        keeper.hold(got.lease, on_lost=lambda e: None, confirmed=lambda: 0.0)


class SlowStore(Store):
    """Answers each batched renewal ``delay_s`` after it was asked, noting when."""

    delay_s = 0.3

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.asked: list[float] = []

    def renew_many(self, leases: Sequence[Lease]) -> list[Lease | StoreError]:
        self.asked.append(time.monotonic())
        renewed = super().renew_many(leases)
        time.sleep(self.delay_s)
        return renewed


@pytest.mark.timeout(20)
def test_a_renewal_counts_from_when_it_was_asked_not_answered(real_store: Store) -> None:
    """The TTL runs from when Redis renewed the lease, which is no later than when the
    keeper asked: a slow answer must not make the lease look fresher than it is."""
    store = SlowStore(real_store.redis)
    keeper = LeaseKeeper(store)
    try:
        got = store.acquire(store.create(SPEC).id, worker="w", ttl_ms=3000)  # renewed each 1 s
        held = keeper.hold(got.lease, on_lost=lambda e: None, confirmed=lambda: 0.0)
        deadline = time.monotonic() + 5
        while not store.asked and time.monotonic() < deadline:
            time.sleep(0.01)
        assert store.asked, "no renewal was asked"
        time.sleep(store.delay_s + 0.2)  # answered and taken, the next one not yet due
        assert len(store.asked) == 1
        assert held.last_extended() <= store.asked[0]
    finally:
        keeper.close()
