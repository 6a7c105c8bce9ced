"""Applying the gate's decision, by whoever holds the lease: the worker after a cut, or
the janitor after reaping a job whose worker died.

Every exit is one fenced script (finish or release, with the attempt's ledger record),
then — only once it committed — the side effects: the next attempt's RQ job (after its
delay, through RQ's scheduler), the spill lane's RQ job, or the after-completion hooks.
If the process dies between the two, the janitor finds the queued job without an RQ job
and enqueues it again.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import redis

from resumeq.errors import SpillExhausted
from resumeq.gate import Decision
from resumeq.hooks import enqueue_hooks
from resumeq.models import JobRecord, Lease
from resumeq.queueing import SPILL_QUEUE, enqueue_attempt
from resumeq.store import Store

log = logging.getLogger(__name__)


def apply_decision(
    store: Store,
    connection: redis.Redis,
    lease: Lease,
    record: JobRecord,
    decision: Decision,
    *,
    ledger: Mapping[str, Any] | None,
    finish_reason: str = "",
) -> str:
    """Carry out ``decision`` for the job ``record`` describes; answers the state reached.

    ``record`` must be current as of the caller's last write (its queue, attempt count).
    """
    job_id = record.id
    action = decision.action
    if action == "done":
        store.finish(
            lease, state="done", finish_reason=finish_reason or decision.reason, ledger=ledger
        )
        if record.spec.hooks:
            enqueue_hooks(connection, record)
        return "done"
    if action == "failed":
        store.finish(lease, state="failed", error=decision.reason, ledger=ledger)
        return "failed"
    if action in ("retry", "resume"):
        store.release(lease, to="queued", reason=decision.reason, ledger=ledger)
        enqueue_attempt(
            connection,
            job_id,
            queue=record.queue,
            attempt=record.attempt + 1,
            delay_s=decision.delay_s,
        )
        return "queued"
    if action == "abandon":
        store.release(lease, to="abandoned", reason=decision.reason, ledger=ledger)
        return "abandoned"
    try:
        store.release(lease, to="spilled", reason=decision.reason, ledger=ledger)
    except SpillExhausted:
        reason = f"{decision.reason}, after a spill (spill is not a loop)"
        store.finish(lease, state="failed", error=reason, ledger=ledger)
        return "failed"
    # Park the next attempt in the spill lane: a reserved worker pool may serve it, or an
    # operator requeues it elsewhere.
    enqueue_attempt(connection, job_id, queue=SPILL_QUEUE, attempt=record.attempt + 1)
    log.info("job %s spilled: %s", job_id, decision.reason)
    return "spilled"
