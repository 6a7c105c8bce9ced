"""``[store] durability`` (SPEC §17): with ``"replica"`` a checkpoint counts once a replica
acknowledged it (``WAIT 1``) and followers are shown only text a replica holds; a replica
that does not answer is an outage (the checkpoint is kept and sent again, the stream stops
at the lease), never a silent success. With either setting, checkpoints a failover lost
are written again by the attempt that made them."""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from resumeq.core.errors import ConfigError, LeaseLost, ReplicaLagging, StaleRevision
from resumeq.core.models import Acquired
from resumeq.core.settings import StoreSettings, load_settings
from resumeq.producer.client import Client, EventCursor
from resumeq.store import Store, decode, keys
from resumeq.testing import RedisServer
from resumeq.testing.sentinel import FAST_SYNC, wait_replicated
from resumeq.worker.checkpoint import Checkpointer

pytestmark = pytest.mark.timeout(60)

SPEC = {"prompt": "p", "provider": "local", "model": "m", "budget_tokens": 1000}
REPLICA = StoreSettings(durability="replica", replica_timeout_ms=200)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def pair() -> Iterator[tuple[RedisServer, RedisServer]]:
    """A primary and its replica."""
    with RedisServer(args=FAST_SYNC) as primary:
        replica = RedisServer(args=("--replicaof", "127.0.0.1", str(primary.port)))
        with replica:
            wait_replicated(replica.port)
            yield primary, replica


@pytest.fixture
def replicated(pair: tuple[RedisServer, RedisServer]) -> Iterator[Store]:
    client = redis.Redis(port=pair[0].port, socket_timeout=5)
    yield Store(client, settings=REPLICA)
    client.close()


def started(store: Store, ttl_ms: int = 5000) -> Acquired:
    return store.acquire(store.create(SPEC).id, worker="w1", ttl_ms=ttl_ms)


def events(store: Store, job_id: str) -> list[dict[str, str]]:
    return [
        {decode(k): decode(v) for k, v in raw.items()}
        for _, raw in store.redis.xrange(keys.events(job_id))
    ]


@contextlib.contextmanager
def frozen(server: RedisServer) -> Iterator[None]:
    assert server.process is not None
    server.process.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        server.process.send_signal(signal.SIGCONT)


def test_a_checkpoint_is_held_until_a_replica_has_it_then_marked(replicated: Store) -> None:
    got = started(replicated)
    ck = Checkpointer(replicated, got.lease, revision=1, flush_tokens=2, flush_ms=10_000)
    ck.add("Hello, ", 1, exact=True)
    ck.add("world.", 1, exact=True)
    assert ck.flushes == 1
    stream = events(replicated, got.lease.job_id)
    assert stream[-2] == {"rev": "2", "delta": "Hello, world.", "spent": "2", "exact": "1",
                          "held": "1"}  # fmt: skip
    assert stream[-1] == {"rev": "2", "durable": "1"}
    follower = Client(replicated.redis, settings=REPLICA)
    replicated.finish(got.lease, state="done", finish_reason="stop")
    assert [(d.revision, d.text) for d in follower.follow(got.lease.job_id, timeout=5)] == [
        (2, "Hello, world.")
    ]
    assert events(replicated, got.lease.job_id)[-1] == {"rev": "3", "durable": "1"}


def test_a_silent_replica_keeps_the_delta_and_stops_the_stream_at_the_lease(
    replicated: Store, pair: tuple[RedisServer, RedisServer]
) -> None:
    got = started(replicated, ttl_ms=1000)
    clock = Clock()
    ck = Checkpointer(
        replicated, got.lease, revision=1, flush_tokens=1, flush_ms=10_000, clock=clock
    )
    job_id = got.lease.job_id
    with frozen(pair[1]):
        began = time.monotonic()
        ck.add("Kept ", 1, exact=True)  # the primary applies it; no replica answers
        assert time.monotonic() - began >= 0.2
        assert ck.flushes == 0 and ck.has_pending_text
        # A follower is shown nothing a replica does not hold.
        cursor = EventCursor(job_id, after=0, deadline=None, stop_at_spill=False)
        cursor.start(replicated.get(job_id))
        reply: Any = replicated.redis.xread(cursor.streams, count=100)
        assert [f.get("state") for _, f in cursor.take(reply)] == ["running"]  # no delta
    # Once the replica answers, the re-sent flush (same request id) answers as it did:
    # written once, then marked.
    assert ck.flush() is True
    assert ck.flushes == 1 and not ck.has_pending_text
    assert replicated.text(job_id) == "Kept "
    assert [e.get("delta") for e in events(replicated, job_id) if "delta" in e] == ["Kept "]
    assert events(replicated, job_id)[-1] == {"rev": "2", "durable": "1"}
    with frozen(pair[1]):
        clock.t = 1.5  # past the lease: the stream stops rather than spend what cannot be kept
        with pytest.raises(LeaseLost, match="expired while Redis was unreachable"):
            ck.add("more ", 1, exact=True)


def test_without_a_replica_every_write_says_so(redis_server: RedisServer) -> None:
    client = redis.Redis(port=redis_server.port, socket_timeout=5)
    try:
        store = Store(client, settings=REPLICA)
        got = started(store)
        with pytest.raises(ReplicaLagging, match="no replica acknowledged the write within 200 ms"):
            store.flush(got.lease, expected_revision=1, delta="x", tokens=1)
        # The flush was applied on the primary, not counted durable: no marker, held.
        stream = events(store, got.lease.job_id)
        assert stream[-1]["held"] == "1" and not any("durable" in e for e in stream)
    finally:
        client.close()


def test_the_cursor_shows_held_events_in_order_once_marked() -> None:
    cursor = EventCursor("j", after=0, deadline=None, stop_at_spill=True)

    def reply(*entries: dict[str, str]) -> Any:
        return [[b"s", [(f"{i}-0".encode(), e) for i, e in enumerate(entries, 1)]]]

    got = cursor.take(
        reply(
            {"rev": "1", "state": "running"},
            {"rev": "2", "delta": "a", "held": "1"},
            {"rev": "3", "delta": "b", "held": "1"},
            {"rev": "2", "durable": "1"},
            {"rev": "4", "state": "done"},  # behind a held event: held too
        )
    )
    assert [(r, f.get("delta") or f.get("state")) for r, f in got] == [(1, "running"), (2, "a")]
    assert not cursor.ended
    got = cursor.take([[b"s", [(b"9-0", {"rev": "4", "durable": "1"})]]])
    assert [(r, f.get("delta") or f.get("state")) for r, f in got] == [(3, "b"), (4, "done")]
    assert cursor.ended


def test_checkpoints_a_failover_lost_are_written_again(real_store: Store) -> None:
    """What a failover leaves (the replica had the job as of an older checkpoint of the
    same attempt), made with DUMP and RESTORE: the attempt writes the lost text again."""
    got = started(real_store)
    job_id = got.lease.job_id
    ck = Checkpointer(real_store, got.lease, revision=1, flush_tokens=2, flush_ms=10_000)
    names = [keys.job(job_id), keys.text(job_id), keys.events(job_id), keys.lease(job_id)]
    ck.add("One ", 1, exact=True)
    ck.add("two ", 1, exact=True)
    saved = {name: real_store.redis.dump(name) for name in names}
    for word in ("three ", "four ", "five ", "six "):
        ck.add(word, 1, exact=True)
    assert ck.flushes == 3
    for name, value in saved.items():  # the failover
        real_store.redis.restore(name, 0, value, replace=True)
    ck.add("seven ", 1, exact=True)
    ck.add("eight.", 1, exact=True)
    assert real_store.text(job_id) == "One two three four five six seven eight."
    record = real_store.get(job_id)
    assert record.spent_output_tokens == 8 and record.revision == 3
    assert ck.flushed_tokens == 8 and ck.flushes == 2


def test_another_writer_is_still_a_refusal(real_store: Store) -> None:
    got = started(real_store)
    ck = Checkpointer(real_store, got.lease, revision=1, flush_tokens=1, flush_ms=10_000)
    ck.add("One ", 1, exact=True)
    # A write the checkpointer did not make moved the job on.
    real_store.flush(got.lease, expected_revision=2, delta="other ", tokens=1)
    with pytest.raises(StaleRevision):
        ck.add("two ", 1, exact=True)


def test_durability_must_be_primary_or_replica(tmp_path: Any) -> None:
    config = tmp_path / "resumeq.toml"
    config.write_text('[store]\ndurability = "sometimes"\n')
    with pytest.raises(ConfigError, match=r"store\.durability"):
        load_settings(config_path=config)
    config.write_text("[store]\nreplica_timeout_ms = 0\n")
    with pytest.raises(ConfigError, match=r"store\.replica_timeout_ms"):
        load_settings(config_path=config)


def test_a_reader_past_where_a_failover_took_the_job_ends_with_it() -> None:
    """``durability = "primary"``: a follower that read on from revision 12 after a failover
    that took the job back to 9 is not left waiting for a revision that never comes."""
    cursor = EventCursor("j", after=12, deadline=None, stop_at_spill=True)
    cursor.idle([b"j", None, b"running", b"9"])
    assert not cursor.ended  # the job may still pass revision 12
    cursor.idle([b"j", None, b"done", b"11"])
    assert cursor.ended


def test_the_janitor_marks_an_ended_job_whose_end_no_replica_confirmed(
    replicated: Store, pair: tuple[RedisServer, RedisServer]
) -> None:
    """A delta no replica confirmed in time (so never marked), then the job's end written
    without a wait (a producer with other settings, or an ending write retried out): its
    followers would hold both for good. The janitor's sweep marks them."""
    got = started(replicated)
    job_id = got.lease.job_id
    with frozen(pair[1]), pytest.raises(ReplicaLagging):
        replicated.flush(got.lease, expected_revision=1, delta="Held text.", tokens=3)
    unwaited = Store(replicated.redis)  # durability = "primary"
    unwaited.finish(got.lease, state="done", finish_reason="stop")
    cursor = EventCursor(job_id, after=0, deadline=None, stop_at_spill=True)
    cursor.start(replicated.get(job_id))
    reply: Any = replicated.redis.xread(cursor.streams, count=100)
    assert [f.get("state") for _, f in cursor.take(reply)] == ["running"]  # the rest held
    assert not cursor.ended
    assert replicated.mark_ended() == 1
    assert replicated.mark_ended() == 0  # marked once
    reply = replicated.redis.xread(cursor.streams, count=100)
    got_events = cursor.take(reply)
    assert [(r, f.get("delta") or f.get("state")) for r, f in got_events] == [
        (2, "Held text."),
        (3, "done"),
    ]
    assert cursor.ended
