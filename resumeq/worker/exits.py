"""Applying the gate's decision, by whoever holds the lease: the worker after a cut, or
the janitor after reaping a job whose worker died.

Every exit is one fenced script (finish or release, with the attempt's ledger record)
that also writes what must follow it into the job's outbox: the next attempt's RQ job
(with its due time), the spill lane's RQ job, or the after-completion hooks. Once it
committed, the outbox is carried out at once; if the process dies before that, the
janitor carries it out (:mod:`resumeq.queue.outbox`). Nothing is lost and nothing runs twice.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Literal

import redis

from resumeq.core import failpoints
from resumeq.core.errors import SpillExhausted
from resumeq.core.gate import Decision
from resumeq.core.models import JobRecord, Lease
from resumeq.queue import outbox
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
    progressed: bool = True,
) -> str:
    """Carry out ``decision`` for the job ``record`` describes; answers the state reached.

    ``record`` must be current as of the caller's last write (its queue, attempt count);
    ``progressed``: whether the attempt delivered output (the gate's pacing keeps count).
    """
    state = _commit(
        store,
        lease,
        decision,
        record=record,
        ledger=ledger,
        finish_reason=finish_reason,
        progressed=progressed,
    )
    failpoints.hit("after_commit")
    outbox.complete(store, connection, record.id)
    if state == "spilled":
        log.info("job %s spilled: %s", record.id, decision.reason)
    return state


def _commit(
    store: Store,
    lease: Lease,
    decision: Decision,
    *,
    record: JobRecord,
    ledger: Mapping[str, Any] | None,
    finish_reason: str,
    progressed: bool,
) -> str:
    """The exit's one script; answers the state it committed."""
    action = decision.action
    if action in ("done", "failed"):
        store.finish(
            lease,
            state=action,
            finish_reason=finish_reason or decision.reason if action == "done" else "",
            error=decision.reason if action == "failed" else "",
            ledger=ledger,
            hooks=record.spec.hooks,
        )
        return action
    if action in ("retry", "resume"):
        store.release(
            lease,
            to="queued",
            reason=decision.reason,
            ledger=ledger,
            delay_ms=decision.delay_ms,
            progressed=progressed,
            discard=decision.discard,
        )
        return "queued"
    exit_state: Literal["abandoned", "spilled"] = "abandoned" if action == "abandon" else "spilled"
    try:
        # The spill lane: a reserved worker pool may serve it, or an operator requeues.
        store.release(
            lease, to=exit_state, reason=decision.reason, ledger=ledger, progressed=progressed
        )
    except SpillExhausted:
        reason = f"{decision.reason}, after a spill (spill is not a loop)"
        store.finish(lease, state="failed", error=reason, ledger=ledger)
        return "failed"
    return exit_state
