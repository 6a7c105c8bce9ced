"""What operators look at: a job's status, the totals over all jobs, the spill lane.

RQ, httpx and the provider clients load only in the operations that use them: ``resumeq
status`` is one of a shell loop's commands, and must not pay for them.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from resumeq.core import states
from resumeq.core.answer import shown
from resumeq.core.errors import JobNotFound, ResumeqError
from resumeq.core.ledger_summary import summary
from resumeq.core.models import JobRecord, JobState
from resumeq.store import Store, decode, keys, redis_errors

if TYPE_CHECKING:
    pass


def status_dict(store: Store, job_id: str) -> dict[str, Any]:
    """The ``status --json`` object (SPEC §15): the record and its text as of one
    revision. ``lease``, for a running or stalled job: who holds it (a worker, or the
    janitor that reaped it), for which attempt, and in how many ms it expires (0: it has,
    and a janitor will reap the job); None otherwise."""
    record, text = store.snapshot(job_id)
    ledger = store.ledger(job_id)
    lease = None
    if record.state in (JobState.RUNNING, JobState.STALLED) and record.lease_token:
        key = keys.lease(job_id)
        with redis_errors("lease"), store.redis.pipeline(transaction=True) as pipe:
            pipe.get(key)
            pipe.pttl(key)
            held, ttl_ms = pipe.execute()
        # A fencing token is attempt:holder:nonce; the key holds the current one.
        attempt, _, rest = (decode(held) if held else record.lease_token).partition(":")
        lease = {
            "holder": rest.rpartition(":")[0] or rest,
            "attempt": int(attempt) if attempt.isdigit() else None,
            "expires_in_ms": max(int(ttl_ms), 0) if held else 0,
        }
    return {
        "id": record.id,
        "state": record.state.value,
        "text": text,
        "tool_calls": shown(record.calls),
        "refusal": record.refusal,
        "budget_tokens": record.budget_tokens,
        "floor_tokens": record.floor_tokens,
        "spent_output_tokens": record.spent_output_tokens,
        "counts_exact": record.counts_exact,
        "revision": record.revision,
        "attempt": record.attempt,
        "attempts": ledger,
        "finish_reason": record.finish_reason,
        "error": record.error,
        "reason": record.reason,
        "spill_count": record.spill_count,
        "queue": record.queue,
        "provider": record.provider,
        "model": record.model,
        "prompt_hash": record.prompt_hash,
        "owner": record.owner,
        "created_ms": record.created_ms,
        "updated_ms": record.updated_ms,
        "finished_ms": record.finished_ms,
        "lease": lease,
        "summary": _job_summary(record, ledger),
    }


def _job_summary(record: JobRecord, ledger: list[dict[str, Any]]) -> dict[str, Any]:
    """The ledger's totals; not complete while an attempt is in flight (its record is not
    written yet) or while any recorded bill is only a lower bound."""
    out = summary(ledger)
    in_flight = record.state in (JobState.RUNNING, JobState.STALLED)
    out["attempt_in_flight"] = in_flight
    out["counts_complete"] = out["counts_complete"] and not in_flight
    return out


def all_job_ids(store: Store, *, batch: int = 500) -> list[str]:
    """Every job id in Redis, by a SCAN (tools and tests; the service's views use the
    indexes)."""
    ids = []
    for key in store.redis.scan_iter(match=keys.JOB_PATTERN, count=batch):
        name = decode(key)
        ids.append(name[name.index("{") + 1 : -1])
    return ids


def naive_output_tokens(ledger: list[dict[str, Any]]) -> int:
    """What a full replay would have billed for output: every resume buys its prefix again."""
    total = summary(ledger)["output_tokens_billed"]
    resumed = ("resume", "reattach")
    return int(total + sum(a.get("prefix_tokens", 0) for a in ledger if a.get("kind") in resumed))


#: The running totals ``stats`` reports, as the scripts that write the ledger keep them.
TOTAL_FIELDS = (
    "attempts",
    "output_tokens_billed",
    "output_tokens_persisted",
    "input_tokens_billed",
    "cached_input_tokens",
    "cache_creation_input_tokens",
    "reasoning_tokens",
    "naive_output_tokens_billed",
    "lower_bound_attempts",
)


def stats(store: Store, provider: str | None = None) -> dict[str, Any]:
    """Counts by state and token totals, in O(1): jobs in a state that is not terminal are
    counted now (the state indexes); ended jobs, tokens and attempts are running totals the
    scripts keep as they write each ledger record (since the totals began). An attempt in
    flight is in none of the token totals until its record is written; ``counts_complete``
    says whether any is, or whether any recorded bill is only a lower bound (a worker that
    died with tokens in flight)."""
    totals = store.totals(provider)
    live = store.live_counts()
    in_flight = live["running"] + live["stalled"]
    spend = {
        **{field: totals.get(field, 0) for field in TOTAL_FIELDS},
        # attempts in flight are counted over every provider: the indexes are global
        "attempts_in_flight": in_flight,
        "counts_complete": in_flight == 0 and not totals.get("lower_bound_attempts", 0),
    }
    if provider is not None:
        # a job may change provider when requeued: per provider, only what its attempts
        # spent is meaningful, not how many jobs it "has"
        return {"provider": provider, **spend}
    states = {
        state.value: live[state.value]
        if state.value in live
        else totals.get(f"jobs:{state.value}", 0)
        for state in JobState
    }
    return {
        "jobs": totals.get("jobs:created", 0),
        "states": states,
        **spend,
        # the profiles with totals of their own (``stats --provider P``, the metrics' series)
        "providers": store.providers(),
    }


LIVE_STATES = states.LIVE_STATES


def list_jobs(
    store: Store, state: str, *, queue: str | None = None, limit: int = 100
) -> list[dict[str, Any]]:
    """Jobs in a state that is not terminal, longest there first, from the state's index
    (never a scan); with ``queue``, only that queue's, paging through the index."""
    if limit <= 0:
        raise ValueError(f"limit must be > 0, got {limit}")
    found: list[dict[str, Any]] = []
    offset, page = 0, max(limit, 100)
    while len(found) < limit:
        ids = store.in_state(state, limit=page, offset=offset)
        if not ids:
            break
        offset += len(ids)
        for record in _records(store, ids):
            if queue is None or record.queue == queue:
                found.append(job_entry(record))
    return found[:limit]


_ENDED_BATCH = 250


def newest_before(
    store: Store, index: str, top: tuple[int, str] | None, count: int
) -> list[tuple[str, int]]:
    """Up to ``count`` entries (id, score) of the sorted set ``index`` after ``top`` in
    newest-first order (same-score entries ordered by id, descending): a position that
    holds while entries are added, as an offset would not."""
    redis = store.redis
    with redis_errors("jobs"):
        if top is None:
            raw: Any = redis.zrevrange(index, 0, count - 1, withscores=True)
            return [(decode(m), int(s)) for m, s in raw]
        score, job_id = top
        # Same score first (the ids below job_id), then lower scores.
        raw = redis.zrevrangebyscore(index, score, score, withscores=True)
        same = [(decode(m), int(s)) for m, s in raw if decode(m) < job_id]
        if len(same) >= count:
            return same[:count]
        raw = redis.zrevrangebyscore(
            index, f"({score}", "-inf", start=0, num=count - len(same), withscores=True
        )
        return same + [(decode(m), int(s)) for m, s in raw]


@dataclass
class EndedJobs:
    """Ended jobs found by reading the index of every job newest first."""

    jobs: list[dict[str, Any]] = field(default_factory=list)
    #: How many entries of the index were read.
    examined: int = 0
    #: Whether the index holds older entries that were not read.
    more: bool = False


def list_ended(
    store: Store,
    state: str,
    *,
    queue: str | None = None,
    limit: int = 100,
    since_ms: int | None = None,
    scan_max: int = states.ENDED_SCAN_MAX,
) -> EndedJobs:
    """Jobs in a terminal state, newest first, read from the index of every job: at most
    ``scan_max`` entries of it (an ended state has no index of its own), a few fields of
    each, the matches then whole. ``since_ms``: only jobs that ended at or after it."""
    if not JobState(state).terminal:
        raise ValueError(f"{state!r} is not an ended state (those with an index: {LIVE_STATES})")
    if limit <= 0 or scan_max <= 0:
        raise ValueError(f"limit and scan_max must be > 0, got {limit} and {scan_max}")
    out = EndedJobs()
    matched: list[str] = []
    top: tuple[int, str] | None = None
    while len(matched) < limit and out.examined < scan_max:
        batch = newest_before(store, keys.JOBS, top, min(_ENDED_BATCH, scan_max - out.examined))
        if not batch:
            break
        with redis_errors("jobs"), store.redis.pipeline(transaction=False) as pipe:
            for job_id, _ in batch:
                pipe.hmget(keys.job(job_id), "state", "queue", "finished_ms", "updated_ms")
            rows = pipe.execute()
        for (job_id, score), row in zip(batch, rows, strict=True):
            out.examined += 1
            top = (score, job_id)
            if _ended_as(row, state, queue, since_ms):
                matched.append(job_id)
                if len(matched) == limit:
                    break
    out.more = top is not None and bool(newest_before(store, keys.JOBS, top, 1))
    out.jobs = [job_entry(record) for record in _records(store, matched)]
    return out


def _records(store: Store, job_ids: list[str]) -> Iterator[JobRecord]:
    """The jobs of ``job_ids`` still there (one may have expired or been purged since
    an index named it)."""
    for job_id in job_ids:
        with contextlib.suppress(JobNotFound):
            yield store.get(job_id)


def _ended_as(row: list[Any], state: str, queue: str | None, since_ms: int | None) -> bool:
    """Whether a job's (state, queue, finished_ms, updated_ms) are what is listed."""
    got, lane, finished, updated = row
    return (
        got is not None
        and decode(got) == state
        and (queue is None or decode(lane or b"") == queue)
        and (since_ms is None or int(finished or updated or 0) >= since_ms)
    )


def job_entry(record: JobRecord) -> dict[str, Any]:
    """A job in a listing: enough to choose what to look at."""
    return {
        "id": record.id,
        "state": record.state.value,
        "queue": record.queue,
        "provider": record.provider,
        "model": record.model,
        "attempt": record.attempt,
        "spent_output_tokens": record.spent_output_tokens,
        "budget_tokens": record.budget_tokens,
        "reason": record.reason,
        "updated_ms": record.updated_ms,
    }


def spill_entry(store: Store, record: JobRecord, text: str | None = None) -> dict[str, Any]:
    """A spilled job in a listing (``text``: its stored prefix, if already read)."""
    return {
        "id": record.id,
        "reason": record.reason,
        "spilled_at": record.spilled_ms,
        "prefix_chars": len(text if text is not None else store.text(record.id)),
        "spent_output_tokens": record.spent_output_tokens,
        "budget_tokens": record.budget_tokens,
        "provider": record.provider,
        "queue": record.queue,
    }


@dataclass(frozen=True)
class SpillFilter:
    """Which spilled jobs an operation is about: every given condition must hold."""

    #: A piece of the reason it spilled (case does not matter).
    reason: str | None = None
    provider: str | None = None
    queue: str | None = None
    #: Spilled at least this long ago.
    older_than_s: float | None = None

    def matches(self, record: JobRecord, now_ms: int) -> bool:
        if self.reason and self.reason.lower() not in (record.reason or "").lower():
            return False
        if self.provider and record.provider != self.provider:
            return False
        if self.queue and record.queue != self.queue:
            return False
        if self.older_than_s is not None:
            age_ms = now_ms - (record.spilled_ms or now_ms)
            return age_ms >= self.older_than_s * 1000
        return True


def spilled_records(
    store: Store, where: SpillFilter | None = None, *, limit: int | None = None
) -> list[JobRecord]:
    """Spilled jobs that match, oldest spill first (from the spill index)."""
    where = where or SpillFilter()
    now_ms = int(time.time() * 1000)
    found: list[JobRecord] = []
    for job_id in store.spilled(limit=1_000_000):
        try:
            record = store.get(job_id)
        except JobNotFound:
            continue  # requeued or dropped meanwhile, or expired
        if where.matches(record, now_ms):
            found.append(record)
            if limit is not None and len(found) >= limit:
                break
    return found


def spill_list(
    store: Store, where: SpillFilter | None = None, *, limit: int | None = None
) -> list[dict[str, Any]]:
    return [spill_entry(store, r) for r in spilled_records(store, where, limit=limit)]


#: The most spilled jobs one page reads to find its matches (a filter that matches few
#: answers a shorter page, and the position to go on from).
SPILL_SCAN_MAX = 2_000


def spill_page(
    store: Store,
    where: SpillFilter | None = None,
    *,
    limit: int = 50,
    after: tuple[int, str] | None = None,
) -> tuple[list[dict[str, Any]], tuple[int, str] | None]:
    """One page of the spilled jobs that match, oldest spill first, after the position
    ``after`` (a spill time and id, what the previous page answered): the entries, and the
    position to go on from (None: the lane has no more). At most ``SPILL_SCAN_MAX`` jobs
    are read for one page, a batch to a round trip."""
    where = where or SpillFilter()
    now_ms = int(time.time() * 1000)
    found: list[JobRecord] = []
    position = after
    scanned = 0
    while len(found) < limit and scanned < SPILL_SCAN_MAX:
        batch = store.spilled_after(position, min(max(limit, 100), SPILL_SCAN_MAX - scanned))
        if not batch:
            position = None
            break
        for (job_id, spilled_ms), record in zip(
            batch, store.get_many([job_id for job_id, _ in batch]), strict=True
        ):
            scanned += 1
            position = (spilled_ms, job_id)
            # None: requeued or dropped meanwhile, or expired
            if record is not None and where.matches(record, now_ms):
                found.append(record)
                if len(found) == limit:
                    break
    if len(found) == limit and position is not None and not store.spilled_after(position, 1):
        position = None  # that was the last one
    texts = store.texts([record.id for record in found])
    return [spill_entry(store, r, t) for r, t in zip(found, texts, strict=True)], position


def spill_detail(store: Store, job_id: str) -> dict[str, Any]:
    """Everything a person needs to judge a spilled job: its status, its ledger and the
    conversation it was asked (the prompt itself, not only its hash)."""
    info = status_dict(store, job_id)
    record = store.get(job_id)
    # A plain text message as it always was; tool calls and a tool's call id where set.
    info["messages"] = [m.model_dump(mode="json", exclude_none=True) for m in record.spec.chat]
    info["provider"] = record.spec.provider
    info["model"] = record.spec.model
    return info


def spill_export_lines(store: Store, where: SpillFilter | None = None) -> Iterator[str]:
    """The spilled jobs that match as JSON lines (what ``spill_detail`` says of each), a
    page at a time: what the CLI prints and the HTTP service streams."""
    after: tuple[int, str] | None = None
    while True:
        items, after = spill_page(store, where, limit=100, after=after)
        for item in items:
            try:
                detail = spill_detail(store, item["id"])
            except JobNotFound:
                continue  # requeued or dropped while the export ran
            yield json.dumps(detail, ensure_ascii=False) + "\n"
        if after is None:
            return


def requeue_spilled(
    store: Store,
    job_id: str,
    *,
    queue: str | None = None,
    provider: str | None = None,
    budget: int | None = None,
    floor: int | None = None,
) -> str:
    """Send a spilled job back to ``queue`` (default: its own), maybe with another
    provider profile, a larger budget or another floor; its parked RQ job in the spill
    lane is replaced (the outbox does it, or the janitor if this process dies first).
    Answers the queue."""
    from resumeq.queue import outbox  # noqa: PLC0415

    record = store.get(job_id)
    store.requeue(
        job_id,
        queue=queue,
        provider=provider,
        budget=budget,
        floor=floor,
        expected_revision=record.revision,
    )
    outbox.complete(store, store.redis, job_id)
    return queue or record.queue


def idle_queues(store: Store, queues: Iterable[str]) -> list[str]:
    """Those of ``queues`` (each once) no live worker listens on: a job requeued there
    waits until one does (a reserved lane is a workflow, SPEC §10: warned, not refused)."""
    from resumeq.queue.queueing import listening_workers  # noqa: PLC0415

    with redis_errors("workers"):
        return [q for q in dict.fromkeys(queues) if listening_workers(store.redis, q) == 0]


def unserved(store: Store, queues: Iterable[str]) -> list[str]:
    """A warning for each of :func:`idle_queues`."""
    return [
        f"no live worker listens on queue {q!r}: its jobs wait there until one does "
        f"(resumeq worker --queues {q})"
        for q in idle_queues(store, queues)
    ]


def drop_spilled(store: Store, job_id: str, *, reason: str) -> None:
    from resumeq.queue.queueing import discard_attempt  # noqa: PLC0415

    record = store.get(job_id)
    store.drop(job_id, reason=reason)
    discard_attempt(store.redis, job_id, record.attempt + 1)


@dataclass
class BulkResult:
    """What a bulk operation on the spill lane did, job by job."""

    done: list[str] = field(default_factory=list)
    #: Job id → why it was left alone (changed meanwhile, gone).
    skipped: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"done": self.done, "count": len(self.done), "skipped": self.skipped}


def bulk(
    store: Store, action: Callable[[str], Any], where: SpillFilter, *, limit: int | None = None
) -> BulkResult:
    """Apply ``action`` to every spilled job that matches (up to ``limit``); a job that
    changed meanwhile is skipped with the reason, and the rest go on."""
    result = BulkResult()
    for record in spilled_records(store, where, limit=limit):
        try:
            action(record.id)
        except (ResumeqError, ValueError) as exc:
            result.skipped[record.id] = str(exc)
        else:
            result.done.append(record.id)
    return result
