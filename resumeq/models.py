"""The job record as the store returns it, and the small results of store operations."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict

from resumeq import states
from resumeq.identity import pid_of
from resumeq.spec import JobSpec, Limits

#: A job's states live in :mod:`resumeq.states` (no pydantic there, for the command line).
JobState = states.JobState
TERMINAL_STATES = states.TERMINAL_STATES


# Stored specs were validated at enqueue under that side's limits; reading one back must
# not refuse it because this process is configured with tighter ones.
_READ_LIMITS = Limits(
    max_messages=2**31,
    max_prompt_bytes=2**62,
    max_budget_tokens=2**62,
    max_metadata_bytes=2**62,
    max_hooks=2**31,
)


def lease_holder(token: str | None) -> str | None:
    """The worker a lease token names (``attempt:worker:nonce``, as ``acquire.lua`` makes
    it), or None."""
    parts = (token or "").split(":")
    return parts[1] if len(parts) > 2 else None


def holder_pid(token: str | None) -> int | None:
    """The process id in the name of the worker a lease token names (``HOST-PID-NONCE``,
    as :func:`resumeq.identity.process_name` makes it), or None."""
    return pid_of(lease_holder(token))


class JobRecord(BaseModel):
    """A snapshot of the job hash. ``revision`` says which write it reflects."""

    model_config = ConfigDict(frozen=True)

    id: str
    spec: JobSpec
    prompt_hash: str
    state: JobState
    queue: str
    budget_tokens: int
    floor_tokens: int
    #: The cursor: output tokens treated as consumed so far, all attempts together.
    spent_output_tokens: int
    #: False once any flush counted tokens by estimate rather than exactly.
    counts_exact: bool
    revision: int
    #: How many attempts have acquired the job so far.
    attempt: int
    spill_count: int
    created_ms: int
    updated_ms: int
    finished_ms: int | None = None
    lease_token: str | None = None
    idempotency_key: str | None = None
    #: The principal that created the job through the HTTP service, if one did, and a hash
    #: of the request it sent.
    owner: str | None = None
    request_hash: str | None = None
    finish_reason: str | None = None
    error: str | None = None
    #: Why the job last changed state (the gate's reason, the cancel reason, …).
    reason: str | None = None
    #: Where the current (or last) attempt started: cursor, prefix bytes, time.
    attempt_spent_base: int = 0
    attempt_text_base: int = 0
    #: Bytes of output that is not text (reasoning) the current attempt flushed so far.
    attempt_hidden_bytes: int = 0
    attempt_started_ms: int | None = None
    #: When the next (or current) attempt fell due: its enqueue, or the end of its delay.
    due_ms: int | None = None
    #: When the last attempt was cut and the job went back to its queue.
    cut_ms: int | None = None
    spilled_ms: int | None = None
    #: The fencing token of the attempt a janitor found dead.
    stalled_owner: str | None = None
    #: Attempts in a row that delivered nothing, and when the first of them started.
    failures: int = 0
    failing_since_ms: int | None = None
    #: Once the ended job's events stream was removed (a grace after it ended): the
    #: revision it had then (its last), and ``"rev:end rev:end …"``, the text's length in
    #: bytes after each revision that added text — where a late follower resumes from.
    events_trimmed: int | None = None
    text_offsets: str = ""
    #: The provider's background response the last attempts read (``background = true``
    #: profiles): its id, the provider and model it was made for (``provider model``), the
    #: attempt that made it, the cursor and the stored text's bytes before any of its
    #: output, and the last event number whose output is
    #: in the stored text and cursor (absent while the seam of a continuation was open:
    #: the stored text then matches no event, and the response cannot be reattached).
    response_id: str | None = None
    response_for: str | None = None
    response_attempt: int | None = None
    response_spent_base: int | None = None
    response_text_base: int | None = None
    response_seq: int | None = None

    def text_bytes_after(self, revision: int) -> int:
        """How many bytes of the text a follower had after ``revision``, from
        :attr:`text_offsets` (the events that held the deltas are gone)."""
        end = 0
        for pair in self.text_offsets.split():
            rev, _, size = pair.partition(":")
            if int(rev) > revision:
                break
            end = int(size)
        return end

    @property
    def attempt_kind(self) -> Literal["fresh", "retry", "resume", "reattach"]:
        """``fresh``, ``retry``, ``resume`` or ``reattach``: what the current attempt is (a
        worker that does not reattach a response it finds forgets it first)."""
        if self.reattachable:
            return "reattach"
        if self.attempt_text_base > 0:
            return "resume"
        return "fresh" if self.attempt <= 1 else "retry"

    @property
    def response_readable(self) -> bool:
        """Whether the job's background response can be read on: the stored text ends at
        an event of it, and it was made for the job's provider and model (a job moved to
        another never reads the first one's)."""
        return (
            self.response_id is not None
            and self.response_seq is not None
            and self.response_for == made_for(self.spec.provider, self.spec.model)
        )

    @property
    def reattachable(self) -> bool:
        """Whether the current attempt can read the rest of a response an earlier attempt
        made (on a profile with ``background = true``)."""
        return (
            self.response_readable
            and self.response_attempt is not None
            and self.response_attempt < self.attempt
        )

    @property
    def remaining_tokens(self) -> int:
        return max(0, self.budget_tokens - self.spent_output_tokens)

    @classmethod
    def from_hash(cls, fields: Mapping[str, str]) -> JobRecord:
        data: dict[str, object] = {k: v for k, v in fields.items() if v != ""}
        data["spec"] = JobSpec.model_validate_json(fields["spec"], context={"limits": _READ_LIMITS})
        data["counts_exact"] = fields.get("counts_exact", "1") == "1"
        return cls.model_validate(data)


class Lease(BaseModel):
    """Ownership of a job: present the token with every durable write."""

    model_config = ConfigDict(frozen=True)

    job_id: str
    token: str
    #: Lease deadline in ms since the epoch, Redis server time.
    deadline_ms: int
    ttl_ms: int


class Acquired(BaseModel):
    """What ``acquire`` and ``reap`` hand over: the lease and the record as of it."""

    model_config = ConfigDict(frozen=True)

    lease: Lease
    record: JobRecord


class CreateResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    #: False when an idempotency key returned a job created earlier.
    created: bool


class FlushResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    revision: int
    spent_output_tokens: int
    #: Length of the stored prefix in bytes (UTF-8) after the append.
    prefix_bytes: int


@dataclass(frozen=True, slots=True)
class ResponsePosition:
    """Where an attempt stands in a provider's background response: its id, the last event
    whose output the stored text includes (None: the text matches no event, as while a
    continuation's seam is open), and the provider and model it was made for. A plain
    dataclass: one is made per delta read."""

    response_id: str
    sequence: int | None
    made_for: str

    def args(self) -> tuple[str, str, str]:
        """The scripts' arguments."""
        seq = "" if self.sequence is None else str(self.sequence)
        return self.response_id, seq, self.made_for


def made_for(provider: str, model: str) -> str:
    """What a background response is made for: the job's provider profile and model (a
    job moved to another is never read on from the first's response)."""
    return f"{provider} {model}"
