"""The store's contract, run on a real redis-server and again on fakeredis."""

from __future__ import annotations

import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from resumeq.core.errors import (
    CorruptRecord,
    IdempotencyConflict,
    InvalidTransition,
    JobCancelled,
    JobNotFound,
    LeaseLost,
    SpillExhausted,
    StaleRevision,
)
from resumeq.core.models import Acquired, JobState
from resumeq.core.settings import StoreSettings
from resumeq.store import Store, keys


def spec(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "prompt": "Write a haiku about queues.",
        "provider": "local",
        "model": "test-model",
        "budget_tokens": 200,
    }
    base.update(over)
    return base


def snapshot(store: Store, job_id: str) -> tuple[Any, ...]:
    """Everything stored for a job, for before/after comparisons."""
    r = store.redis
    return (
        r.hgetall(keys.job(job_id)),
        r.get(keys.text(job_id)),
        r.xrange(keys.events(job_id)),
        r.lrange(keys.ledger(job_id), 0, -1),
    )


def started(store: Store, worker: str = "w1", ttl_ms: int = 5000, **over: Any) -> Acquired:
    job_id = store.create(spec(**over)).id
    return store.acquire(job_id, worker=worker, ttl_ms=ttl_ms)


# -- create ------------------------------------------------------------------------------


def test_create_writes_the_record_before_any_call(store: Store) -> None:
    job_id = store.create(spec()).id
    rec = store.get(job_id)
    assert rec.state is JobState.QUEUED
    assert (rec.spent_output_tokens, rec.revision, rec.attempt, rec.spill_count) == (0, 0, 0, 0)
    assert rec.budget_tokens == 200 and rec.floor_tokens == 32
    assert rec.prompt_hash == rec.spec.prompt_hash() and len(rec.prompt_hash) == 64
    assert store.text(job_id) == ""
    assert store.redis.zscore(keys.QUEUED, job_id) is not None


def test_idempotent_create_returns_the_same_id(store: Store) -> None:
    first = store.create(spec(idempotency_key="order-17"))
    again = store.create(spec(idempotency_key="order-17"))
    other = store.create(spec(idempotency_key="order-18"))
    assert first.created and not again.created
    assert again.id == first.id
    assert other.id != first.id and other.created
    assert store.get(first.id).idempotency_key == "order-17"


def test_idempotency_key_with_another_prompt_is_a_conflict(store: Store) -> None:
    first = store.create(spec(idempotency_key="k"))
    with pytest.raises(IdempotencyConflict) as info:
        store.create(spec(idempotency_key="k", prompt="something else"))
    assert info.value.existing_job_id == first.id


def test_create_without_key_makes_distinct_jobs(store: Store) -> None:
    assert store.create(spec()).id != store.create(spec()).id


def test_get_unknown_job(store: Store) -> None:
    with pytest.raises(JobNotFound):
        store.get("nope")


# -- acquire -----------------------------------------------------------------------------


def test_acquire_takes_the_lease(store: Store) -> None:
    job_id = store.create(spec()).id
    got = store.acquire(job_id, worker="w1", ttl_ms=5000)
    assert got.record.state is JobState.RUNNING
    assert got.record.attempt == 1 and got.record.revision == 1
    assert got.lease.token.startswith("1:w1:")
    assert store.redis.get(keys.lease(job_id)) == got.lease.token.encode()
    assert 0 < store.redis.pttl(keys.lease(job_id)) <= 5000
    assert store.redis.zscore(keys.LEASES, job_id) == got.lease.deadline_ms
    assert store.redis.zscore(keys.QUEUED, job_id) is None


def test_second_acquire_is_refused(store: Store) -> None:
    got = started(store)
    with pytest.raises(InvalidTransition) as info:
        store.acquire(got.lease.job_id, worker="w2", ttl_ms=5000)
    assert info.value.state == "running"


def test_acquire_with_another_prompt_hash_is_a_conflict(store: Store) -> None:
    job_id = store.create(spec()).id
    before = snapshot(store, job_id)
    with pytest.raises(InvalidTransition, match="never spliced") as info:
        store.acquire(job_id, worker="w1", ttl_ms=5000, prompt_hash="0" * 64)
    assert info.value.state == "conflict"
    assert snapshot(store, job_id) == before


def test_acquire_unknown_job(store: Store) -> None:
    with pytest.raises(JobNotFound):
        store.acquire("missing", worker="w1", ttl_ms=1000)


# -- flush -------------------------------------------------------------------------------


def test_flush_appends_and_counts(store: Store) -> None:
    got = started(store)
    r1 = store.flush(got.lease, expected_revision=1, delta="Hello, ", tokens=2)
    r2 = store.flush(got.lease, expected_revision=r1.revision, delta="wörld", tokens=3, exact=False)
    assert (r2.revision, r2.spent_output_tokens) == (3, 5)
    assert r2.prefix_bytes == len("Hello, wörld".encode())
    rec = store.get(got.lease.job_id)
    assert store.text(rec.id) == "Hello, wörld"
    assert rec.spent_output_tokens == 5 and not rec.counts_exact
    entries = store.redis.xrange(keys.events(rec.id))
    deltas = [e[1][b"delta"].decode() for e in entries if b"delta" in e[1]]
    assert deltas == ["Hello, ", "wörld"]
    assert [int(e[1][b"rev"]) for e in entries] == [1, 2, 3]


def test_flush_with_stale_revision_is_refused_and_changes_nothing(store: Store) -> None:
    got = started(store)
    store.flush(got.lease, expected_revision=1, delta="abc", tokens=1)
    before = snapshot(store, got.lease.job_id)
    with pytest.raises(StaleRevision) as info:
        store.flush(got.lease, expected_revision=1, delta="again", tokens=1)
    assert (info.value.expected, info.value.current) == (1, 2)
    assert snapshot(store, got.lease.job_id) == before


def test_flush_extends_the_lease(store: Store) -> None:
    got = started(store, ttl_ms=2000)
    time.sleep(0.8)
    store.flush(got.lease, expected_revision=1, delta="x", tokens=1)
    assert store.redis.pttl(keys.lease(got.lease.job_id)) > 1300


# -- zombie fencing ----------------------------------------------------------------------


def test_zombie_flush_and_renew_are_refused(store: Store) -> None:
    """A's lease expires; a janitor reaps, B resumes; A's late writes change nothing."""
    job_id = store.create(spec()).id
    # A lease long enough for A's flush on a loaded machine (100 ms was not, under a full
    # suite on two cores), then waited out.
    a = store.acquire(job_id, worker="A", ttl_ms=1000)
    a_rev = store.flush(a.lease, expected_revision=1, delta="from A. ", tokens=3).revision
    time.sleep(1.1)

    # Lease gone and nobody took over yet: A is already refused.
    with pytest.raises(LeaseLost):
        store.flush(a.lease, expected_revision=a_rev, delta="late", tokens=1)

    reaped = store.reap(job_id, janitor="j1", ttl_ms=5000)
    assert reaped.status == "reaped" and reaped.acquired is not None
    store.release(reaped.acquired.lease, to="queued", reason="resume")
    b = store.acquire(job_id, worker="B", ttl_ms=5000)
    assert b.record.attempt == 2
    b_flush = store.flush(b.lease, expected_revision=b.record.revision, delta="from B", tokens=2)

    before = snapshot(store, job_id)
    with pytest.raises(LeaseLost):
        store.flush(a.lease, expected_revision=b_flush.revision, delta="zombie", tokens=5)
    with pytest.raises(LeaseLost):
        store.renew(a.lease)
    with pytest.raises(LeaseLost):
        store.finish(a.lease, state="done")
    with pytest.raises(LeaseLost):
        store.release(a.lease, to="abandoned", reason="zombie")
    assert snapshot(store, job_id) == before
    rec = store.get(job_id)
    assert store.text(job_id) == "from A. from B"
    assert rec.revision == b_flush.revision and rec.spent_output_tokens == 5
    assert rec.lease_token == b.lease.token


def test_renew_extends_the_lease(store: Store) -> None:
    got = started(store, ttl_ms=300)
    time.sleep(0.2)
    renewed = store.renew(got.lease)
    assert renewed.deadline_ms > got.lease.deadline_ms
    assert store.redis.pttl(keys.lease(got.lease.job_id)) > 200
    assert store.redis.zscore(keys.LEASES, got.lease.job_id) == renewed.deadline_ms


# -- finish, release ---------------------------------------------------------------------


def test_finish_done_retires_the_job(store: Store) -> None:
    got = started(store)
    job_id = got.lease.job_id
    store.flush(got.lease, expected_revision=1, delta="all", tokens=1)
    rev = store.finish(got.lease, state="done", finish_reason="stop", ledger={"kind": "fresh"})
    rec = store.get(job_id)
    assert rec.state is JobState.DONE and rec.revision == rev == 3
    assert rec.finish_reason == "stop" and rec.finished_ms is not None
    assert store.ledger(job_id) == [{"kind": "fresh"}]
    assert store.redis.exists(keys.lease(job_id)) == 0
    assert store.redis.zscore(keys.LEASES, job_id) is None
    retention = store.settings.retention_s
    for key in (keys.job(job_id), keys.text(job_id), keys.events(job_id), keys.ledger(job_id)):
        assert 0 < store.redis.ttl(key) <= retention
    with pytest.raises(LeaseLost):
        store.flush(got.lease, expected_revision=rev, delta="more", tokens=1)


def test_release_to_queued_allows_a_new_attempt(store: Store) -> None:
    got = started(store)
    job_id = got.lease.job_id
    store.flush(got.lease, expected_revision=1, delta="part", tokens=4)
    store.release(got.lease, to="queued", reason="stream cut", ledger={"outcome": "cut"})
    rec = store.get(job_id)
    assert rec.state is JobState.QUEUED and rec.reason == "stream cut"
    assert store.redis.zscore(keys.QUEUED, job_id) is not None
    assert store.redis.ttl(keys.job(job_id)) == -1
    again = store.acquire(job_id, worker="w2", ttl_ms=5000)
    assert again.record.spent_output_tokens == 4 and again.record.attempt == 2


def test_release_abandoned_keeps_the_partial_text(store: Store) -> None:
    got = started(store)
    store.flush(got.lease, expected_revision=1, delta="partial", tokens=7)
    store.release(got.lease, to="abandoned", reason="below floor")
    rec = store.get(got.lease.job_id)
    assert rec.state is JobState.ABANDONED and rec.state.terminal
    assert store.text(rec.id) == "partial"
    assert store.redis.ttl(keys.text(rec.id)) > 0


def test_spill_happens_at_most_once(store: Store) -> None:
    got = started(store)
    job_id = got.lease.job_id
    store.release(got.lease, to="spilled", reason="below floor")
    assert store.get(job_id).spill_count == 1
    assert store.spilled() == [job_id]
    store.requeue(job_id, queue="resumeq-reserved")
    assert store.spilled() == []
    again = store.acquire(job_id, worker="w2", ttl_ms=5000)
    assert again.record.queue == "resumeq-reserved"
    before = snapshot(store, job_id)
    with pytest.raises(SpillExhausted):
        store.release(again.lease, to="spilled", reason="cut again")
    assert snapshot(store, job_id) == before
    store.finish(again.lease, state="failed", error="cut again after a spill")
    assert store.get(job_id).state is JobState.FAILED


def test_requeue_with_another_provider_repins_the_hash(store: Store) -> None:
    got = started(store)
    job_id = got.lease.job_id
    old_hash = got.record.prompt_hash
    store.release(got.lease, to="spilled", reason="overloaded")
    store.requeue(job_id, provider="paid-lane")
    rec = store.get(job_id)
    assert rec.spec.provider == "paid-lane" and rec.prompt_hash == rec.spec.prompt_hash()
    assert rec.prompt_hash != old_hash
    store.acquire(job_id, worker="w9", ttl_ms=1000, prompt_hash=rec.prompt_hash)


def test_drop_a_spilled_job(store: Store) -> None:
    got = started(store)
    job_id = got.lease.job_id
    store.flush(got.lease, expected_revision=1, delta="kept", tokens=1)
    store.release(got.lease, to="spilled", reason="x")
    store.drop(job_id)
    rec = store.get(job_id)
    assert rec.state is JobState.DROPPED and store.text(job_id) == "kept"
    with pytest.raises(InvalidTransition):
        store.drop(job_id)
    with pytest.raises(InvalidTransition):
        store.requeue(job_id)


# -- reap --------------------------------------------------------------------------------


def test_reap_leaves_a_live_lease_alone(store: Store) -> None:
    got = started(store, ttl_ms=5000)
    assert store.reap(got.lease.job_id, janitor="j1", ttl_ms=1000).status == "alive"
    assert store.get(got.lease.job_id).state is JobState.RUNNING
    store.flush(got.lease, expected_revision=1, delta="still mine", tokens=2)


def test_expired_leases_and_reap(store: Store) -> None:
    got = started(store, ttl_ms=50)
    job_id = got.lease.job_id
    assert store.expired_leases() == []
    time.sleep(0.1)
    assert store.expired_leases() == [job_id]
    reaped = store.reap(job_id, janitor="j1", ttl_ms=5000)
    assert reaped.status == "reaped" and reaped.acquired is not None
    assert reaped.acquired.record.state is JobState.STALLED
    assert store.expired_leases() == []
    # A second janitor racing the first finds the job already taken over.
    assert store.reap(job_id, janitor="j2", ttl_ms=5000).status == "alive"


def test_reap_cleans_entries_of_ended_jobs(store: Store) -> None:
    got = started(store)
    job_id = got.lease.job_id
    store.finish(got.lease, state="done")
    store.redis.zadd(keys.LEASES, {job_id: 1})
    result = store.reap(job_id, janitor="j1", ttl_ms=1000)
    assert (result.status, result.state) == ("gone", "done")
    assert store.redis.zscore(keys.LEASES, job_id) is None


# -- cancel ------------------------------------------------------------------------------


def test_cancel_running_job_refuses_the_owners_next_flush(store: Store) -> None:
    got = started(store)
    job_id = got.lease.job_id
    store.flush(got.lease, expected_revision=1, delta="so far", tokens=2)
    rev = store.cancel(job_id, reason="user gave up")
    with pytest.raises(JobCancelled):
        store.flush(got.lease, expected_revision=rev, delta="more", tokens=1)
    with pytest.raises(JobCancelled):
        store.renew(got.lease)
    rec = store.get(job_id)
    assert rec.state is JobState.CANCELLED and rec.reason == "user gave up"
    assert store.text(job_id) == "so far"
    assert store.redis.zscore(keys.LEASES, job_id) is None


def test_cancel_queued_and_terminal(store: Store) -> None:
    job_id = store.create(spec()).id
    store.cancel(job_id)
    assert store.redis.zscore(keys.QUEUED, job_id) is None
    with pytest.raises(InvalidTransition):
        store.cancel(job_id)
    with pytest.raises(InvalidTransition):
        store.acquire(job_id, worker="w1", ttl_ms=1000)
    with pytest.raises(JobNotFound):
        store.cancel("missing")


# -- property ----------------------------------------------------------------------------


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(flushes=st.lists(st.tuples(st.text(max_size=40), st.integers(0, 64)), max_size=25))
def test_flushes_compose(store: Store, flushes: list[tuple[str, int]]) -> None:
    """Any sequence of owner flushes: text is the concatenation, spent the sum, and the
    revision went up by exactly one per flush."""
    got = started(store)
    rev = got.record.revision
    for delta, n in flushes:
        rev = store.flush(got.lease, expected_revision=rev, delta=delta, tokens=n).revision
    rec = store.get(got.lease.job_id)
    assert store.text(rec.id) == "".join(d for d, _ in flushes)
    assert rec.spent_output_tokens == sum(n for _, n in flushes)
    assert rec.revision - got.record.revision == len(flushes)
    assert store.redis.xlen(keys.events(rec.id)) == rec.revision


# -- damaged records ---------------------------------------------------------------------


def test_acquire_refuses_a_queued_job_that_still_has_a_lease(store: Store) -> None:
    job_id = store.create(spec()).id
    store.redis.set(keys.lease(job_id), "9:someone:abc", px=5000)
    before = snapshot(store, job_id)
    with pytest.raises(InvalidTransition, match="already has a lease"):
        store.acquire(job_id, worker="w1", ttl_ms=1000)
    assert snapshot(store, job_id) == before


@pytest.mark.parametrize(
    "damage",
    [
        lambda r, k: r.hdel(k, "spec"),
        lambda r, k: r.hset(k, "spec", "{not json"),
        lambda r, k: r.hset(k, "revision", "many"),
        lambda r, k: r.hset(k, "state", "limbo"),
    ],
    ids=["spec-deleted", "spec-garbled", "revision-garbled", "unknown-state"],
)
def test_a_damaged_record_reads_as_corrupt(store: Store, damage: Any) -> None:
    job_id = store.create(spec()).id
    damage(store.redis, keys.job(job_id))
    with pytest.raises(CorruptRecord, match=f"job {job_id}: corrupt record"):
        store.get(job_id)


def test_a_stored_spec_the_model_refuses_is_corrupt_when_used_and_at_acquire(
    store: Store,
) -> None:
    """A record is read without its spec's model (``resumeq status``): a spec that is JSON
    with a provider and a model, but no valid spec, shows as corrupt where it is used, and
    a worker's acquire raises it at once."""
    job_id = store.create(spec()).id
    store.redis.hset(keys.job(job_id), "spec", '{"provider": "p", "model": "m"}')
    record = store.get(job_id)
    assert (record.provider, record.model, record.state) == ("p", "m", JobState.QUEUED)
    with pytest.raises(CorruptRecord, match=f"job {job_id}: corrupt record"):
        record.spec  # noqa: B018
    with pytest.raises(CorruptRecord, match=f"job {job_id}: corrupt record"):
        store.acquire(job_id, worker="w1", ttl_ms=1000)  # the worker fails the job there


@pytest.mark.parametrize(
    ("field", "raw", "message"),
    [
        ("spec", '{"provider": "p"}', "spec: no model"),
        ("attempt", "1.5", "attempt: cannot read"),
        ("queue", "", "queue: missing"),
    ],
)
def test_a_damaged_record_says_which_field(
    store: Store, field: str, raw: str, message: str
) -> None:
    job_id = store.create(spec()).id
    store.redis.hset(keys.job(job_id), field, raw)
    with pytest.raises(CorruptRecord, match=f"job {job_id}: corrupt record: {message}"):
        store.get(job_id)


# -- exact and estimated counts ----------------------------------------------------------


def test_a_lower_bound_then_the_exact_total(store: Store) -> None:
    got = started(store)
    lease = got.lease
    r = store.flush(lease, expected_revision=1, delta="abc", tokens=3, exact=False)
    assert not store.get(lease.job_id).counts_exact
    # The final usage says the attempt produced 5 tokens: the chunks were a lower bound.
    r = store.flush(lease, expected_revision=r.revision, delta="", tokens=2, exact=True)
    rec = store.get(lease.job_id)
    assert rec.counts_exact and rec.spent_output_tokens == 5
    # An exact total equal to the count already there only relabels it.
    store.flush(lease, expected_revision=r.revision, delta="", tokens=0, exact=False)
    assert not store.get(lease.job_id).counts_exact


def test_a_janitor_owning_a_stalled_job_may_raise_its_count(store: Store) -> None:
    got = started(store, ttl_ms=400)  # long enough for the flush on a loaded machine
    store.flush(got.lease, expected_revision=1, delta="abc", tokens=1, exact=False)
    time.sleep(0.5)
    reaped = store.reap(got.lease.job_id, janitor="janitor-1", ttl_ms=5000).acquired
    assert reaped is not None
    store.flush(reaped.lease, expected_revision=reaped.record.revision, delta="", tokens=2)
    assert store.get(got.lease.job_id).spent_output_tokens == 3
    with pytest.raises(LeaseLost):  # the dead worker's token is no longer the lease
        store.flush(got.lease, expected_revision=reaped.record.revision + 1, delta="x", tokens=1)


def test_an_attempt_left_estimated_keeps_the_job_estimated(store: Store) -> None:
    got = started(store)
    store.flush(got.lease, expected_revision=1, delta="abc", tokens=3, exact=False)
    store.release(got.lease, to="queued", reason="cut")
    again = store.acquire(got.lease.job_id, worker="w2", ttl_ms=5000)
    store.flush(again.lease, expected_revision=again.record.revision, delta="d", tokens=1)
    assert not store.get(got.lease.job_id).counts_exact


def test_no_write_lowers_the_cursor(store: Store) -> None:
    got = started(store)
    store.flush(got.lease, expected_revision=1, delta="ab", tokens=2, exact=False)
    before = snapshot(store, got.lease.job_id)
    for exact in (True, False):
        with pytest.raises(ValueError, match="never lowers"):
            store.flush(got.lease, expected_revision=2, delta="", tokens=-1, exact=exact)
    assert snapshot(store, got.lease.job_id) == before


def test_a_garbled_counter_refuses_writes_before_any_change(store: Store) -> None:
    got = started(store)
    store.redis.hset(keys.job(got.lease.job_id), "spent_output_tokens", "lots")
    before = snapshot(store, got.lease.job_id)
    with pytest.raises(CorruptRecord, match="spent_output_tokens"):
        store.flush(got.lease, expected_revision=1, delta="x", tokens=1)
    with pytest.raises(CorruptRecord):
        store.cancel(got.lease.job_id)
    assert snapshot(store, got.lease.job_id) == before
    store.fail_unreadable(got.lease.job_id, reason="corrupt job record: test")
    raw = store.redis.hgetall(keys.job(got.lease.job_id))
    assert raw[b"state"] == b"failed" and raw[b"revision"] == b"2"


def totals_today() -> bytes:
    return keys.totals_day(time.strftime("%Y-%m-%d", time.gmtime())).encode()


def test_purge_removes_everything_a_job_owns(store: Store) -> None:
    got = started(store, idempotency_key="to-forget")
    job_id = got.lease.job_id
    store.flush(got.lease, expected_revision=1, delta="secret text", tokens=2)
    with pytest.raises(InvalidTransition):
        store.purge(job_id)  # a worker holds it
    store.finish(got.lease, state="done", ledger={"kind": "fresh"})
    other = store.create(spec(idempotency_key="kept")).id
    assert store.purge(job_id) == 4  # job, text, events, ledger
    assert sorted(store.redis.scan_iter("*")) == sorted(
        [
            keys.job(other).encode(),
            keys.QUEUED.encode(),
            keys.idempotency("kept").encode(),
            keys.outbox(other).encode(),  # its first attempt, to be enqueued
            keys.OUTBOX.encode(),
            keys.TOTALS.encode(),  # what was ever counted stays counted
            totals_today(),
            keys.JOBS.encode(),  # the other job's entry
        ]
    )
    assert store.redis.zrange(keys.JOBS, 0, -1) == [other.encode()]
    with pytest.raises(JobNotFound):
        store.purge(job_id)
    # The idempotency key is free again: a new job, not the purged one.
    assert store.create(spec(idempotency_key="to-forget")).id != job_id


def test_terminal_jobs_expire_after_the_retention(store: Store) -> None:
    short = Store(store.redis, settings=StoreSettings(retention_s=1))
    got = started(short, idempotency_key="short-lived")
    short.flush(got.lease, expected_revision=1, delta="gone soon", tokens=1)
    short.finish(got.lease, state="done", ledger={"kind": "fresh"})
    running = started(short)  # not terminal: never expires
    time.sleep(1.3)
    assert sorted(short.redis.scan_iter("*")) == sorted(
        [
            keys.job(running.lease.job_id).encode(),
            keys.lease(running.lease.job_id).encode(),
            keys.events(running.lease.job_id).encode(),
            keys.LEASES.encode(),
            keys.RUNNING.encode(),
            keys.ENDED.encode(),  # until the janitor trims the ended job's events
            keys.TOTALS.encode(),
            totals_today(),
            # the expired job's entry goes when a listing or the janitor meets it
            keys.JOBS.encode(),
        ]
    )
    assert short.forget_expired(100) == 1
    assert short.redis.zrange(keys.JOBS, 0, -1) == [running.lease.job_id.encode()]
