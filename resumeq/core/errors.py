"""resumeq's one exception tree.

Lower-layer errors (redis-py, httpx, pydantic) are translated once, where they cross
into resumeq, and never leak past that boundary::

    ResumeqError
    ├── ConfigError                 a settings file or variable is wrong
    ├── JobFailed                   an attempt's RQ job, for a job resumeq failed
    ├── InvalidSpec                 a JobSpec was refused; .errors names every field
    ├── ProviderError               a provider call failed; .retry_after, .status, .body
    │   ├── RetryableProviderError  before any token; safe to send again after a wait
    │   │   ├── ProviderConnectError    could not connect, or timed out connecting
    │   │   ├── RateLimited             HTTP 429 (Retry-After honoured)
    │   │   ├── ProviderOverloaded      HTTP 529 (Anthropic's overloaded_error)
    │   │   └── ProviderUnavailable     HTTP 5xx, 408, 409
    │   ├── StreamCut               the stream broke after it began; what arrived is kept
    │   │   ├── Disconnected            the connection dropped mid-stream
    │   │   ├── Truncated               the stream ended without a finish reason
    │   │   ├── MalformedChunk          a chunk that is not what the wire format says
    │   │   ├── InBandError             an error event behind HTTP 200
    │   │   └── Stalled                 no bytes, or no content, for stall_timeout_s
    │   ├── FatalProviderError      400/401/403/404/422 and other 4xx: never retried
    │   ├── ReattachRefused         a background response cannot be read on: continue instead
    │   ├── ResponseQueued          a background response has not started: poll it again
    │   └── UnreadableCount         a counting endpoint answered something that is no count
    └── StoreError                  the job store refused or failed an operation
        ├── RedisUnavailable        Redis could not be reached (connection, timeout)
        │   └── ReplicaLagging          no replica acknowledged a write in time (durability)
        ├── JobNotFound             no job record under that id
        ├── CorruptRecord           a job record that cannot be read back
        ├── IdempotencyConflict     the idempotency key belongs to a job with another prompt
        ├── InvalidTransition       the job's state does not allow the operation
        │   └── SpillExhausted      the job has already spilled once; spill is not a loop
        └── WriteRefused            a fenced durable write was refused; stop streaming
            ├── LeaseLost           the caller's fencing token is no longer the lease
            ├── StaleRevision       the caller expected another revision
            └── JobCancelled        the job was cancelled

A ``WriteRefused`` means the caller is no longer allowed to spend tokens on the job: a
worker that sees one closes its stream at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


class ResumeqError(Exception):
    """Base of every error resumeq raises on purpose."""


class ConfigError(ResumeqError):
    """A configuration file, profile or environment variable is invalid."""


class JobFailed(ResumeqError):
    """Raised by an attempt's RQ job when resumeq failed the job (a 401, an unknown
    provider, a record that cannot be read back): RQ's failed registry then holds exactly
    the attempts whose job needs a person, with the reason."""


@dataclass(frozen=True)
class FieldError:
    """One refused field of a job spec: its dotted location and why."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


class InvalidSpec(ResumeqError, ValueError):
    """A job spec was refused at enqueue; nothing was written."""

    def __init__(self, errors: Sequence[FieldError]) -> None:
        self.errors = tuple(errors)
        super().__init__("invalid job spec: " + "; ".join(str(e) for e in self.errors))

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(e.field for e in self.errors)


class StoreError(ResumeqError):
    """The job store refused or failed an operation."""

    def __init__(self, message: str, *, job_id: str | None = None) -> None:
        super().__init__(message)
        self.job_id = job_id


class RedisUnavailable(StoreError):
    """Redis could not be reached or did not answer in time."""


class ReplicaLagging(RedisUnavailable):
    """With ``[store] durability = "replica"``: the primary applied a write but no replica
    acknowledged it within ``replica_timeout_ms``. The write is not durable yet; it is sent
    again (its request id makes the re-send answer as it did) as when Redis is down."""


class JobNotFound(StoreError):
    """There is no job record under that id (never created, or expired)."""


class CorruptRecord(StoreError):
    """A job record exists but cannot be read back (edited by hand, half-deleted)."""


class IdempotencyConflict(StoreError):
    """The idempotency key is already bound to a job whose prompt hash differs."""

    def __init__(self, message: str, *, job_id: str, existing_job_id: str) -> None:
        super().__init__(message, job_id=job_id)
        self.existing_job_id = existing_job_id


class InvalidTransition(StoreError):
    """The job's current state does not allow the operation."""

    def __init__(self, message: str, *, job_id: str, state: str) -> None:
        super().__init__(message, job_id=job_id)
        self.state = state


class SpillExhausted(InvalidTransition):
    """The job spilled once already; a second spill is refused (it fails instead)."""


class WriteRefused(StoreError):
    """A fenced durable write was refused: the caller must stop streaming at once."""


class LeaseLost(WriteRefused):
    """The caller's fencing token no longer holds the job's lease."""


class StaleRevision(WriteRefused):
    """The write expected a revision the job no longer has."""

    def __init__(self, message: str, *, job_id: str, expected: int, current: int) -> None:
        super().__init__(message, job_id=job_id)
        self.expected = expected
        self.current = current


class JobCancelled(WriteRefused):
    """The job was cancelled while the caller held its lease."""


class ProviderError(ResumeqError):
    """A provider call failed. Translated once, at the provider client's boundary."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        retry_after: float | None = None,
        error_type: str | None = None,
        body: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        #: Seconds the provider asked us to wait (Retry-After), if it said.
        self.retry_after = retry_after
        #: The provider's own error type (``rate_limit_error``, ``overloaded_error`` …).
        self.error_type = error_type
        self.body = body

    #: A short name for the ledger and the gate: ``rate_limited``, ``disconnected`` …
    kind = "provider_error"


class RetryableProviderError(ProviderError):
    """Failed before any token was streamed; the same request may be sent again."""

    kind = "retryable"


class ProviderConnectError(RetryableProviderError):
    kind = "connect_error"


class RateLimited(RetryableProviderError):
    kind = "rate_limited"


class ProviderOverloaded(RetryableProviderError):
    kind = "overloaded"


class ProviderUnavailable(RetryableProviderError):
    kind = "server_error"


class StreamCut(ProviderError):
    """The stream began and broke: every delta yielded before this is real and kept."""

    kind = "stream_cut"


class Disconnected(StreamCut):
    kind = "disconnected"


class Truncated(StreamCut):
    kind = "truncated"


class MalformedChunk(StreamCut):
    kind = "malformed_chunk"


class InBandError(StreamCut):
    kind = "in_band_error"


class Stalled(StreamCut):
    kind = "stalled"


class FatalProviderError(ProviderError):
    """The request itself is wrong (or not allowed): sending it again cannot help."""

    kind = "fatal"


class ReattachRefused(ProviderError):
    """A background response cannot be read on: too old to be streamed, gone, failed,
    cancelled, not a background response, or made for another model. The attempt goes on
    with a continuation from the stored prefix instead. ``billed_output``: the response's
    output tokens as the provider reported them, where it did (all billed, some unread)."""

    kind = "reattach_refused"

    def __init__(self, message: str, *, billed_output: int | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.billed_output = billed_output


class ResponseQueued(ProviderError):
    """A background response is still ``queued``: polled again later, never made twice."""

    kind = "queued"


class UnreadableCount(ProviderError):
    """A counting endpoint answered, but not with a count (HTML, a list of strings, a
    missing field): the attempt keeps its estimate."""
