"""The checkpointer and the heartbeat against a real redis-server."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from resumeq.core.errors import LeaseLost, RedisUnavailable
from resumeq.core.models import Acquired, FlushResult, Lease
from resumeq.store import Store, keys
from resumeq.worker.checkpoint import Checkpointer

SPEC = {"prompt": "p", "provider": "local", "model": "m", "budget_tokens": 1000}


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class FlakyStore(Store):
    """Fails the next flushes: before the write (``down``) or after it (``lose_reply``)."""

    down = 0
    lose_reply = 0

    def flush(self, lease: Lease, **kwargs: Any) -> FlushResult:
        if self.down:
            self.down -= 1
            raise RedisUnavailable("flush: Redis unreachable: test")
        result = super().flush(lease, **kwargs)
        if self.lose_reply:
            self.lose_reply -= 1
            raise RedisUnavailable("flush: connection dropped before the reply")
        return result


def started(store: Store, ttl_ms: int = 5000) -> Acquired:
    return store.acquire(store.create(SPEC).id, worker="w1", ttl_ms=ttl_ms)


def test_flushes_every_n_tokens(real_store: Store) -> None:
    got = started(real_store)
    clock = Clock()
    ck = Checkpointer(real_store, got.lease, revision=1, flush_tokens=4, flush_ms=250, clock=clock)
    for i in range(10):
        ck.add(f"t{i} ", 1, exact=True)
    assert ck.flushes == 2 and ck.flushed_tokens == 8 and ck.pending_tokens == 2
    assert real_store.text(got.lease.job_id) == "".join(f"t{i} " for i in range(8))


def test_flushes_after_flush_ms_whichever_first(real_store: Store) -> None:
    got = started(real_store)
    clock = Clock()
    ck = Checkpointer(
        real_store, got.lease, revision=1, flush_tokens=100, flush_ms=250, clock=clock
    )
    ck.add("a", 1, exact=False)
    assert ck.flushes == 0
    clock.t = 0.3
    ck.add("b", 1, exact=False)
    assert ck.flushes == 1 and real_store.text(got.lease.job_id) == "ab"
    assert not real_store.get(got.lease.job_id).counts_exact


def test_settling_raises_the_lower_bound_to_the_total(real_store: Store) -> None:
    got = started(real_store)
    ck = Checkpointer(real_store, got.lease, revision=1, flush_tokens=2, flush_ms=250)
    for piece in ("one ", "two ", "three "):
        ck.add(piece, 1, exact=False)
    assert not real_store.get(got.lease.job_id).counts_exact  # flushed, counted by chunk
    ck.settle(5, exact=True)
    record = real_store.get(got.lease.job_id)
    assert record.spent_output_tokens == 5 and record.counts_exact
    assert real_store.text(record.id) == "one two three "


def test_settling_on_the_count_already_flushed_relabels_it(real_store: Store) -> None:
    got = started(real_store)
    ck = Checkpointer(real_store, got.lease, revision=1, flush_tokens=1, flush_ms=250)
    ck.add("one", 1, exact=False)
    assert ck.flushes == 1 and not real_store.get(got.lease.job_id).counts_exact
    ck.settle(1, exact=True)
    record = real_store.get(got.lease.job_id)
    assert record.spent_output_tokens == 1 and record.counts_exact and record.revision == 3


def test_the_cursor_never_goes_down(real_store: Store) -> None:
    got = started(real_store)
    ck = Checkpointer(real_store, got.lease, revision=1, flush_tokens=1, flush_ms=250)
    ck.add("one two", 2, exact=False)
    with pytest.raises(ValueError, match="below"):
        ck.settle(1, exact=True)
    with pytest.raises(ValueError, match="never lowers"):
        real_store.flush(got.lease, expected_revision=2, delta="", tokens=-1)
    # The script refuses it too, whoever calls it, and writes nothing.
    job = got.record.id
    job_keys = [keys.job(job), keys.text(job), keys.lease(job), keys.events(job), keys.LEASES]
    args = [got.lease.token, 2, "x", -1, "1", 0]
    status, *_ = real_store.transport.run("flush", job_keys, args, job)
    assert status == "bad_argument"
    record = real_store.get(job)
    assert record.spent_output_tokens == 2 and record.revision == 2
    assert real_store.text(job) == "one two"


def test_redis_down_keeps_the_delta_then_writes_it(redis_client: Any) -> None:
    store = FlakyStore(redis_client)
    got = started(store)
    clock = Clock()
    ck = Checkpointer(store, got.lease, revision=1, flush_tokens=2, flush_ms=250, clock=clock)
    store.down = 2
    ck.add("a", 1, exact=True)
    ck.add("b", 1, exact=True)  # due, but Redis is down: kept
    ck.add("c", 1, exact=True)  # still down: kept
    assert ck.flushes == 0 and ck.pending_tokens == 3
    ck.add("d", 1, exact=True)
    assert (
        ck.flushes == 2 and store.text(got.lease.job_id) == "abcd"
    )  # the kept batch, then the rest
    assert store.get(got.lease.job_id).spent_output_tokens == 4


def test_redis_down_past_the_lease_stops_the_attempt(redis_client: Any) -> None:
    store = FlakyStore(redis_client)
    got = started(store, ttl_ms=1000)
    clock = Clock()
    ck = Checkpointer(store, got.lease, revision=1, flush_tokens=1, flush_ms=250, clock=clock)
    store.down = 100
    ck.add("a", 1, exact=True)
    clock.t = 1.5
    with pytest.raises(LeaseLost, match="while Redis was unreachable"):
        ck.add("b", 1, exact=True)


def test_a_renewed_lease_is_not_taken_for_lapsed_after_a_long_pause(redis_client: Any) -> None:
    """The provider paused longer than the TTL with nothing to flush; the lease keeper
    renewed the lease meanwhile. A Redis blip at the next delta keeps the delta: the lease
    is fresh, and the attempt goes on (it used to stop at once, the flush being the only
    extension the checkpointer knew of)."""
    store = FlakyStore(redis_client)
    got = started(store, ttl_ms=1000)
    clock = Clock()
    ck = Checkpointer(store, got.lease, revision=1, flush_tokens=1, flush_ms=250, clock=clock)
    renewed = [0.0]
    ck.renewed = lambda: renewed[0]
    ck.add("before the pause ", 1, exact=True)
    clock.t = renewed[0] = 5.0  # five TTLs later, renewed all along
    store.down = 1
    ck.add("after it", 1, exact=True)  # kept, not LeaseLost
    assert ck.pending_tokens == 1
    clock.t = 5.1
    assert ck.flush() and store.text(got.lease.job_id) == "before the pause after it"
    # Without renewals, the same blip past the TTL stops the attempt.
    clock.t = 7.0
    store.down = 1
    with pytest.raises(LeaseLost, match="while Redis was unreachable"):
        ck.add("too late", 1, exact=True)


def test_a_lost_reply_is_not_written_twice(redis_client: Any) -> None:
    store = FlakyStore(redis_client)
    got = started(store)
    ck = Checkpointer(store, got.lease, revision=1, flush_tokens=1, flush_ms=250)
    store.lose_reply = 1
    ck.add("once", 1, exact=True)  # applied, but the reply was lost
    assert ck.flushes == 0
    ck.add(" more", 1, exact=True)  # the retry sees revision + 1 and our lease: applied
    assert store.text(got.lease.job_id) == "once more"
    assert store.get(got.lease.job_id).spent_output_tokens == 2


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    steps=st.lists(
        st.tuples(st.text(max_size=6), st.integers(0, 3), st.sampled_from(["ok", "down", "lose"])),
        max_size=20,
    ),
    extra=st.none() | st.integers(0, 80),
)
def test_faults_never_lose_or_double_a_delta(
    redis_client: Any, steps: list[tuple[str, int, str]], extra: int | None
) -> None:
    store = FlakyStore(redis_client)
    got = started(store)
    ck = Checkpointer(store, got.lease, revision=1, flush_tokens=3, flush_ms=10_000)
    for text, tokens, fault in steps:
        store.down = int(fault == "down")
        store.lose_reply = int(fault == "lose")
        ck.add(text, tokens, exact=False)
    store.down = store.lose_reply = 0
    counted = sum(n for _, n, _ in steps)
    want = counted + (extra or 0)
    assert ck.settle(want, exact=True) if extra is not None else ck.flush()
    record = store.get(got.lease.job_id)
    assert store.text(record.id) == "".join(t for t, _, _ in steps)
    assert record.spent_output_tokens == ck.flushed_tokens == want


def test_a_token_count_flush_waits_for_the_minimum_interval(real_store: Store) -> None:
    got = started(real_store)
    clock = Clock()
    ck = Checkpointer(
        real_store,
        got.lease,
        revision=1,
        flush_tokens=2,
        flush_ms=250,
        flush_min_ms=20,
        clock=clock,
    )
    for _ in range(10):
        ck.add("x", 1, exact=True)  # far past 2 tokens, but no time has passed
    assert ck.flushes == 0
    clock.t = 0.021
    ck.add("y", 1, exact=True)
    assert ck.flushes == 1 and real_store.text(got.lease.job_id) == "x" * 10 + "y"


def test_a_continued_call_takes_the_text_into_its_arguments(real_store: Store) -> None:
    got = started(real_store)
    job_id = got.lease.job_id
    ck = Checkpointer(real_store, got.lease, revision=1, flush_tokens=2, flush_ms=250)
    ck.add("Let me look.", 3, exact=True)
    ck.tool(0, "call_1", "get_weather", '{"city":"Ly', 4, exact=True)
    assert ck.flush()
    cut = real_store.get(job_id).calls
    ck.keep_calls(cut, cut)
    ck.continue_call()
    assert ck.continued == cut[0]
    ck.add('on","days"', 3, exact=True)
    ck.add(":2}", 2, exact=True)
    assert ck.flush()
    record = real_store.get(job_id)
    # The text is untouched; the arguments grew, still not shown.
    assert real_store.text(job_id) == "Let me look."
    (call,) = record.calls
    assert (call.arguments, call.tokens, call.complete) == ('{"city":"Lyon","days":2}', 9, False)
    assert record.spent_output_tokens == 12
    ck.end_continued()
    assert ck.continued is None
    assert ck.flush()
    (whole,) = real_store.get(job_id).calls
    assert whole.complete and whole.id == "call_1"
    ck.add("more", 1, exact=True)  # after the end, text is text again
    assert ck.flush() and real_store.text(job_id) == "Let me look.more"
