"""The job record as the store returns it, and the small results of store operations.

Plain dataclasses, no pydantic: a record is read field by field from the job hash, and its
spec is validated into a :class:`~resumeq.core.spec.JobSpec` when first asked for. What only
reads a job (``resumeq status``, a page of the console) loads no model for it
(tests/test_imports.py)."""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from resumeq.core import states
from resumeq.core.errors import CorruptRecord
from resumeq.core.identity import pid_of

if TYPE_CHECKING:
    from resumeq.core.answer import DurableCall
    from resumeq.core.spec import JobSpec, Limits

#: A job's states live in :mod:`resumeq.core.states`.
JobState = states.JobState
TERMINAL_STATES = states.TERMINAL_STATES


@functools.cache
def _read_limits() -> Limits:
    """Stored specs were validated at enqueue under that side's limits; reading one back
    must not refuse it because this process is configured with tighter ones."""
    from resumeq.core.spec import Limits  # noqa: PLC0415

    return Limits(
        max_messages=2**31,
        max_prompt_bytes=2**62,
        max_budget_tokens=2**62,
        max_metadata_bytes=2**62,
        max_hooks=2**31,
        max_tools=2**31,
        max_schema_bytes=2**62,
    )


def lease_holder(token: str | None) -> str | None:
    """The worker a lease token names (``attempt:worker:nonce``, as ``acquire.lua`` makes
    it), or None."""
    parts = (token or "").split(":")
    return parts[1] if len(parts) > 2 else None


def holder_pid(token: str | None) -> int | None:
    """The process id in the name of the worker a lease token names (``HOST-PID-NONCE``,
    as :func:`resumeq.core.identity.process_name` makes it), or None."""
    return pid_of(lease_holder(token))


@dataclass(frozen=True)
class JobRecord:
    """A snapshot of the job hash. ``revision`` says which write it reflects.

    ``spec_json`` is the spec as stored (validated when the job was created); ``spec``, the
    :class:`~resumeq.core.spec.JobSpec` it holds, validated on first use. ``provider`` and
    ``model`` are the spec's, read without it."""

    id: str
    spec_json: str
    provider: str
    model: str
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
    #: The answer's tool calls as checkpointed (JSON, :mod:`resumeq.core.answer`), and the
    #: provider's refusal, if it refused.
    tool_calls: str = ""
    refusal: str | None = None
    #: The cursor when the answer was last let go for a fresh attempt (``on_invalid =
    #: "retry"``): the tokens of the answer now stored are those after it.
    answer_base: int = 0

    @functools.cached_property
    def calls(self) -> tuple[DurableCall, ...]:
        """The tool calls checkpointed so far, a cut one last (never shown)."""
        from resumeq.core.answer import loads_calls  # noqa: PLC0415

        try:
            return loads_calls(self.tool_calls)
        except ValueError as exc:
            raise CorruptRecord(f"job {self.id}: corrupt record: {exc}", job_id=self.id) from None

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
            and self.response_for == made_for(self.provider, self.model)
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

    @functools.cached_property
    def spec(self) -> JobSpec:
        """The spec, validated (once: a frozen record caches it); a stored spec it refuses
        is a :class:`~resumeq.core.errors.CorruptRecord`."""
        from pydantic import ValidationError  # noqa: PLC0415

        from resumeq.core.spec import JobSpec  # noqa: PLC0415

        try:
            return JobSpec.model_validate_json(
                self.spec_json, context={"limits": _read_limits(), "stored": True}
            )
        except ValidationError as exc:
            first = str(exc).splitlines()[0]
            raise CorruptRecord(f"job {self.id}: corrupt record: {first}", job_id=self.id) from None

    @classmethod
    def from_hash(cls, fields: Mapping[str, str]) -> JobRecord:
        """The record of a job hash (an empty field is an absent one). A hash that is no
        job's raises :class:`ValueError` naming the field: a required one missing, a
        number or a state that does not read as one, a spec that is not a JSON object with
        a provider and a model."""
        values: dict[str, Any] = {}
        for name, convert, required in _FIELDS:
            raw = fields.get(name, "")
            if raw == "":
                if required:
                    raise ValueError(f"{name}: missing")
                continue
            try:
                values[name] = convert(raw)
            except ValueError:
                raise ValueError(f"{name}: cannot read {raw[:40]!r}") from None
        spec = fields.get("spec", "")
        try:
            data = json.loads(spec) if spec else None
        except ValueError:
            data = None
        if not isinstance(data, dict):
            raise ValueError(f"spec: not a JSON object ({spec[:40]!r})")
        for name in ("provider", "model"):
            if not isinstance(data.get(name), str):
                raise ValueError(f"spec: no {name}")
            values[name] = data[name]
        values["spec_json"] = spec
        values["counts_exact"] = fields.get("counts_exact", "1") == "1"
        return cls(**values)


_INTEGRAL = re.compile(r"\s*[+-]?[0-9][0-9_]*(?:\.0*)?\s*", re.ASCII)


def _integer(raw: str) -> int:
    """A hash field as an integer, in the forms a script may have written one."""
    if not _INTEGRAL.fullmatch(raw):
        raise ValueError(raw)
    return int(raw.strip().partition(".")[0])


_READERS: dict[str, Callable[[str], Any]] = {
    "int": _integer,
    "int | None": _integer,
    "str": str,
    "str | None": str,
    "JobState": JobState,
}
#: How each hash field is read, from the record's own annotations: ``(field, reader,
#: required)``. ``spec`` and ``counts_exact`` are read apart.
_FIELDS = tuple(
    (f.name, _READERS[str(f.type)], f.default is dataclasses.MISSING)
    for f in dataclasses.fields(JobRecord)
    if f.name not in ("spec_json", "provider", "model", "counts_exact")
)


@dataclass(frozen=True)
class Lease:
    """Ownership of a job: present the token with every durable write."""

    job_id: str
    token: str
    #: Lease deadline in ms since the epoch, Redis server time.
    deadline_ms: int
    ttl_ms: int


@dataclass(frozen=True)
class Acquired:
    """What ``acquire`` and ``reap`` hand over: the lease and the record as of it."""

    lease: Lease
    record: JobRecord


@dataclass(frozen=True)
class CreateResult:
    id: str
    #: False when an idempotency key returned a job created earlier.
    created: bool
    #: The outbox entry of a new job's first attempt (``<queue>|<attempt>|<due ms>``), as
    #: the create wrote it, for its committer to carry out at once; None when the create
    #: answered a job that existed, or was sent again (:mod:`resumeq.queue.outbox`).
    follow_up: str | None = dataclasses.field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class FlushResult:
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
