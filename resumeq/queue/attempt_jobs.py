"""An attempt's RQ job, written without loading RQ.

Each attempt of a job is its own RQ job, ``<job id>-a<attempt>``, written once (a second
write of the same attempt is refused) onto its queue, or into resumeq's due-time index
(:mod:`resumeq.queue.due`) until it falls due. The job's record is RQ 3's: the hash
``Queue.create_job`` and RQ's enqueue make, calling ``resumeq.worker.run_attempt`` with the
job id, serialized as JSON (never pickle), with no RQ timeout (a long stream is never cut
by RQ; resumeq's lease is what detects a dead worker). It is written here field by field
because loading RQ costs a command line more than the rest of ``resumeq enqueue``;
tests/test_attempt_jobs.py holds the record to the one RQ makes, and RQ's workers run it.

RQ's keys are RQ's (its ``RQ_KEY_PREFIX``, as RQ reads it), spelled here as RQ spells them.
"""

from __future__ import annotations

import json
import os
import threading
import zlib
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from typing import Any, cast

import redis
from redis.client import Pipeline
from redis.commands.core import Script

from resumeq.store import SPILL_QUEUE, check_queue, decode, keys

#: The RQ function that runs one attempt.
ATTEMPT_FUNC = "resumeq.worker.run_attempt"
#: RQ keeps a finished attempt's record this long (seconds), for ``rq info`` and dashboards.
RESULT_TTL_S = 3600
FAILURE_TTL_S = 7 * 24 * 3600

#: RQ's key prefix (``rq.defaults.RQ_KEY_PREFIX``), and its keys.
RQ_KEY_PREFIX = os.environ.get("RQ_KEY_PREFIX", "rq")
RQ_QUEUES = f"{RQ_KEY_PREFIX}:queues"
#: RQ's timestamps (``rq.utils.utcformat``).
_RQ_TIME = "%Y-%m-%dT%H:%M:%S.%fZ"


def rq_job_key(rq_id: str) -> str:
    return f"{RQ_KEY_PREFIX}:job:{rq_id}"


def rq_queue_key(queue: str) -> str:
    return f"{RQ_KEY_PREFIX}:queue:{queue}"


def _rq_keys_beside(rq_id: str, queue: str) -> list[str]:
    """What RQ keeps of a job beside its hash, and where it may wait (for its delete):
    RQ's scheduled registry of ``queue``, the job's dependents and dependencies (RQ spells
    the second with two colons), its results and its executions."""
    return [
        f"{RQ_KEY_PREFIX}:scheduled:{queue}",
        f"{rq_job_key(rq_id)}:dependents",
        f"{rq_job_key('')}:{rq_id}:dependencies",
        f"{RQ_KEY_PREFIX}:results:{rq_id}",
        f"{RQ_KEY_PREFIX}:executions:{rq_id}",
    ]


def attempt_rq_id(job_id: str, attempt: int) -> str:
    return f"{job_id}-a{attempt}"


@dataclass(frozen=True)
class DueAttempt:
    """An attempt to enqueue: attempt number ``attempt`` of ``job_id`` on ``queue``, due
    at ``due_ms`` (ms, Redis's clock; 0: now)."""

    job_id: str
    queue: str
    attempt: int
    due_ms: int = 0

    @classmethod
    def of_entry(cls, job_id: str, entry: str) -> DueAttempt:
        """The attempt an outbox entry ``<queue>|<attempt>|<due ms>`` asks for (a malformed
        one is a ValueError)."""
        queue, attempt, due = entry.split("|")
        return cls(job_id, queue, int(attempt), int(due))


def rq_fields(item: DueAttempt, now: datetime | None = None) -> list[str | bytes]:
    """The attempt's RQ job hash, as RQ 3 writes a queued job (``Job.to_dict`` of
    ``Queue.create_job``, after RQ's preparation for its queue), field, value, …"""
    at = (now or datetime.now(UTC)).strftime(_RQ_TIME)
    call = json.dumps([ATTEMPT_FUNC, None, [item.job_id], {}]).encode("utf-8")
    fields: dict[str, str | bytes] = {
        "created_at": at,
        "data": zlib.compress(call),
        "success_callback_name": "",
        "failure_callback_name": "",
        "stopped_callback_name": "",
        "started_at": "",
        "ended_at": "",
        "last_heartbeat": "",
        "worker_name": "",
        "group_id": "",
        "origin": item.queue,
        "description": f"resumeq attempt {item.attempt} of {item.job_id}",
        "enqueued_at": at,
        "timeout": "-1",
        "result_ttl": str(RESULT_TTL_S),
        "failure_ttl": str(FAILURE_TTL_S),
        "status": "queued",
    }
    return [part for pair in fields.items() for part in pair]


def _script(name: str) -> Script:
    source = resources.files("resumeq.store.scripts").joinpath(f"{name}.lua").read_bytes()
    # Always called with its client: none is registered here.
    return Script(cast(Any, None), source)


_ENQUEUE = _script("due_enqueue")
_DISCARD = _script("rq_discard")
#: Set when this process scheduled an attempt: its own due-time scheduler looks again at
#: once (:class:`resumeq.queue.due.DueScheduler`).
_NUDGE = threading.Event()


def nudge() -> threading.Event:
    """This process's wake-up for its due-time scheduler."""
    return _NUDGE


def _fresh_nudge() -> None:
    """A forked child (an RQ work horse) gets its own: the parent's scheduler thread may
    have held the old one's lock at the fork."""
    global _NUDGE  # noqa: PLW0603 - one per process, by design
    _NUDGE = threading.Event()


os.register_at_fork(after_in_child=_fresh_nudge)


def write(client: redis.Redis | Pipeline, item: DueAttempt, *, entry: str | None = None) -> Any:
    """The one script that writes an attempt's RQ job on ``client``, once: onto its queue
    if it is due (Redis's clock), else into the due-time index. A job's later attempts go
    to the front of its queue (the spill lane excepted): its answer is under way, and the
    provider's cache still holds its prompt. Answers 1 when written, 0 when that RQ job
    exists already (on a pipeline: in its reply). A malformed queue name is a ValueError.

    With ``entry``, the job's outbox entry that asked for the attempt, the same script
    marks it done if it is still that entry, written now or before: carried out either way
    (what :meth:`~resumeq.store.Store.outbox_done` does, in the same round trip)."""
    queue = rq_queue_key(check_queue(item.queue))
    rq_id = attempt_rq_id(item.job_id, item.attempt)
    # The spill lane stays first in, first out: a person, or a reserved pool, drains it.
    at_front = item.attempt > 1 and item.queue != SPILL_QUEUE
    side = "L" if at_front else "R"
    rq_keys = [rq_job_key(rq_id), queue, keys.DUE, RQ_QUEUES, keys.DUE_WAKE]
    if entry is not None:
        rq_keys += [keys.outbox(item.job_id), keys.OUTBOX]
    due = max(0, int(item.due_ms))
    answer = _ENQUEUE(
        keys=rq_keys,
        args=[rq_id, -1, due, side, queue, item.job_id, entry or "", *rq_fields(item)],
        client=client,
    )
    if item.due_ms:
        _NUDGE.set()
    return answer


def enqueue_attempt(
    connection: redis.Redis, job_id: str, *, queue: str, attempt: int, due_ms: int = 0
) -> bool:
    """Enqueue attempt number ``attempt`` of ``job_id``, due at ``due_ms`` (ms, Redis's
    clock; 0 or past: now). A later one waits in resumeq's due-time index, to the
    millisecond. Answers False when that attempt is already enqueued (or ran): never
    twice."""
    return bool(write(connection, DueAttempt(job_id, queue, attempt, due_ms)))


def waiting_elsewhere(connection: redis.Redis, job_id: str, attempt: int, queue: str) -> bool:
    """Whether the attempt's RQ job waits — queued or scheduled — on another queue than
    ``queue`` (the spill lane, after an operator requeued the job elsewhere)."""
    key = rq_job_key(attempt_rq_id(job_id, attempt))
    status, origin = connection.hmget(key, "status", "origin")
    if status is None or origin is None or decode(origin) == queue:
        return False
    return decode(status) in ("queued", "scheduled")


def discard_waiting(connection: redis.Redis, job_id: str, attempt: int) -> bool | None:
    """Delete the attempt's RQ job if it waits, queued or scheduled, and never ran (as
    RQ's ``Job.delete`` would): True. False when there is none, or a worker runs it (it
    sees its job ended at its first write). None for one RQ's own delete must decide (in
    another status, or with an execution record)."""
    rq_id = attempt_rq_id(job_id, attempt)
    key = rq_job_key(rq_id)
    origin = decode(connection.hget(key, "origin") or b"")
    answer = _DISCARD(
        keys=[key, rq_queue_key(origin), keys.DUE, *_rq_keys_beside(rq_id, origin)],
        args=[rq_id, origin],
        client=connection,
    )
    return None if int(answer) < 0 else bool(answer)
