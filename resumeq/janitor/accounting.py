"""What a dead attempt streamed, counted: its output tokens as they stand (counted chunk by
chunk, an estimate that errs high, so a continuation cannot buy past the budget), and what
a background response let go made past the cursor (SPEC §22). The provider profiles and
calibrations they are counted by: a profile this janitor does not know errs high."""

from __future__ import annotations

import logging

from resumeq.core.answer import Redo, redo_of
from resumeq.core.calibration import Calibration, pieces
from resumeq.core.counting import estimate, let_go
from resumeq.core.errors import ConfigError
from resumeq.core.models import JobRecord
from resumeq.core.settings import ProviderProfile
from resumeq.janitor.reaped import Reaped
from resumeq.providers import background
from resumeq.worker.context import WorkerContext

log = logging.getLogger(__name__)

#: The estimate's ratio for a job whose provider profile this janitor does not know: the
#: lowest default of any kind, so that it errs high.
MIN_BYTES_PER_TOKEN = 2.0
#: Decisions after which an attempt reads the job's background response on.
RESUMING = frozenset({"retry", "resume"})


class Accounting:
    """Counts for one janitor's dead attempts, by its settings and calibrations."""

    def __init__(self, ctx: WorkerContext) -> None:
        self.ctx = ctx

    def calibration(self, provider: str, model: str) -> Calibration | None:
        try:
            margin = self.ctx.settings.profile(provider).estimate_margin
        except ConfigError:
            return None
        return self.ctx.calibrations.calibration(provider, model, margin=margin)

    def dead_attempt_tokens(
        self, record: JobRecord, text_bytes: int, tail: str = ""
    ) -> tuple[int, int]:
        """The dead attempt's output tokens as counted, and as they stand: counted exactly,
        the same; counted chunk by chunk (a lower bound), an estimate that errs high from
        the text it stored and the reasoning it saw, so the continuation cannot buy past
        the budget."""
        counted = record.spent_output_tokens - record.attempt_spent_base
        if record.counts_exact:
            return counted, counted
        if self.read_on(record):
            # The next attempt reads the rest of the same response from the provider, and
            # with it the response's billed total: the count stays as counted (a guess that
            # errs high now would be charged on top of that total).
            return counted, counted
        try:
            profile: ProviderProfile | None = self.ctx.settings.profile(record.spec.provider)
        except ConfigError:
            profile = None
        ratio = profile.bytes_per_token if profile else MIN_BYTES_PER_TOKEN
        calibration = (
            self.ctx.calibrations.calibration(
                record.spec.provider, record.spec.model, margin=profile.estimate_margin
            )
            if profile is not None and tail
            else None
        )
        if calibration is not None:
            # Its text by what the model was seen to do (counted chunk by chunk: as many
            # chunks as it counted); its reasoning at the profile's ratio.
            text = calibration.estimate(
                text_bytes=len(tail.encode("utf-8")), chunks=counted, pieces=pieces(tail)
            )
            hidden = estimate(0, record.attempt_hidden_bytes, counted=0, bytes_per_token=ratio)
            return counted, max(counted, text + hidden)
        output = text_bytes - record.attempt_text_base + record.attempt_hidden_bytes
        return counted, estimate(0, output, counted=counted, bytes_per_token=ratio)

    def read_on(self, record: JobRecord) -> bool:
        """Whether the job's next attempt reads on from its background response."""
        try:
            background = self.ctx.settings.profile(record.spec.provider).background
        except ConfigError:
            return False
        return background and record.response_readable

    def min_output_tokens(self, record: JobRecord) -> int:
        """The fewest tokens the job's provider takes a request for (1 if this janitor does
        not know its profile)."""
        try:
            return self.ctx.settings.profile(record.spec.provider).min_output_tokens
        except ConfigError:
            return 1

    def redo(self, record: JobRecord) -> Redo | None:
        """What the next attempt does with the job's cut tool call, if it has one."""
        try:
            continues = self.ctx.settings.profile(record.spec.provider).continues_calls
        except ConfigError:
            continues = False  # a profile this janitor does not know: asked again, counted
        return redo_of(record.calls, record.spec, continue_calls=continues)

    def continued_chars(self, record: JobRecord) -> int:
        """The stored characters of a cut call the next attempt continues (0: none)."""
        redo = self.redo(record)
        return len(redo.continued.arguments) if redo and redo.continued else 0

    def count_regenerated(self, d: Reaped) -> None:
        """A dead attempt cut inside a tool call whose job goes on: unless the call is
        continued, its checkpointed arguments are bought again by the next attempt (what
        the worker saw of them: a lower bound of what was billed)."""
        if d.decision is None or d.decision.action not in RESUMING or self.read_on(d.record):
            return  # a response read on carries the call on: nothing is bought again
        redo = self.redo(d.record)
        if redo is not None and redo.regenerated_tokens:
            d.ledger["regenerated_tokens"] = redo.regenerated_tokens
            d.ledger["regenerated"] = redo.why

    def count_released(self, d: Reaped) -> None:
        """A dead attempt whose job takes an exit (no attempt will read its background
        response on): the response is cancelled at its provider, and what it made that the
        cursor had not counted is counted now (SPEC §22), into the flush and the ledger
        record before the exit."""
        record, decision = d.record, d.decision
        if record.response_id is None or decision is None or decision.action in RESUMING:
            return
        provider = (record.response_for or "").partition(" ")[0]
        try:
            profile = self.ctx.settings.profile(provider)
        except ConfigError:
            profile = None
        released = background.Released()
        if profile is not None:
            http = self.ctx.http.get(provider, profile)
            released = background.release_background_response(
                self.ctx.settings, provider, record.response_id, http
            )
        spent = record.spent_output_tokens + d.tokens - d.counted
        d.carried = let_go(
            already=spent - (record.response_spent_base or 0),
            billed=released.billed_output,
            output_bytes=released.output_bytes,
            stored_bytes=d.text_bytes - (record.response_text_base or 0),
            bytes_per_token=profile.bytes_per_token if profile else MIN_BYTES_PER_TOKEN,
            calibration=self.calibration(provider, record.spec.model),
        )
        if d.carried:
            d.ledger["carried_output_tokens"] = d.carried
            d.ledger["output_tokens_persisted"] = d.ledger.get("output_tokens_persisted", 0) + (
                d.carried
            )
            log.info(
                "job %s: its response %s, let go, made %d tokens nobody counted",
                d.job_id,
                record.response_id,
                d.carried,
            )
