"""The idle flusher: a burst followed by a pause of the provider is durable within about
``flush_ms``, not at the next token (which may come only when the stall timeout cuts the
stream). Against a real redis-server."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest

from resumeq.core.errors import JobCancelled, LeaseLost, RedisUnavailable, WriteRefused
from resumeq.core.models import Acquired, FlushResult, Lease
from resumeq.store import Store, keys
from resumeq.testing.processes import wait_for
from resumeq.worker.checkpoint import Checkpointer, IdleFlusher

pytestmark = pytest.mark.timeout(60)

SPEC = {"prompt": "p", "provider": "local", "model": "m", "budget_tokens": 60_000}


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class CountingStore(Store):
    """Counts flush calls; fails the next ``down`` of them as an unreachable Redis, and the
    next ``broken`` with an error nobody planned for."""

    calls = 0
    down = 0
    broken = 0

    def flush(self, lease: Lease, **kwargs: Any) -> FlushResult:
        self.calls += 1
        if self.down:
            self.down -= 1
            raise RedisUnavailable("flush: Redis unreachable: test")
        if self.broken:
            self.broken -= 1
            raise RuntimeError("an error nobody planned for")
        return super().flush(lease, **kwargs)


def started(store: Store) -> Acquired:
    return store.acquire(store.create(SPEC).id, worker="w1", ttl_ms=10_000)


def counting(store: Store) -> CountingStore:
    return CountingStore(store.redis, settings=store.settings, limits=store.limits)


@pytest.fixture
def flusher() -> Any:
    idle = IdleFlusher()
    yield idle
    idle.close()
    assert not [t for t in threading.enumerate() if t.name == "resumeq-idle-flusher"]


def test_flush_idle_writes_only_once_a_threshold_has_passed(real_store: Store) -> None:
    got = started(real_store)
    clock = Clock()
    ck = Checkpointer(real_store, got.lease, revision=1, flush_tokens=32, flush_ms=250,
                      flush_min_ms=20, clock=clock)  # fmt: skip
    assert not ck.flush_idle()  # nothing pending
    ck.add("Once upon ", 3, exact=True)
    clock.t = 0.2
    assert not ck.flush_idle() and ck.flushes == 0  # not due: 200 ms < flush_ms
    clock.t = 0.25
    assert ck.flush_idle()
    assert ck.flushes == 1 and ck.pending_tokens == 0
    assert real_store.text(got.lease.job_id) == "Once upon "
    assert real_store.get(got.lease.job_id).spent_output_tokens == 3
    assert not ck.flush_idle()  # nothing left
    # A count threshold that the add could not take (inside flush_min_ms of the last
    # flush) is taken by the idle flush once flush_min_ms has passed.
    for _ in range(32):
        ck.add("a ", 1, exact=True)
    assert ck.flushes == 1 and ck.pending_tokens == 32
    clock.t = 0.27
    assert ck.flush_idle() and ck.flushes == 2
    assert real_store.get(got.lease.job_id).spent_output_tokens == 35


def test_flush_idle_stays_out_of_an_outage_and_after_close(real_store: Store) -> None:
    store = counting(real_store)
    got = started(store)
    clock = Clock()
    ck = Checkpointer(store, got.lease, revision=1, flush_tokens=32, flush_ms=250, clock=clock)
    ck.add("kept ", 2, exact=True)
    clock.t = 0.3
    store.down = 5
    assert not ck.flush_idle() and store.calls == 1  # tried once, found Redis down
    clock.t = 0.6
    assert not ck.flush_idle() and store.calls == 1  # the attempt's next delta tries again
    store.down = 0
    ck.add("and more ", 2, exact=True)  # the batch that found Redis down, then this one
    assert ck.flushes == 2 and store.text(got.lease.job_id) == "kept and more "
    ck.add("left ", 1, exact=True)
    ck.close()
    clock.t = 5.0
    assert not ck.flush_idle() and ck.pending_tokens == 1  # the attempt's to write
    assert ck.flush() and store.text(got.lease.job_id) == "kept and more left "


def test_a_burst_then_a_pause_is_flushed_within_about_flush_ms(
    real_store: Store, flusher: IdleFlusher
) -> None:
    got = started(real_store)
    ck = Checkpointer(real_store, got.lease, revision=1, flush_tokens=32, flush_ms=100,
                      flush_min_ms=20)  # fmt: skip
    token = flusher.watch(ck, lambda exc: None)
    burst = "| col | 値 |\n|---|---|\n| 🦀 | 1 |\n"
    ck.add(burst, 12, exact=True)
    began = time.monotonic()
    wait_for(lambda: real_store.get(got.lease.job_id).spent_output_tokens == 12,
             timeout_s=5, interval_s=0.005, what="the burst flushed in the pause")  # fmt: skip
    took = time.monotonic() - began
    assert real_store.text(got.lease.job_id) == burst
    # Not before flush_ms (counted from the checkpointer's start), and not long after.
    assert 0.05 <= took < 2.0, took
    flusher.unwatch(token)
    assert flusher.watching() == 0


class Watched(Checkpointer):
    """Counts the flushes its idle flusher made."""

    idle_writes = 0

    def flush_idle(self) -> bool:
        wrote = super().flush_idle()
        self.idle_writes += wrote
        return wrote


def test_deltas_and_idle_flushes_side_by_side_write_every_delta_once(
    real_store: Store, flusher: IdleFlusher
) -> None:
    """The attempt's thread adds while the flusher flushes: every delta lands once, in
    order, and the revision counts each flush once."""
    got = started(real_store)
    ck = Watched(real_store, got.lease, revision=1, flush_tokens=20, flush_ms=4,
                 flush_min_ms=1)  # fmt: skip
    flusher.watch(ck, lambda exc: pytest.fail(f"refused: {exc}"))
    rng = random.Random(7)
    pieces = [f"{i}:{'ß' if i % 7 else '日本'} " for i in range(1500)]
    for piece in pieces:
        ck.add(piece, 1, exact=True)
        if rng.random() < 0.05:
            time.sleep(rng.choice([0.001, 0.01, 0.02]))  # pauses around the flusher's tick
    assert ck.flush()
    record = real_store.get(got.lease.job_id)
    assert real_store.text(got.lease.job_id) == "".join(pieces)
    assert record.spent_output_tokens == ck.flushed_tokens == len(pieces)
    assert record.revision == 1 + ck.flushes
    assert ck.idle_writes > 0, "the idle flusher took no part"


def test_a_refused_idle_flush_stops_the_attempt_once(
    real_store: Store, flusher: IdleFlusher
) -> None:
    got = started(real_store)
    ck = Checkpointer(real_store, got.lease, revision=1, flush_tokens=32, flush_ms=50)
    refused: list[WriteRefused] = []
    flusher.watch(ck, refused.append)
    real_store.cancel(got.lease.job_id)
    ck.add("after the cancel ", 3, exact=True)
    wait_for(lambda: refused, timeout_s=5, what="the refusal")
    time.sleep(0.2)  # several more ticks: told once, no longer watched
    assert len(refused) == 1 and isinstance(refused[0], JobCancelled)
    assert flusher.watching() == 0
    assert real_store.text(got.lease.job_id) == ""


def test_the_flusher_goes_on_past_an_unexpected_error(
    real_store: Store, flusher: IdleFlusher, caplog: pytest.LogCaptureFixture
) -> None:
    store = counting(real_store)
    store.broken = 1
    one, two = started(store), started(store)
    a = Checkpointer(store, one.lease, revision=1, flush_tokens=32, flush_ms=50)
    b = Checkpointer(store, two.lease, revision=1, flush_tokens=32, flush_ms=50)
    flusher.watch(a, lambda exc: None)
    flusher.watch(b, lambda exc: None)
    a.add("first ", 1, exact=True)
    b.add("second ", 1, exact=True)
    wait_for(lambda: a.flushes == 1 and b.flushes == 1, timeout_s=5, what="both flushed")
    assert store.text(one.lease.job_id) == "first " and store.text(two.lease.job_id) == "second "
    assert "idle flush failed" in caplog.text


def test_a_job_gone_from_under_an_idle_flush_stops_its_stream_once(
    real_store: Store, flusher: IdleFlusher
) -> None:
    """The job's record vanished (an operator deleted the keys by hand): the stream is
    stopped as for a lost lease, told once, and the checkpointer is no longer watched."""
    got = started(real_store)
    ck = Checkpointer(real_store, got.lease, revision=1, flush_tokens=32, flush_ms=50)
    refused: list[WriteRefused] = []
    flusher.watch(ck, refused.append)
    real_store.redis.delete(keys.job(got.lease.job_id))
    ck.add("into nothing ", 2, exact=True)
    wait_for(lambda: refused, timeout_s=5, what="the refusal")
    time.sleep(0.2)
    assert len(refused) == 1 and isinstance(refused[0], LeaseLost), refused
    assert refused[0].job_id == got.lease.job_id and "no job" in str(refused[0])
    assert flusher.watching() == 0


def test_a_failing_stop_does_not_end_the_flusher(real_store: Store, flusher: IdleFlusher) -> None:
    """The attempt's ``on_refused`` raised: the thread serves the process's other attempts
    on."""
    one, two = started(real_store), started(real_store)
    a = Checkpointer(real_store, one.lease, revision=1, flush_tokens=32, flush_ms=50)
    b = Checkpointer(real_store, two.lease, revision=1, flush_tokens=32, flush_ms=50)

    def broken_stop(exc: WriteRefused) -> None:
        raise RuntimeError("the stream would not close")

    flusher.watch(a, broken_stop)
    real_store.cancel(one.lease.job_id)
    a.add("refused ", 1, exact=True)
    wait_for(lambda: flusher.watching() == 0, timeout_s=5, what="the refusal taken")
    flusher.watch(b, lambda exc: pytest.fail(f"refused: {exc}"))
    b.add("still flushed ", 2, exact=True)
    wait_for(lambda: b.flushes == 1, timeout_s=5, what="the other attempt flushed")
    assert real_store.text(two.lease.job_id) == "still flushed "


def test_an_error_that_lasts_is_logged_once_until_a_flush_goes_through(
    real_store: Store, flusher: IdleFlusher, caplog: pytest.LogCaptureFixture
) -> None:
    store = counting(real_store)
    store.broken = 10**6
    got = started(store)
    ck = Checkpointer(store, got.lease, revision=1, flush_tokens=32, flush_ms=20)
    flusher.watch(ck, lambda exc: None)
    ck.add("waits ", 1, exact=True)
    wait_for(lambda: store.calls >= 5, timeout_s=5, what="several failed looks")
    assert caplog.text.count("idle flush failed") == 1
    store.broken = 0
    wait_for(lambda: ck.flushes == 1, timeout_s=5, what="the flush once the error went")
    assert store.text(got.lease.job_id) == "waits "


def test_a_closed_flusher_takes_no_more(flusher: IdleFlusher, real_store: Store) -> None:
    got = started(real_store)
    ck = Checkpointer(real_store, got.lease, revision=1, flush_tokens=32, flush_ms=50)
    flusher.close()
    with pytest.raises(RuntimeError, match="idle flusher is closed"):
        flusher.watch(ck, lambda exc: None)
