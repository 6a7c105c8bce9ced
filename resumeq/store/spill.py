"""The spill lane: the jobs that could not go on and wait for a person (or a worker pool on
the spill lane), listed page by page, sent back to a queue (maybe edited) or dropped.
"""

from __future__ import annotations

import functools
from typing import Any

import redis

from resumeq.store import keys
from resumeq.store.codec import check_queue, decode, optional
from resumeq.store.jobs import Jobs
from resumeq.store.transport import Transport


class Spill:
    """The spilled jobs, and what an operator does with them."""

    def __init__(self, transport: Transport, jobs: Jobs) -> None:
        self.transport = transport
        #: Where a requeue that edits the spec reads the record, and the limits it checks.
        self.jobs = jobs

    def requeue(
        self,
        job_id: str,
        *,
        queue: str | None = None,
        provider: str | None = None,
        budget: int | None = None,
        floor: int | None = None,
        expected_revision: int | None = None,
    ) -> int:
        """Send a spilled job back to a queue, maybe another one, another provider, a
        larger budget or another floor. Answers the new revision.

        Naming another provider profile re-pins the prompt hash to the edited spec: the
        operator chose to continue the stored prefix there. A new ``budget`` must leave
        room past what was already spent, and the floor must fit in what is left (neither
        is part of the prompt hash): :class:`ValueError` naming the field, nothing written.
        """
        spec_json, new_hash = "", ""
        if provider is not None or budget is not None or floor is not None:
            record = self.jobs.get(job_id)
            update: dict[str, Any] = {}
            if provider is not None:
                update["provider"] = provider
            if budget is not None:
                if budget <= record.spent_output_tokens:
                    raise ValueError(
                        f"budget_tokens: {budget} leaves nothing past the "
                        f"{record.spent_output_tokens} tokens already spent"
                    )
                update["budget_tokens"] = budget
            if floor is not None:
                left = (budget or record.budget_tokens) - record.spent_output_tokens
                if not 1 <= floor <= left:
                    raise ValueError(
                        f"floor_tokens: {floor} must be from 1 to the {left} tokens left "
                        "(else the job spills again at once)"
                    )
                update["floor_tokens"] = floor
            from resumeq.core.spec import parse_spec  # noqa: PLC0415

            edited = record.spec.model_dump(mode="json") | update
            spec = parse_spec(edited, limits=self.jobs.limits)
            spec_json, new_hash = spec.to_json(), spec.prompt_hash()
        job_keys = [
            keys.job(job_id),
            keys.QUEUED,
            keys.SPILLED,
            keys.events(job_id),
            keys.outbox(job_id),
            keys.OUTBOX,
        ]
        args: list[str | int] = [
            check_queue(queue) if queue is not None else "",
            spec_json,
            new_hash,
            optional(expected_revision),
            self.transport.request_id(),
            budget if budget is not None else "",
            floor if floor is not None else "",
        ]
        return self.transport.write("requeue", job_keys, args, job_id, expected_revision)

    def drop(self, job_id: str, *, reason: str = "dropped by operator") -> int:
        """Give up on a spilled job (terminal; its partial text stays readable)."""
        job_keys = [
            keys.job(job_id),
            keys.SPILLED,
            keys.events(job_id),
            keys.text(job_id),
            keys.ledger(job_id),
            keys.outbox(job_id),
            keys.OUTBOX,
            keys.ENDED,
            keys.TOTALS,
            *self.transport.idempotency_key_of(job_id),
        ]
        args: list[str | int] = [
            reason,
            self.transport.settings.retention_s,
            self.transport.request_id(),
        ]
        return self.transport.write("drop", job_keys, args, job_id)

    def spilled(self, *, limit: int = 1000) -> list[str]:
        """Ids of spilled jobs, oldest spill first."""
        ids = self.transport.read("spilled", lambda r: r.zrange(keys.SPILLED, 0, limit - 1))
        return [decode(i) for i in ids]

    def spilled_after(self, after: tuple[int, str] | None, count: int) -> list[tuple[str, int]]:
        """``(job id, spilled ms)`` of up to ``count`` spilled jobs after ``after`` (a
        spill time and id) in the spill index's order: oldest spill first, ties by id."""
        low: int | str = after[0] if after is not None else "-inf"
        found: list[tuple[str, int]] = []
        offset = 0
        while len(found) < count:
            page = functools.partial(_spilled_page, low=low, start=offset, count=count)
            rows = self.transport.read("spilled", page)
            if not rows:
                break
            offset += len(rows)
            for member, score in rows:
                entry = (decode(member), int(score))
                if after is None or (entry[1], entry[0]) > after:
                    found.append(entry)
        return found[:count]


def _spilled_page(r: redis.Redis, *, low: int | str, start: int, count: int) -> Any:
    return r.zrangebyscore(keys.SPILLED, low, "+inf", start=start, num=count, withscores=True)
