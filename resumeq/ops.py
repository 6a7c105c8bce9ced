"""What operators look at: a job's status, the totals over all jobs, the spill lane."""

from __future__ import annotations

from collections import Counter
from typing import Any

from resumeq import keys, outbox
from resumeq.errors import JobNotFound
from resumeq.ledger import summary
from resumeq.models import JobRecord, JobState
from resumeq.queueing import discard_attempt
from resumeq.store import Store, decode


def status_dict(store: Store, job_id: str) -> dict[str, Any]:
    """The ``status --json`` object (SPEC §15): the record and its text as of one
    revision."""
    record, text = store.snapshot(job_id)
    ledger = store.ledger(job_id)
    return {
        "id": record.id,
        "state": record.state.value,
        "text": text,
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
        "provider": record.spec.provider,
        "model": record.spec.model,
        "prompt_hash": record.prompt_hash,
        "created_ms": record.created_ms,
        "updated_ms": record.updated_ms,
        "finished_ms": record.finished_ms,
        "summary": summary(ledger),
    }


def all_job_ids(store: Store, *, batch: int = 500) -> list[str]:
    ids = []
    for key in store.redis.scan_iter(match=keys.JOB_PATTERN, count=batch):
        name = decode(key)
        ids.append(name[name.index("{") + 1 : -1])
    return ids


def naive_output_tokens(ledger: list[dict[str, Any]]) -> int:
    """What a full replay would have billed for output: every resume buys its prefix again."""
    total = summary(ledger)["output_tokens_billed"]
    return int(total + sum(a.get("prefix_tokens", 0) for a in ledger if a.get("kind") == "resume"))


def stats(store: Store) -> dict[str, Any]:
    """Counts by state and token totals over every job still in Redis."""
    states: Counter[str] = Counter()
    totals = Counter(
        output_tokens_billed=0,
        output_tokens_persisted=0,
        input_tokens_billed=0,
        cached_input_tokens=0,
        naive_output_tokens_billed=0,
        attempts=0,
    )
    for job_id in all_job_ids(store):
        try:
            record = store.get(job_id)
        except JobNotFound:
            continue  # expired while we scanned
        states[record.state.value] += 1
        ledger = store.ledger(job_id)
        s = summary(ledger)
        totals["output_tokens_billed"] += s["output_tokens_billed"]
        totals["output_tokens_persisted"] += record.spent_output_tokens
        totals["input_tokens_billed"] += s["input_tokens_billed"]
        totals["cached_input_tokens"] += s["cached_input_tokens"]
        totals["naive_output_tokens_billed"] += naive_output_tokens(ledger)
        totals["attempts"] += s["attempts"]
    return {
        "jobs": sum(states.values()),
        "states": {state.value: states.get(state.value, 0) for state in JobState},
        **dict(totals),
    }


def spill_entry(store: Store, record: JobRecord) -> dict[str, Any]:
    return {
        "id": record.id,
        "reason": record.reason,
        "spilled_at": record.spilled_ms,
        "prefix_chars": len(store.text(record.id)),
        "spent_output_tokens": record.spent_output_tokens,
        "budget_tokens": record.budget_tokens,
        "provider": record.spec.provider,
        "queue": record.queue,
    }


def spill_list(store: Store) -> list[dict[str, Any]]:
    out = []
    for job_id in store.spilled():
        try:
            out.append(spill_entry(store, store.get(job_id)))
        except JobNotFound:
            continue
    return out


def requeue_spilled(
    store: Store, job_id: str, *, queue: str | None = None, provider: str | None = None
) -> str:
    """Send a spilled job back to ``queue`` (default: its own), maybe with another
    provider profile; its parked RQ job in the spill lane is replaced (the outbox does it,
    or the janitor if this process dies first). Answers the queue."""
    record = store.get(job_id)
    store.requeue(job_id, queue=queue, provider=provider, expected_revision=record.revision)
    outbox.complete(store, store.redis, job_id)
    return queue or record.queue


def drop_spilled(store: Store, job_id: str, *, reason: str) -> None:
    record = store.get(job_id)
    store.drop(job_id, reason=reason)
    discard_attempt(store.redis, job_id, record.attempt + 1)
