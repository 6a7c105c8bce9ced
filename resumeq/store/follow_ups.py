"""What follows a commit: each job's outbox (the entries its last commit left for the
queue: the next attempt, the hooks to run), carried out and marked done, and the hook runs'
own leases (claimed, renewed, done).

The outbox's entries are written by the scripts that commit (create, release, requeue,
finish); :mod:`resumeq.queue.outbox` carries them out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import redis

from resumeq.store import keys
from resumeq.store.codec import fields_of, positive
from resumeq.store.transport import WRITE_TRIES, Transport, refused


class FollowUps:
    """The outbox of each job, and the runs of its hooks."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport

    # -- the outbox ----------------------------------------------------------------------

    def outbox(self, job_id: str) -> dict[str, str]:
        """What must still follow the job's last commit: field → entry."""
        raw = self.transport.read("outbox", lambda r: r.hgetall(keys.outbox(job_id)))
        return fields_of(raw)

    def outboxes(self, job_ids: Sequence[str]) -> list[dict[str, str]]:
        """:meth:`outbox` for many jobs, in one round trip."""

        def read(r: redis.Redis) -> list[Any]:
            with r.pipeline(transaction=False) as pipe:
                for job_id in job_ids:
                    pipe.hgetall(keys.outbox(job_id))
                return pipe.execute()

        replies = self.transport.read("outboxes", read) if job_ids else []
        return [fields_of(raw) for raw in replies]

    def outbox_done(self, job_id: str, field: str, entry: str) -> int:
        """An outbox entry was carried out: remove it if it is still ``entry``. Answers
        how many entries the job has left."""
        job_keys = [keys.outbox(job_id), keys.OUTBOX]
        args = [job_id, field, entry]
        status, *rest = self.transport.run("outbox_done", job_keys, args, job_id, tries=WRITE_TRIES)
        if status != "ok":
            refused(status, rest, job_id, "outbox_done")
        return int(rest[0])

    def outbox_prune(self, job_id: str) -> None:
        """Forget the job in the outbox index if its outbox is empty (it expired with a
        job that ended while entries were pending), atomically: a commit adding an entry
        meanwhile keeps it."""
        job_keys = [keys.outbox(job_id), keys.OUTBOX]
        self.transport.run("outbox_done", job_keys, [job_id, "", ""], job_id, tries=WRITE_TRIES)

    def outbox_replace(self, job_id: str, field: str, entry: str, new: str) -> bool:
        """Replace an outbox entry if it is still ``entry``; answers whether it was."""
        job_keys = [keys.outbox(job_id)]
        args = [field, entry, new]
        status, *_ = self.transport.run("outbox_set", job_keys, args, job_id, tries=WRITE_TRIES)
        return bool(status == "ok")

    def outbox_pending(self, age_ms: int, *, limit: int = 100) -> list[str]:
        """Ids of jobs whose outbox has held an entry for at least ``age_ms``."""
        return self.transport.before(keys.OUTBOX, age_ms, limit, "outbox_pending")

    # -- hook runs -----------------------------------------------------------------------

    def claim_hook(
        self, job_id: str, hook: str, *, token: str, ttl_ms: int
    ) -> Literal["ok", "done", "busy"]:
        """Take the lease of a hook run: ``ok``, ``done`` (it ran already) or ``busy``
        (another run holds it)."""
        job_keys = [keys.job(job_id), keys.hook_lease(job_id, hook)]
        args: list[str | int] = [hook, token, positive(ttl_ms, "ttl_ms")]
        status, *rest = self.transport.run("hook_claim", job_keys, args, job_id, tries=WRITE_TRIES)
        for answer in ("ok", "done", "busy"):
            if status == answer:
                return answer
        refused(status, rest, job_id, "hook_claim")

    def renew_hook(self, job_id: str, hook: str, *, token: str, ttl_ms: int) -> bool:
        """Extend a hook run's lease; answers False once it is no longer this run's."""
        status, *_ = self.transport.run(
            "hook_renew", [keys.hook_lease(job_id, hook)], [token, ttl_ms], job_id
        )
        return bool(status == "ok")

    def hook_done(self, job_id: str, hook: str, *, token: str) -> None:
        """Record that the hook ran: nobody runs it again."""
        job_keys = [keys.job(job_id), keys.hook_lease(job_id, hook), keys.outbox(job_id),
                    keys.OUTBOX]  # fmt: skip
        status, *rest = self.transport.run(
            "hook_done", job_keys, [job_id, hook, token], job_id, tries=WRITE_TRIES
        )
        if status != "ok":
            refused(status, rest, job_id, "hook_done")

    def hook_ran(self, job_id: str, hook: str) -> bool:
        """Whether the hook has run for the job."""
        done = self.transport.read(
            "hook_ran", lambda r: r.hexists(keys.job(job_id), f"hook_done:{hook}")
        )
        return bool(done)

    def hook_running(self, job_id: str, hook: str) -> bool:
        """Whether a run of the hook holds its lease."""
        held = self.transport.read(
            "hook_running", lambda r: r.exists(keys.hook_lease(job_id, hook))
        )
        return bool(held)
