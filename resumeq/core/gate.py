"""The gate: what happens after a cut (SPEC §4). Pure: no I/O, no clock, no randomness
that the caller does not pass in.

One decision with its reason:

- ``done`` — the provider said stop or length, or the budget is spent.
- ``retry`` — no text was generated yet: the same request again, after Retry-After or a
  jittered backoff, for what is left of the budget. Only the input is paid for again
  (and any reasoning that was cut before the text began: billed, and not resumable).
- ``resume`` — a real prefix and ``budget - spent >= floor``: a continuation asking for
  ``budget - spent`` tokens.
- ``abandon`` / ``spill`` — the job's exit when it cannot go on (remaining budget under the
  floor, attempts used up, estimated counts where exact ones are required, a byte-exact
  job, ``on_cut`` other than ``resume`` after a cut that left output behind, a run of
  attempts that delivered nothing for ``retry_window_s``): droppable jobs abandon, the
  others spill — once; a job that cannot go on after a spill has ``failed``.
- ``failed`` — a fatal provider error (400/401/403/404/422), or a prompt-hash conflict.

An answer that finished but is not what was asked (``invalid``: a structured answer that
does not validate, tool-call arguments that are not JSON) takes the job's ``on_invalid``
exit: ``retry`` lets the answer go and asks again from nothing (``discard``; bounded by
``max_attempts`` and the budget, then the ordinary exit), ``spill`` (once), or ``failed``.

It never answers ``retry`` once a prefix exists: the original request would buy the
prefix a second time.

Pacing: an attempt that delivered output shows the provider was working — the next one
starts at once, however many cuts came before. Only attempts that delivered nothing back
off (exponential and capped, with "equal" jitter: between half and all of the ceiling; a
provider's Retry-After is honoured), and such a run of failures ends the job's chances by
*time*: once it has lasted ``retry_window_s``, the job's exit applies. ``max_attempts``
caps the attempts that made progress. However fast the provider cuts them, two attempts of
one job start at least ``MIN_ATTEMPT_GAP_S`` apart: a provider that cuts every stream after
its first token is not hammered while ``max_attempts`` and the budget run out (an attempt
that ran that long, as any real one does, continues with no delay at all).
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from resumeq.core.models import JobRecord
from resumeq.core.spec import ExitPolicy

Action = Literal["done", "retry", "resume", "abandon", "spill", "failed"]
CutKind = Literal[
    "finished",  # the stream ended with a finish reason: not a cut at all
    "worker_died",  # the janitor found the lease expired
    "handoff",  # the worker is shutting down: it hands the job on (SPEC §16)
    "retryable",  # 429, 529, 5xx, connect error: before any token
    "stream_cut",  # disconnect, truncation, malformed chunk, in-band error
    "stall",  # no bytes for stall_timeout_s
    "fatal",  # 400/401/403/404/422
    "conflict",  # the prompt hash no longer matches the stored one
    "invalid",  # finished, but not what was asked: the job's on_invalid exit
]

#: Backoff for retries without a Retry-After: base * 2^(n-1), capped, with "equal" jitter
#: (half the ceiling, plus up to as much again at random).
BACKOFF_BASE_S = 1.0
BACKOFF_CAP_S = 60.0
#: A provider's Retry-After is honoured up to this long.
RETRY_AFTER_CAP_S = 600.0
#: Two attempts of one job start at least this far apart (seconds).
MIN_ATTEMPT_GAP_S = 0.05


class JobView(BaseModel):
    """What the gate reads of a job."""

    model_config = ConfigDict(frozen=True)

    budget_tokens: int = Field(gt=0)
    floor_tokens: int = Field(ge=1)
    spent_output_tokens: int = Field(ge=0)
    prefix_chars: int = Field(ge=0)
    #: Attempts made so far, the one that was cut included.
    attempts: int = Field(ge=0)
    spill_count: int = Field(ge=0)
    counts_exact: bool = True
    require_exact_counts: bool = False
    byte_exact: bool = False
    exit: ExitPolicy = ExitPolicy()
    #: Whether the attempt that ended delivered any output.
    progressed: bool = True
    #: Attempts in a row, before this one, that delivered nothing; and how long ago the
    #: first of them (or this one) began to fail, in seconds.
    failures: int = Field(default=0, ge=0)
    failing_for_s: float = Field(default=0.0, ge=0)
    retry_window_s: float = Field(default=300.0, gt=0)
    #: How long the attempt that ended ran, in seconds (None: not known).
    attempt_s: float | None = Field(default=None, ge=0)
    #: The next attempt reads on from the provider's background response (``reattach``):
    #: no new request, no new draw — the rest of the same answer, its count the
    #: provider's. What stops a continuation (a byte-exact job, a cursor that is an
    #: estimate, a budget below the floor, a cut inside a block) does not stop it.
    reads_on: bool = False


class Cut(BaseModel):
    """What ended the attempt."""

    model_config = ConfigDict(frozen=True)

    kind: CutKind
    #: The provider's finish reason, for ``finished``.
    finish_reason: str | None = None
    #: Seconds the provider asked to wait (Retry-After).
    retry_after_s: float | None = Field(default=None, ge=0)
    #: The cut fell inside a tool-use or thinking block: not continued mid-block.
    in_non_text_block: bool = False
    detail: str = ""


class Decision(BaseModel):
    model_config = ConfigDict(frozen=True)

    action: Action
    reason: str
    #: For ``retry`` and ``resume``: the output tokens the next attempt may ask for.
    max_tokens: int | None = None
    #: For ``retry`` and ``resume``: seconds to wait before the next attempt.
    delay_s: float = 0.0
    #: For ``retry``: the answer so far is let go first (an invalid one asked again).
    discard: bool = False

    @property
    def delay_ms(self) -> int:
        """The delay in whole milliseconds, rounded up (never shorter than chosen)."""
        return math.ceil(self.delay_s * 1000)


def backoff_s(attempt: int, jitter: float) -> float:
    """Exponential backoff after ``attempt`` attempts with "equal" jitter: between half
    and all of the capped ceiling; ``jitter`` in [0, 1)."""
    if not 0.0 <= jitter < 1.0:
        raise ValueError("jitter must be in [0, 1)")
    ceiling = min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2.0 ** max(0, attempt - 1))
    return ceiling * (0.5 + jitter / 2)


def _delay(job: JobView, cut: Cut, jitter: float) -> float:
    # A worker that went away (a handoff, a death) says nothing about the provider.
    worker_gone = cut.kind in ("worker_died", "handoff")
    if cut.retry_after_s is not None:
        delay = min(cut.retry_after_s, RETRY_AFTER_CAP_S)
    elif worker_gone or job.progressed:
        delay = 0.0  # the provider was working (or the worker went away): continue at once
    else:
        delay = backoff_s(job.failures + 1, jitter)
    if job.attempt_s is not None and not worker_gone:  # never a hot loop
        delay = max(delay, MIN_ATTEMPT_GAP_S - job.attempt_s)
    return delay


def _out_of_time(job: JobView) -> str | None:
    """A run of attempts that delivered nothing, longer than the retry window."""
    if job.progressed or job.failing_for_s < job.retry_window_s:
        return None
    return (
        f"no output for {job.failing_for_s:.0f} s over {job.failures + 1} attempts "
        f"(retry window {job.retry_window_s:.0f} s)"
    )


def pacing(record: JobRecord, *, progressed: bool, window_s: float, now_ms: int) -> dict[str, Any]:
    """The pacing part of a :class:`JobView`, from the job record as of the attempt that
    just ended: whether it delivered output, the run of failures before it, and since when
    (the run's first attempt, or this one) the job has been failing."""
    now = now_ms
    since = record.failing_since_ms or record.attempt_started_ms or now
    return {
        "progressed": progressed,
        "failures": record.failures,
        "failing_for_s": 0.0 if progressed else max(0.0, (now - since) / 1000.0),
        "retry_window_s": window_s,
    }


def _exit(job: JobView, reason: str) -> Decision:
    """The job cannot go on: its chosen exit, spill at most once."""
    wants_spill = job.exit.on_cut == "spill" or not job.exit.droppable
    if not wants_spill:
        return Decision(action="abandon", reason=reason)
    if job.spill_count >= 1:
        return Decision(action="failed", reason=f"{reason}, after a spill (spill is not a loop)")
    return Decision(action="spill", reason=reason)


def _why_not_continue(job: JobView, cut: Cut) -> str | None:
    """Why a job with a prefix cannot be continued, or None if it can."""
    remaining = job.budget_tokens - job.spent_output_tokens
    new_draw = not job.reads_on
    checks = [
        (job.exit.on_cut != "resume", f"on_cut is {job.exit.on_cut}"),
        (new_draw and job.byte_exact, "byte_exact job: a continuation is a new draw"),
        (
            new_draw and job.require_exact_counts and not job.counts_exact,
            "the cursor is an estimate and the job requires exact counts",
        ),
        (
            new_draw and remaining < job.floor_tokens,
            f"remaining budget {remaining} is below the floor {job.floor_tokens}",
        ),
        (
            job.progressed and job.attempts >= job.exit.max_attempts,
            f"attempts exhausted ({job.attempts})",
        ),
        (_out_of_time(job) is not None, _out_of_time(job) or ""),
        (new_draw and cut.in_non_text_block, "cut inside a tool-use or thinking block"),
    ]
    return next((why for failed, why in checks if failed), None)


def _settled(job: JobView, cut: Cut) -> Decision | None:
    """The outcomes that do not depend on the prefix: failed or done."""
    if cut.kind == "fatal":
        return Decision(action="failed", reason=f"provider refused the request: {cut.detail}")
    if cut.kind == "conflict":
        return Decision(action="failed", reason="prompt hash conflict: the prompt was edited")
    if cut.kind == "finished":
        return Decision(action="done", reason=f"finish reason {cut.finish_reason}")
    if job.spent_output_tokens >= job.budget_tokens:
        return Decision(action="done", reason="budget exhausted")
    return None


def _why_not_retry(job: JobView) -> str | None:
    remaining = job.budget_tokens - job.spent_output_tokens
    if job.exit.on_cut != "resume" and job.spent_output_tokens > 0:
        # ``on_cut`` is for cuts that leave output behind (here reasoning, billed and lost
        # to a retry); one that left nothing costs nothing to retry, and follows the
        # no-progress rule whatever the exit (SPEC §22).
        return f"on_cut is {job.exit.on_cut}"
    out_of_time = _out_of_time(job)
    if out_of_time:
        return out_of_time
    if job.progressed and job.attempts >= job.exit.max_attempts:
        return f"attempts exhausted ({job.attempts})"
    if remaining < job.floor_tokens and not job.reads_on:
        # Reasoning that was cut before any text is billed and lost (unless it is read on).
        return f"remaining budget {remaining} is below the floor {job.floor_tokens}"
    return None


def _invalid(job: JobView, cut: Cut) -> Decision:
    """An answer that is not what was asked: the exit chosen for it at enqueue."""
    reason = f"invalid answer: {cut.detail}"
    policy = job.exit.on_invalid
    if policy == "fail":
        return Decision(action="failed", reason=reason)
    if policy == "spill":
        if job.spill_count >= 1:
            return Decision(action="failed", reason=f"{reason}, after a spill")
        return Decision(action="spill", reason=reason)
    remaining = job.budget_tokens - job.spent_output_tokens
    if job.attempts >= job.exit.max_attempts:
        return _exit(job, f"{reason}; attempts exhausted ({job.attempts})")
    if remaining < job.floor_tokens:
        return _exit(job, f"{reason}; remaining budget {remaining} is below the floor")
    return Decision(
        action="retry",
        reason=f"{reason}; asked again from the start",
        max_tokens=remaining,
        discard=True,
    )


def decide(job: JobView, cut: Cut, *, jitter: float = 0.5) -> Decision:
    """The one decision for a job after ``cut``. ``jitter`` in [0, 1) spreads backoffs."""
    if cut.kind == "invalid":
        return _invalid(job, cut)
    settled = _settled(job, cut)
    if settled is not None:
        return settled
    remaining = job.budget_tokens - job.spent_output_tokens
    # Nothing generated yet: a retry buys only the input again.
    retry = job.prefix_chars == 0
    why = _why_not_retry(job) if retry else _why_not_continue(job, cut)
    if why is not None:
        return _exit(job, why)
    if job.reads_on:
        what = f"after {job.spent_output_tokens} output tokens, read on from the provider"
    elif not retry:
        what = f"after {job.spent_output_tokens} output tokens"
    elif job.spent_output_tokens:
        what = f"before any text ({job.spent_output_tokens} tokens of reasoning are lost)"
    else:
        what = "before any output"
    return Decision(
        action="retry" if retry else "resume",
        reason=f"{cut.kind} {what}",
        max_tokens=remaining,
        delay_s=_delay(job, cut, jitter),
    )
