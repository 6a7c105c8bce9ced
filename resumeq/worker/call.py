"""What one attempt works with: the call it made (:class:`Call`), what its stream delivered
(:class:`StreamResult`, its text kept compact in :class:`Pieces`), and the small rules the
runner, the stream and the accounting share."""

from __future__ import annotations

import functools
import threading
import time
from dataclasses import dataclass, field

from resumeq.core.continuation import AttemptKind, RequestPlan
from resumeq.core.counting import Tally
from resumeq.core.gate import Cut, JobView
from resumeq.core.models import JobRecord, made_for
from resumeq.core.settings import ProviderProfile
from resumeq.core.splice import Splicer
from resumeq.providers import (
    ProviderClient,
    Usage,
)
from resumeq.worker.checkpoint import Checkpointer
from resumeq.worker.context import Handoff


def now_ms() -> int:
    return int(time.time() * 1000)


class Pieces:
    """Text that arrives a token at a time, kept compact. A stream's deltas are short
    strings of some 50 bytes of object each: kept as they came, a long answer's pieces cost
    ten times its text for as long as the attempt runs, and a worker holds hundreds of
    attempts. Every :data:`JOIN_EVERY` pieces are joined into one string."""

    JOIN_EVERY = 64

    __slots__ = ("_joined", "_recent", "count")

    def __init__(self) -> None:
        self._joined: list[str] = []
        self._recent: list[str] = []
        #: Pieces appended (the chunks that carried text).
        self.count = 0

    def append(self, text: str) -> None:
        self._recent.append(text)
        self.count += 1
        if len(self._recent) >= self.JOIN_EVERY:
            self._joined.append("".join(self._recent))
            self._recent.clear()

    def text(self) -> str:
        return "".join(self._joined) + "".join(self._recent)


@dataclass
class StreamResult:
    """How the stream ended, what it said about itself, and what it delivered."""

    cut: Cut
    usage: Usage = field(default_factory=Usage)
    #: Text deltas as they arrived (an echo included), and the reasoning's text.
    received: Pieces = field(default_factory=Pieces)
    reasoning: Pieces = field(default_factory=Pieces)
    tally: Tally = field(default_factory=Tally)
    lost: BaseException | None = None
    #: When the provider answered (ms): its stream's headers, or its refusal.
    first_byte_ms: int | None = None
    #: When the first text arrived (ms).
    first_text_ms: int | None = None


@dataclass
class Call:
    """What one attempt works with once it has decided to call the provider."""

    record: JobRecord
    profile: ProviderProfile
    plan: RequestPlan
    client: ProviderClient
    splicer: Splicer
    ckpt: Checkpointer
    #: The stored prefix when the attempt started.
    prefix: str = ""
    #: The background response this attempt reads (made, or reattached), if any.
    response_id: str | None = None
    #: Why the response the attempt meant to read on could not be (it continued instead),
    #: and that response's output tokens the cursor had not counted (billed, never read).
    reattach_refused: str = ""
    carried: int = 0
    #: Output a cancelled job's background response made past the cursor: billed, never
    #: read, and never in the cursor (a cancelled job takes no more writes).
    unread: int = 0
    unread_response: str | None = None
    #: The cursor and the stored text's bytes where the response this attempt made began
    #: (None: it made none; a reattached one's are the record's).
    response_bases: tuple[int, int] | None = None
    #: Set when nothing is to be bought (what a response let go made left too little):
    #: the attempt ends with this cut, before any request.
    skip: Cut | None = None

    @functools.cached_property
    def made_for(self) -> str:
        """What this attempt's background responses are made for (see :func:`made_for`)."""
        return made_for(self.record.spec.provider, self.record.spec.model)


def reads_on(call: Call, result: StreamResult) -> bool:
    """Whether the next attempt reads on from this attempt's background response: it was
    cut (not finished, not refused before a stream) where the stored text ends at one of
    its events."""
    position = call.ckpt.response
    return (
        call.profile.background
        and result.cut.kind != "finished"
        and position is not None
        and position.sequence is not None
    )


def kind_of(record: JobRecord, plan: RequestPlan | None) -> AttemptKind:
    """What the attempt was, as it ran: a reattach refused by the provider continued."""
    if plan is None:
        return record.attempt_kind
    if plan.kind in ("resume", "reattach"):
        return plan.kind
    return "fresh" if record.attempt <= 1 else "retry"


def splicer_for(plan: RequestPlan, profile: ProviderProfile, prefix: str) -> Splicer:
    """How the attempt's text joins the stored prefix: a continuation's seam, or (a fresh
    request, a response read on) straight through."""
    return Splicer(
        prefix if plan.kind != "reattach" else "",
        sent=plan.sent if plan.kind == "resume" else None,
        trimmed=plan.trimmed,
        mode=profile.continue_mode,
        echo=profile.echo_policy,
    )


def pause(seconds: float, lost: threading.Event, handoff: Handoff) -> None:
    """Wait ``seconds``, or less once the lease is lost or the worker shuts down."""
    deadline = time.monotonic() + seconds
    while not lost.is_set() and not handoff.is_set():
        left = deadline - time.monotonic()
        if left <= 0:
            return
        lost.wait(min(left, 0.1))


def view_of(record: JobRecord) -> JobView:
    return JobView(
        budget_tokens=record.budget_tokens,
        floor_tokens=record.floor_tokens,
        spent_output_tokens=record.spent_output_tokens,
        prefix_chars=0,
        attempts=record.attempt,
        spill_count=record.spill_count,
        exit=record.spec.exit,
    )
