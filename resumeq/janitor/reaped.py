"""A job whose worker died, as one batch of the reaper carries it: what its dead attempt
counted, what the gate decided, and the writes that apply its exit (as
:mod:`resumeq.worker.exits` commits one)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from resumeq.core.gate import Decision
from resumeq.core.models import Acquired, JobState
from resumeq.store import Store


class Reaped:
    """A job whose worker died, reaped by this janitor, on its way through one batch."""

    def __init__(self, acquired: Acquired, *, by_liveness: bool = False) -> None:
        self.lease, self.record = acquired.lease, acquired.record
        #: Found by its worker's connections closing, not by its lease expiring.
        self.by_liveness = by_liveness
        self.job_id = acquired.record.id
        #: The stored prefix's length in bytes, and the dead attempt's own text.
        self.text_bytes, self.tail = 0, ""
        #: The dead attempt's output tokens as it counted them, and as they stand.
        self.counted = self.tokens = 0
        #: What its background response made and nobody counted, when it is let go.
        self.carried = 0
        self.progressed = False
        self.decision: Decision | None = None
        self.ledger: dict[str, Any] = {}
        #: The state its exit reached, and the error a failed job was given.
        self.state, self.error = "", ""

    @property
    def reason(self) -> str:
        return self.decision.reason if self.decision else ""

    @property
    def rq_failure(self) -> str | None:
        """The reason its dead attempt's RQ job fails with, if resumeq failed the job."""
        if self.state != JobState.FAILED.value:
            return None
        return f"resumeq failed job {self.job_id} after its worker died: {self.error}"

    def flush_estimate(self) -> Callable[[Store], object]:
        """The write that raises the cursor to the dead attempt's estimate, and by what a
        released response made."""
        lease, revision = self.lease, self.record.revision
        tokens = self.tokens - self.counted + self.carried
        return lambda store: store.flush(
            lease, expected_revision=revision, delta="", tokens=tokens, exact=False
        )

    def exit(self) -> Callable[[Store], object]:
        """The write that applies the gate's decision, as ``resumeq.worker.exits`` commits it;
        sets the state it reaches."""
        decision, lease, ledger = self.decision, self.lease, self.ledger
        assert decision is not None
        progressed, reason = self.progressed, decision.reason
        action = decision.action
        if action == "done":
            self.state = "done"
            hooks = self.record.spec.hooks
            return lambda s: s.finish(
                lease, state="done", finish_reason=reason, ledger=ledger, hooks=hooks
            )
        if action == "failed":
            self.state, self.error = "failed", reason
            return lambda s: s.finish(lease, state="failed", error=reason, ledger=ledger)
        if action in ("retry", "resume"):
            self.state = "queued"
            delay_ms = decision.delay_ms
            return lambda s: s.release(
                lease,
                to="queued",
                reason=reason,
                ledger=ledger,
                delay_ms=delay_ms,
                progressed=progressed,
            )
        # The spill lane: a reserved worker pool may serve it, or an operator requeues.
        to: Literal["abandoned", "spilled"] = "abandoned" if action == "abandon" else "spilled"
        self.state = to
        return lambda s: s.release(
            lease, to=to, reason=reason, ledger=ledger, progressed=progressed
        )

    def fail_after_spill(self) -> Callable[[Store], object]:
        """The write that fails a job refused a second spill (spill is not a loop)."""
        lease, ledger = self.lease, self.ledger
        self.state = "failed"
        self.error = f"{self.reason}, after a spill (spill is not a loop)"
        error = self.error
        return lambda s: s.finish(lease, state="failed", error=error, ledger=ledger)
