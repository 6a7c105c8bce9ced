"""Ended jobs, after their end (the janitor's work): events streams trimmed once their
followers had time to read them, the last revisions marked durable where no replica
confirmed them, and the index of every job forgotten where retention ran out.
"""

from __future__ import annotations

import redis

from resumeq.store import keys
from resumeq.store.codec import decode, pack_text
from resumeq.store.transport import WRITE_TRIES, Transport, redis_errors, refused


class EndedJobs:
    """What becomes of a job once it ended."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport

    def ended_before(self, age_ms: int, *, limit: int = 200) -> list[str]:
        """Ids of jobs that ended at least ``age_ms`` ago and whose events stream is not
        trimmed yet, oldest first."""
        return self.transport.before(keys.ENDED, age_ms, limit, "ended_before")

    def trim_events(self, job_id: str) -> int:
        """Remove an ended job's events stream, keeping in the job hash where each text
        delta ended so a late follower reads the rest from the text; store the text again,
        compressed when that is smaller (else at its exact size), and drop what only a
        running job needs. Answers how many entries were removed (0 when there was nothing
        to trim: the job is gone, not ended, or trimmed already)."""
        job_keys = [keys.job(job_id), keys.events(job_id), keys.text(job_id), keys.ENDED]
        raw = self.transport.read("text", lambda r: r.get(keys.text(job_id))) or b""
        raw = raw.encode() if isinstance(raw, str) else raw
        packed = pack_text(raw)
        args: list[str | int | bytes] = [job_id, len(raw), packed or ""]
        status, *rest = self.transport.run("trim_events", job_keys, args, job_id, tries=WRITE_TRIES)
        if status == "ok":
            return int(rest[0])
        if status in ("not_found", "not_ended", "already_trimmed"):
            return 0
        refused(status, rest, job_id, "trim_events")

    def mark_ended(self, *, limit: int = 1000) -> int:
        """With replica durability: mark durable the last revision of every ended job no
        marker covers yet (its ending write was never confirmed by a replica — retried out,
        or its marker lost in a failover), so that its followers stop holding it. One write
        of this connection and a ``WAIT 1`` after it: a replica that acknowledges it holds
        every write before it. Answers how many jobs were marked; :class:`ReplicaLagging`
        if no replica acknowledged."""

        def unmarked(r: redis.Redis) -> list[tuple[str, int]]:
            ids = [decode(i) for i in r.zrange(keys.ENDED, 0, limit - 1)]
            with r.pipeline(transaction=False) as pipe:
                for job_id in ids:
                    pipe.hmget(keys.job(job_id), ["revision", "durable_revision"])
                found = pipe.execute()
            return [
                (job_id, int(rev))
                for job_id, (rev, marked) in zip(ids, found, strict=True)
                if rev is not None and int(rev) > int(marked or 0)
            ]

        revisions = self.transport.read("ended jobs unmarked", unmarked)
        if not revisions:
            return 0
        with redis_errors("mark ended"), self.transport.redis.pipeline(transaction=False) as pipe:
            pipe.incr(keys.DURABILITY_PROBE)
            pipe.execute_command("WAIT", 1, self.transport.settings.replica_timeout_ms)  # type: ignore[no-untyped-call]
            _, acked = pipe.execute()
            self.transport.acknowledged("mark ended", int(acked), revisions)
        return len(revisions)

    def forget_expired(self, count: int) -> int:
        """Remove from the index of every job the oldest entries (up to ``count`` looked
        at) whose job is gone (retention ran out); answers how many went."""
        oldest = [
            decode(m)
            for m in self.transport.read("jobs", lambda r: r.zrange(keys.JOBS, 0, count - 1))
        ]
        if not oldest:
            return 0
        with self.transport.redis.pipeline(transaction=False) as pipe:
            for job_id in oldest:
                pipe.exists(keys.job(job_id))
            alive = pipe.execute()
        gone = [job_id for job_id, n in zip(oldest, alive, strict=True) if not n]
        return int(self.transport.redis.zrem(keys.JOBS, *gone)) if gone else 0
