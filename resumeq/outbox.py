"""Completing what must follow a commit (SPEC §2).

The script that commits a state change writes, in the same step, what has to happen next
into the job's outbox: ``attempt`` (``<queue>|<attempt>|<due ms>``: enqueue that attempt's
RQ job, at its due time) or ``hooks`` (``<queue>``: enqueue the done job's hooks). Whoever
gets there first carries an entry out and then removes it: the committer at once, or a
janitor for anything a dead process left. Carrying an entry out twice is harmless — an
attempt's and a hook's RQ job ids are unique — so a crash at any point between a commit
and its follow-up loses nothing and runs nothing twice.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass

import redis

from resumeq import failpoints
from resumeq.errors import JobNotFound
from resumeq.hooks import enqueue_hooks
from resumeq.queueing import discard_if_elsewhere, enqueue_attempt
from resumeq.store import Store

log = logging.getLogger(__name__)

#: A janitor leaves an entry this long to the process that committed it.
JANITOR_GRACE_MS = 2_000


@dataclass(frozen=True)
class AttemptEntry:
    queue: str
    attempt: int
    due_ms: int

    @classmethod
    def parse(cls, raw: str) -> AttemptEntry:
        queue, attempt, due = raw.split("|")
        return cls(queue, int(attempt), int(due))


def complete(store: Store, connection: redis.Redis, job_id: str) -> int:
    """Carry out the job's outbox entries; answers how many were carried out."""
    done = 0
    for field, raw in store.outbox(job_id).items():
        if field == "attempt":
            entry = AttemptEntry.parse(raw)
            delay_s = max(0.0, entry.due_ms / 1000.0 - time.time())
            discard_if_elsewhere(connection, job_id, entry.attempt, entry.queue)
            enqueue_attempt(
                connection, job_id, queue=entry.queue, attempt=entry.attempt, delay_s=delay_s
            )
        elif field == "hooks":
            with contextlib.suppress(JobNotFound):  # purged meanwhile: no hooks to run
                enqueue_hooks(connection, store.get(job_id), queue=raw)
        else:
            log.warning("job %s: unknown outbox entry %s=%r left alone", job_id, field, raw)
            continue
        failpoints.hit("after_follow_up")
        store.outbox_done(job_id, field, raw)
        done += 1
    return done
