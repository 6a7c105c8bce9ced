"""Every write can be sent again: a re-send of a write that was applied (its reply lost)
answers as it did and changes nothing. And a record edited by hand is refused by every
script before its first write, whatever field was broken. Both backends."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from resumeq.core.errors import CorruptRecord
from resumeq.core.models import Acquired
from resumeq.store import Store, keys

SPEC = {"prompt": "p", "provider": "x", "model": "m", "budget_tokens": 500, "hooks": ["h"]}


class Requests:
    """Request ids: a new one per write, or the last one again (a re-send)."""

    def __init__(self) -> None:
        self.n = 0
        self.again = False

    def __call__(self) -> str:
        if not self.again:
            self.n += 1
        return f"request-{self.n}"


@pytest.fixture
def requests(monkeypatch: pytest.MonkeyPatch) -> Requests:
    ids = Requests()
    monkeypatch.setattr("resumeq.store.transport.request_id", ids)
    return ids


def snapshot(store: Store) -> dict[bytes, Any]:
    """Every key and its content (stream entry ids included)."""
    out: dict[bytes, Any] = {}
    for key in sorted(store.redis.scan_iter("*")):
        kind = store.redis.type(key)
        if kind == b"hash":
            out[key] = store.redis.hgetall(key)
        elif kind == b"string":
            out[key] = store.redis.get(key)
        elif kind == b"list":
            out[key] = store.redis.lrange(key, 0, -1)
        elif kind == b"zset":
            out[key] = store.redis.zrange(key, 0, -1)
        elif kind == b"stream":
            out[key] = store.redis.xrange(key)
        else:
            out[key] = kind
    return out


def twice(requests: Requests, store: Store, write: Callable[[], Any]) -> None:
    """Send ``write``, then again with the same request id: same answer, no change."""
    first = write()
    before = snapshot(store)
    requests.again = True
    try:
        assert write() == first
    finally:
        requests.again = False
    after = snapshot(store)
    # A replayed acquire reports the same lease; nothing else may move.
    assert after == before


def started(store: Store) -> Acquired:
    job_id = store.create(SPEC).id
    return store.acquire(job_id, worker="w1", ttl_ms=60_000)


def test_create(store: Store, requests: Requests) -> None:
    twice(requests, store, lambda: store.create(SPEC, job_id="job-1"))


def test_acquire(store: Store, requests: Requests) -> None:
    job_id = store.create(SPEC).id
    twice(requests, store, lambda: store.acquire(job_id, worker="w1", ttl_ms=60_000).lease.token)


def test_flush(store: Store, requests: Requests) -> None:
    got = started(store)
    twice(
        requests,
        store,
        lambda: store.flush(got.lease, expected_revision=got.record.revision, delta="x", tokens=1),
    )
    assert store.text(got.lease.job_id) == "x"


@pytest.mark.parametrize("state", ["done", "failed"])
def test_finish(store: Store, requests: Requests, state: Any) -> None:
    got = started(store)
    twice(
        requests, store, lambda: store.finish(got.lease, state=state, ledger={"a": 1}, hooks=("h",))
    )
    assert len(store.ledger(got.lease.job_id)) == 1


@pytest.mark.parametrize("to", ["queued", "abandoned", "spilled"])
def test_release(store: Store, requests: Requests, to: Any) -> None:
    got = started(store)
    twice(requests, store, lambda: store.release(got.lease, to=to, reason="cut", ledger={"a": 1}))
    assert len(store.ledger(got.lease.job_id)) == 1


def test_cancel(store: Store, requests: Requests) -> None:
    job_id = store.create(SPEC).id
    twice(requests, store, lambda: store.cancel(job_id))


def test_requeue_and_drop(store: Store, requests: Requests) -> None:
    for op in ("requeue", "drop"):
        got = started(store)
        store.release(got.lease, to="spilled", reason="floor")
        job_id = got.lease.job_id
        twice(requests, store, lambda: getattr(store, op)(job_id))  # noqa: B023


def test_reap(store: Store, requests: Requests) -> None:
    job_id = store.create(SPEC).id
    store.acquire(job_id, worker="w1", ttl_ms=100)
    time.sleep(0.15)
    twice(
        requests,
        store,
        lambda: store.reap(job_id, janitor="j1", ttl_ms=60_000).acquired.lease.token,  # type: ignore[union-attr]
    )


# -- a record edited by hand is refused before anything is written -------------------------

#: The spec is read where an attempt starts (acquire, reap): tested on its own below.
CHECKED = [
    "state",
    "counts_exact",
    "revision",
    "attempt",
    "spent_output_tokens",
    "spill_count",
    "budget_tokens",
    "id",
    "queue",
    "prompt_hash",
]


#: A value no script may take for the field (anything else is "garbled").
GARBAGE = {"id": "x}y", "queue": "no|pipes", "spec": "{garbled", "counts_exact": "2"}


def writes(store: Store, job_id: str, got: Acquired | None) -> Iterator[Callable[[], Any]]:
    """Each fenced write a script can be asked to do on the job."""
    if got is None:
        yield lambda: store.acquire(job_id, worker="w2", ttl_ms=60_000)
        yield lambda: store.cancel(job_id)
        return
    rev = got.record.revision
    yield lambda: store.flush(got.lease, expected_revision=rev, delta="x", tokens=1)
    yield lambda: store.finish(got.lease, state="done")
    yield lambda: store.release(got.lease, to="queued", reason="cut")
    yield lambda: store.renew(got.lease)


@pytest.mark.parametrize("field", CHECKED)
@pytest.mark.parametrize("how", ["deleted", "garbled"])
@pytest.mark.parametrize("running", [False, True], ids=["queued", "running"])
def test_every_field_a_script_reads_is_checked_first(
    store: Store, field: str, how: str, running: bool
) -> None:
    got = started(store) if running else None
    job_id = got.lease.job_id if got else store.create(SPEC).id
    if how == "deleted":
        store.redis.hdel(keys.job(job_id), field)
    else:
        store.redis.hset(keys.job(job_id), field, GARBAGE.get(field, "garbled"))
    before = snapshot(store)
    for write in writes(store, job_id, got):
        with pytest.raises(CorruptRecord, match=field):
            write()
        assert snapshot(store) == before  # nothing written, not even a lease


def test_a_garbled_spec_is_refused_where_an_attempt_starts(store: Store) -> None:
    queued = store.create(SPEC).id
    dying = store.create(SPEC).id
    store.acquire(dying, worker="w1", ttl_ms=100)
    for job_id in (queued, dying):
        store.redis.hset(keys.job(job_id), "spec", "{garbled")
    time.sleep(0.15)
    before = snapshot(store)
    with pytest.raises(CorruptRecord, match="spec"):
        store.acquire(queued, worker="w2", ttl_ms=60_000)
    with pytest.raises(CorruptRecord, match="spec"):
        store.reap(dying, janitor="j1", ttl_ms=60_000)
    assert snapshot(store) == before
