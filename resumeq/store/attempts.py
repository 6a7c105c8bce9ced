"""An attempt's writes under its lease: checkpoints (flush), the background response it
made, and its end (finish, release), each fenced by the lease's token; and the ledger
records written apart from an exit (an attempt stopped by a cancel or fenced out, a
background response counted once it was stopped).

A ledger record adds to the running totals in the same script (:mod:`resumeq.store.indexes`
registers its provider first).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from resumeq.core.models import FlushResult, Lease, ResponsePosition
from resumeq.store import keys
from resumeq.store.codec import ledger_json, non_negative, optional
from resumeq.store.indexes import Indexes, totals_json, totals_keys
from resumeq.store.jobs import ENDING_INDEXES
from resumeq.store.transport import WRITE_TRIES, Transport, refused


class Attempts:
    """What the owner of a job's lease writes (a worker, or a janitor for a dead one)."""

    def __init__(self, transport: Transport, indexes: Indexes) -> None:
        self.transport = transport
        #: The provider registry a ledger record's provider is noted in.
        self.indexes = indexes

    # -- while it runs -------------------------------------------------------------------

    def flush(
        self,
        lease: Lease,
        *,
        expected_revision: int,
        delta: str,
        tokens: int,
        exact: bool = True,
        extend_lease: bool = True,
        hidden_bytes: int = 0,
        request: str | None = None,
        response: ResponsePosition | None = None,
        calls: str | None = None,
        announce: str = "",
        refusal: str = "",
    ) -> FlushResult:
        """Checkpoint ``delta`` (``tokens`` output tokens) onto the prefix.

        One round trip: token and revision checks, APPEND, cursor and revision update,
        the event, and (``extend_lease``) the lease extension.

        ``exact`` says whether this attempt's total count is exact after the flush: an
        attempt that counted chunk by chunk (a lower bound) and then learns its total (a
        final usage chunk, a tokenizer call, an estimate) sends the difference with the
        label. ``tokens`` is never negative: no write lowers the cursor. The owner of a
        ``stalled`` job (a janitor) may flush too: a dead attempt's estimate.

        ``hidden_bytes`` is output that is not text (reasoning) in the same span: counted,
        for a janitor's estimate of an attempt that died.

        ``response``: the background response the delta came from and the last event of it
        the stored text then includes, written with the text so that they never disagree.

        ``calls``: the answer's tool calls as they stand after the flush (JSON, see
        :mod:`resumeq.core.answer`; None: unchanged), and ``announce`` those it makes
        complete (a JSON list, for the event); ``refusal``: the provider's refusal.

        Sent once: a caller that got no answer sends it again with the same ``request``
        id, and a flush that had been applied answers as it did.
        """
        if tokens < 0:
            raise ValueError(f"a flush never lowers the cursor (tokens {tokens})")
        job_id = lease.job_id
        job_keys = [
            keys.job(job_id),
            keys.text(job_id),
            keys.lease(job_id),
            keys.events(job_id),
            keys.LEASES,
        ]
        args: list[str | int] = [
            lease.token,
            non_negative(expected_revision, "expected_revision"),
            delta,
            tokens,
            "1" if exact else "0",
            lease.ttl_ms if extend_lease else 0,
            request or self.transport.request_id(),
            non_negative(hidden_bytes, "hidden_bytes"),
            *(response.args() if response is not None else ("", "", "")),
            "1" if self.transport.replicated else "0",
            calls or "",
            announce,
            refusal,
        ]
        status, *rest = self.transport.run("flush", job_keys, args, job_id)
        if status != "ok":
            refused(status, rest, job_id, "flush", expected_revision)
        return FlushResult(
            revision=int(rest[0]), spent_output_tokens=int(rest[1]), prefix_bytes=int(rest[2])
        )

    def note_response(self, lease: Lease, response: ResponsePosition) -> None:
        """Record the background response the lease's attempt made, as soon as it is named
        (before any of its output): a cut after it reattaches instead of buying it again."""
        self._response(lease, "note", response.args())

    def forget_response(self, lease: Lease) -> None:
        """Forget the job's background response: the next attempts do not read it."""
        self._response(lease, "forget", ("", "", ""))

    def _response(self, lease: Lease, mode: str, args: Sequence[str]) -> None:
        job_id = lease.job_id
        job_keys = [keys.job(job_id), keys.lease(job_id), keys.text(job_id)]
        status, *rest = self.transport.run("response", job_keys, [lease.token, mode, *args], job_id)
        if status != "ok":
            refused(status, rest, job_id, f"response {mode}")

    # -- its end -------------------------------------------------------------------------

    def finish(
        self,
        lease: Lease,
        *,
        state: Literal["done", "failed"],
        finish_reason: str = "",
        error: str = "",
        ledger: Mapping[str, Any] | None = None,
        expected_revision: int | None = None,
        hooks: Sequence[str] = (),
    ) -> int:
        """End the job as ``done`` or ``failed``; answers the new revision. A done job
        gets its ``hooks`` in its outbox in the same step (each stays there until it has
        run); its idempotency key expires with it."""
        job_id = lease.job_id
        self.indexes.note_provider(ledger)
        job_keys = [
            keys.job(job_id),
            keys.lease(job_id),
            keys.LEASES,
            keys.events(job_id),
            keys.text(job_id),
            keys.ledger(job_id),
            keys.outbox(job_id),
            keys.OUTBOX,
            *ENDING_INDEXES,
            *totals_keys(ledger),
            *self.transport.idempotency_key_of(job_id),
        ]
        args: list[str | int] = [
            lease.token,
            optional(expected_revision),
            state,
            finish_reason,
            error,
            ledger_json(ledger),
            self.transport.settings.retention_s,
            self.transport.request_id(),
            totals_json(ledger),
            *(hooks if state == "done" else ()),
        ]
        return self.transport.write("finish", job_keys, args, job_id, expected_revision)

    def release(
        self,
        lease: Lease,
        *,
        to: Literal["queued", "abandoned", "spilled"],
        reason: str,
        ledger: Mapping[str, Any] | None = None,
        expected_revision: int | None = None,
        delay_ms: int = 0,
        progressed: bool = True,
        discard: bool = False,
    ) -> int:
        """Apply the gate's exit and give up the lease; answers the new revision. The next
        attempt (``queued``: after ``delay_ms``; ``spilled``: on the spill lane) goes into
        the outbox in the same step. ``progressed``: whether the attempt delivered output
        (a run of attempts that did not is kept, for pacing retries). ``discard`` (with
        ``queued``): the answer is let go — text and tool calls — for a fresh attempt (an
        answer that is not what was asked, ``on_invalid = "retry"``); its tokens stay counted.

        A second spill of the same job is refused with
        :class:`~resumeq.core.errors.SpillExhausted`.
        """
        job_id = lease.job_id
        self.indexes.note_provider(ledger)
        job_keys = [
            keys.job(job_id),
            keys.lease(job_id),
            keys.LEASES,
            keys.events(job_id),
            keys.QUEUED,
            keys.SPILLED,
            keys.text(job_id),
            keys.ledger(job_id),
            keys.outbox(job_id),
            keys.OUTBOX,
            *ENDING_INDEXES,
            *totals_keys(ledger),
            *(self.transport.idempotency_key_of(job_id) if to == "abandoned" else []),
        ]
        args: list[str | int] = [
            lease.token,
            optional(expected_revision),
            to,
            reason,
            ledger_json(ledger),
            self.transport.settings.retention_s,
            self.transport.request_id(),
            non_negative(delay_ms, "delay_ms"),
            keys.SPILL_QUEUE,
            totals_json(ledger),
            "1" if progressed else "0",
            "1" if discard else "0",
        ]
        return self.transport.write("release", job_keys, args, job_id, expected_revision)

    # -- ledger records apart from an exit -----------------------------------------------

    def append_ledger(
        self,
        job_id: str,
        *,
        attempt: int,
        entry: Mapping[str, Any],
        counts_response: str | None = None,
    ) -> bool:
        """Record an attempt that ended without an exit of its own (stopped by a cancel,
        fenced out): at most one record per attempt. ``counts_response``: the background
        response whose output past the cursor the record counts (nobody counts it again:
        :meth:`amend_ledger`). Answers whether it was written."""
        self.indexes.note_provider(entry)
        job_keys = [keys.job(job_id), keys.ledger(job_id), *totals_keys(entry)]
        args: list[str | int] = [
            attempt,
            ledger_json(entry),
            totals_json(entry),
            counts_response or "",
        ]
        status, *rest = self.transport.run(
            "ledger_append", job_keys, args, job_id, tries=WRITE_TRIES
        )
        if status == "not_found":
            return False
        if status not in ("ok", "recorded"):
            refused(status, rest, job_id, "ledger_append")
        return bool(status == "ok")

    def amend_ledger(self, job_id: str, *, response_id: str, provider: str, tokens: int) -> bool:
        """Count what a cancelled job's background response made past the cursor, once it
        was stopped: into the record of the attempt that made it, and the totals (at most
        once per response). Answers whether it was counted now."""
        entry = {"provider": provider}
        self.indexes.note_provider(entry)
        deltas = {"output_tokens_billed": tokens, "naive_output_tokens_billed": tokens}
        job_keys = [keys.job(job_id), keys.ledger(job_id), *totals_keys(entry)]
        args: list[str | int] = [response_id, tokens, json.dumps(deltas) if tokens else ""]
        status, *rest = self.transport.run(
            "ledger_amend", job_keys, args, job_id, tries=WRITE_TRIES
        )
        if status in ("not_found", "counted", "no_record"):
            return False
        if status != "ok":
            refused(status, rest, job_id, "ledger_amend")
        return True
