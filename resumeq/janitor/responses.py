"""Background responses that may still be generating for nobody (their job was cancelled,
ended or spilled by a janitor, or went on without them): cancelled at their provider, and
what a cancelled job's response made past the cursor counted into its ledger (SPEC §22)."""

from __future__ import annotations

import logging
import time

from resumeq.core.counting import let_go
from resumeq.core.errors import ConfigError, JobNotFound, ProviderError, RetryableProviderError
from resumeq.core.models import JobState
from resumeq.janitor.accounting import MIN_BYTES_PER_TOKEN, Accounting
from resumeq.janitor.steps import SweepReport
from resumeq.providers import background
from resumeq.store import ResponseToStop
from resumeq.worker.context import WorkerContext

log = logging.getLogger(__name__)

#: A background response the provider could not be reached to cancel is asked again for
#: this long; at most this much of one sweep goes to cancelling them.
STOP_GIVE_UP_MS = 600_000
STOP_BUDGET_S = 2.0


class ResponseStopper:
    def __init__(self, ctx: WorkerContext, accounting: Accounting) -> None:
        self.ctx = ctx
        self.store = ctx.store
        self.accounting = accounting

    def stop_responses(self, report: SweepReport) -> None:
        """Cancel at the provider the background responses that may still be generating
        for nobody: their job was cancelled (from any process: a producer's knows no
        provider keys), ended or spilled by a janitor, or went on without them. A provider
        that cannot be reached is asked again next sweep, for up to
        :data:`STOP_GIVE_UP_MS`; at most :data:`STOP_BUDGET_S` of a sweep goes to this."""
        started = time.monotonic()
        done: list[str] = []
        now_ms = int(time.time() * 1000)
        for entry in self.store.responses_to_stop():
            if time.monotonic() - started > STOP_BUDGET_S:
                break
            try:
                if not self._count_stopped(entry) and background.stop_background_response(
                    self.ctx.settings, entry.provider, entry.response_id
                ):
                    log.info("job %s: cancelled response %s", entry.job_id, entry.response_id)
            except RetryableProviderError as exc:
                if now_ms - entry.since_ms < STOP_GIVE_UP_MS:
                    log.info("job %s: response not cancelled yet: %s", entry.job_id, exc)
                    continue
                log.warning("job %s: gave up cancelling its response: %s", entry.job_id, exc)
            except ProviderError as exc:
                log.warning("job %s: response not cancelled: %s", entry.job_id, exc)
            done.append(entry.member)
        self.store.responses_stopped(done)

    def _count_stopped(self, entry: ResponseToStop) -> bool:
        """A cancelled job's background response: cancelled at the provider, then what it
        made past the cursor counted into the record of the attempt that made it (SPEC
        §22; once, whoever counts it first — the worker that saw the cancel counts it
        itself). Answers whether it was cancelled here (else it is only to be stopped)."""
        try:
            record = self.store.get(entry.job_id)
        except JobNotFound:
            return False
        if record.state is not JobState.CANCELLED or record.response_id != entry.response_id:
            return False  # let go by an attempt that counted it, or a janitor's exit that did
        released = background.release_background_response(
            self.ctx.settings, entry.provider, entry.response_id
        )
        try:
            ratio = self.ctx.settings.profile(entry.provider).bytes_per_token
        except ConfigError:
            ratio = MIN_BYTES_PER_TOKEN
        stored = self.store.attempt_texts([(record.id, record.response_text_base or 0)])[0][0]
        tokens = let_go(
            already=record.spent_output_tokens - (record.response_spent_base or 0),
            billed=released.billed_output,
            output_bytes=released.output_bytes,
            stored_bytes=stored - (record.response_text_base or 0),
            bytes_per_token=ratio,
            calibration=self.accounting.calibration(entry.provider, record.spec.model),
        )
        if self.store.amend_ledger(
            record.id, response_id=entry.response_id, provider=record.spec.provider, tokens=tokens
        ):
            log.info(
                "job %s: cancelled response %s; it made %d tokens past the cursor",
                record.id,
                entry.response_id,
                tokens,
            )
        return True
