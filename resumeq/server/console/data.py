"""What the console's pages show, read from Redis by index and by page: no page reads every
job. Synchronous (the pages run these in a worker thread), and used by the benchmark too."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rq import Queue, Worker

from resumeq.core.models import JobState
from resumeq.producer.ops import TOTAL_FIELDS, newest_before, stats, status_dict
from resumeq.store import SPILL_QUEUE, Store, decode, keys, redis_errors

#: States whose jobs have an index of their own (the rest are found through every job's).
LIVE = {
    "queued": keys.QUEUED,
    "running": keys.RUNNING,
    "stalled": keys.STALLED,
    "spilled": keys.SPILLED,
}
STATES = tuple(s.value for s in JobState)
#: The most jobs one page of the job list reads to find its matches: a filter that matches
#: few answers a shorter page, and the position to go on from.
SCAN_MAX = 1_000
BATCH = 250
#: The most state changes a job page lists.
MAX_EVENTS = 200


def overview(store: Store, queues: Sequence[str]) -> dict[str, Any]:
    """Queues with their depth, workers and streams in flight, jobs by state, tokens
    billed against what naive replays would have billed (today and all time), the spill
    lane's depth and its oldest age."""
    redis = store.redis
    today = time.strftime("%Y-%m-%d", time.gmtime())
    with redis_errors("overview"):
        lanes = [*dict.fromkeys([*queues, SPILL_QUEUE])]
        depth = {name: Queue(name, connection=redis).count for name in lanes}
        workers = Worker.count(connection=redis)
        oldest: Any = redis.zrange(keys.SPILLED, 0, 0, withscores=True)
        all_time, day = store.totals(), store.totals(day=today)
    counts = stats(store)
    now_ms = time.time() * 1000
    return {
        "queues": [{"name": n, "depth": d, "spill": n == SPILL_QUEUE} for n, d in depth.items()],
        "workers": workers,
        "in_flight": counts["attempts_in_flight"],
        "states": counts["states"],
        "jobs": counts["jobs"],
        "tokens": {"today": _tokens(day), "all_time": _tokens(all_time)},
        "spill_depth": counts["states"].get("spilled", 0),
        "spill_oldest_s": round((now_ms - oldest[0][1]) / 1000, 1) if oldest else None,
        "day": today,
    }


def _tokens(totals: dict[str, int]) -> dict[str, int]:
    got = {f: totals.get(f, 0) for f in TOTAL_FIELDS}
    billed, naive = got["output_tokens_billed"], got["naive_output_tokens_billed"]
    return {**got, "saved": max(naive - billed, 0)}


# -- the job list -----------------------------------------------------------------------------


@dataclass(frozen=True)
class JobFilter:
    state: str | None = None
    queue: str | None = None
    provider: str | None = None
    #: A piece of the prompt (any message), case ignored.
    text: str | None = None

    def matches(self, row: dict[str, Any], messages: list[str]) -> bool:
        if self.state and row["state"] != self.state:
            return False
        if self.queue and row["queue"] != self.queue:
            return False
        if self.provider and row["provider"] != self.provider:
            return False
        if self.text:
            needle = self.text.casefold()
            return any(needle in m.casefold() for m in messages)
        return True


def _content(content: Any) -> str:
    return content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)


@dataclass
class JobPage:
    rows: list[dict[str, Any]] = field(default_factory=list)
    #: Where the next page starts (score and id), None at the end.
    next: tuple[int, str] | None = None
    examined: int = 0


def jobs_page(
    store: Store, where: JobFilter, *, before: tuple[int, str] | None = None, limit: int = 50
) -> JobPage:
    """Newest first: from the state's own index for a state that has one, else from the
    index of every job; at most :data:`SCAN_MAX` jobs read for one page, a few fields of
    each (no job is parsed whole)."""
    index = LIVE.get(where.state or "", keys.JOBS)
    filtered = bool(where.queue or where.provider or where.text) or (
        where.state is not None and index == keys.JOBS
    )
    page = JobPage()
    top: tuple[int, str] | None = before
    while len(page.rows) < limit and page.examined < SCAN_MAX:
        want = min(BATCH if filtered else limit - len(page.rows), SCAN_MAX - page.examined)
        batch = newest_before(store, index, top, want)
        if not batch:
            page.next = None
            return page
        found = _rows(store, [job_id for job_id, _ in batch])
        gone = []
        for (job_id, score), got in zip(batch, found, strict=True):
            page.examined += 1
            top = (score, job_id)
            if got is None:
                gone.append(job_id)
                continue
            row, messages = got
            if where.matches(row, messages):
                page.rows.append(row)
                if len(page.rows) == limit:
                    break
        if gone and index == keys.JOBS:
            with redis_errors("jobs"):
                store.redis.zrem(keys.JOBS, *gone)  # expired: forgotten
    page.next = top if top is not None and newest_before(store, index, top, 1) else None
    return page


#: The fields a row of the job list needs.
ROW_FIELDS = ("state", "queue", "spec", "attempt", "spent_output_tokens", "budget_tokens",
              "created_ms", "reason")  # fmt: skip


def _rows(store: Store, job_ids: Sequence[str]) -> list[tuple[dict[str, Any], list[str]] | None]:
    """Each job's row and its messages' text (None: gone). A record this list cannot read
    is still listed, saying so: the job page shows what is wrong with it."""
    with redis_errors("jobs"), store.redis.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.hmget(keys.job(job_id), ROW_FIELDS)
        raw = pipe.execute()
    out: list[tuple[dict[str, Any], list[str]] | None] = []
    for job_id, values in zip(job_ids, raw, strict=True):
        f = dict(zip(ROW_FIELDS, [None if v is None else decode(v) for v in values], strict=True))
        if all(v is None for v in f.values()):
            out.append(None)  # gone: expired, or purged
            continue
        try:
            spec = json.loads(f["spec"] or "")
            messages = (
                [_content(m.get("content")) for m in spec["messages"]]
                if spec.get("messages") is not None
                else [str(spec["prompt"])]
            )
            row = {
                "id": job_id,
                "state": f["state"] or "",
                "queue": f["queue"] or "",
                "provider": str(spec.get("provider", "")),
                "model": str(spec.get("model", "")),
                "attempt": int(f["attempt"] or 0),
                "spent": int(f["spent_output_tokens"] or 0),
                "budget": int(f["budget_tokens"] or 0),
                "created_ms": int(f["created_ms"] or 0),
                "prompt": (messages[-1] if messages else "")[:160],
                "reason": f["reason"] or "",
            }
        except (ValueError, KeyError, TypeError, AttributeError):
            unreadable = {"id": job_id, "state": f["state"] or "?", "queue": f["queue"] or "",
                          "provider": "", "model": "", "attempt": 0, "spent": 0, "budget": 0,
                          "created_ms": 0, "prompt": "(its record cannot be read)",
                          "reason": ""}  # fmt: skip
            out.append((unreadable, []))
            continue
        out.append((row, messages))
    return out


# -- one job ----------------------------------------------------------------------------------


def job_view(store: Store, job_id: str) -> dict[str, Any]:
    """The job's status, its text cut at each splice (where a later attempt went on from
    the stored prefix), its ledger and its state changes."""
    info = status_dict(store, job_id)
    record = store.get(job_id)
    info["segments"] = segments(info["text"], info["attempts"])
    ledgered = max((int(e.get("attempt", 0)) for e in info["attempts"]), default=0)
    in_flight = record.state in (JobState.RUNNING, JobState.STALLED) and record.attempt > ledgered
    if in_flight and info["segments"] and info["segments"][-1]["attempt"] is not None:
        # An attempt that has written nothing yet: its splice is marked now, and its text
        # (over the event stream) goes after the mark.
        info["segments"].append(
            {"attempt": record.attempt, "kind": "in flight", "text": "", "splice": True}
        )
    info["events"] = state_changes(store, job_id)
    info["events_trimmed"] = record.events_trimmed is not None
    info["messages"] = [{"role": m.role, "content": _content(m.content)} for m in record.spec.chat]
    info["live"] = not record.state.terminal and record.state is not JobState.SPILLED
    info["has_tools"] = bool(record.spec.tools)
    return info


def segments(text: str, ledger: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The text as the attempts wrote it: one segment per attempt that added to it, each
    after the first starting at a splice (its attempt number and kind)."""
    data = text.encode()
    out: list[dict[str, Any]] = []
    start = 0
    for entry in sorted(ledger, key=lambda e: int(e.get("attempt", 0))):
        added = int(entry.get("bytes_persisted") or 0)
        if added <= 0:
            continue
        end = min(start + added, len(data))
        out.append(
            {
                "attempt": entry.get("attempt"),
                "kind": entry.get("kind", ""),
                "text": data[start:end].decode(errors="replace"),
                "splice": bool(out),
            }
        )
        start = end
    if start < len(data):  # an attempt in flight, not in the ledger yet
        out.append(
            {
                "attempt": None,
                "kind": "in flight",
                "text": data[start:].decode(errors="replace"),
                "splice": bool(out),
            }
        )
    return out


def state_changes(store: Store, job_id: str) -> list[dict[str, Any]]:
    """The job's state changes from its events stream (gone once the job ended a while
    ago), oldest first, at most :data:`MAX_EVENTS`."""
    out: list[dict[str, Any]] = []
    last = "-"
    with redis_errors("events"):
        while len(out) < MAX_EVENTS:
            raw: Any = store.redis.xrange(keys.events(job_id), min=last, max="+", count=1000)
            if last != "-":
                raw = raw[1:]
            if not raw:
                break
            for entry_id, fields in raw:
                f = {decode(k): decode(v) for k, v in fields.items()}
                if f.get("state"):
                    out.append(
                        {
                            "at_ms": int(decode(entry_id).partition("-")[0]),
                            "revision": int(f.get("rev", 0)),
                            "state": f["state"],
                            "reason": f.get("reason", ""),
                        }
                    )
            last = decode(raw[-1][0])
    return out[:MAX_EVENTS]
