"""The ledger: one record per attempt (SPEC §6); what a job's attempts add up to is
:mod:`resumeq.core.ledger_summary`.

Input and output tokens are kept apart: a continuation re-sends input (the prompt and the
prefix), and the summary's ``input_replay_ratio`` says how much. Counts the provider did not
report are None, never guessed: a cut OpenAI stream has no usage, and its record says so.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from resumeq.core.ledger_summary import billed_output, summary

__all__ = ["AttemptRecord", "CountSource", "summary"]

#: Where an attempt's output count came from (``chunks``: counted as the stream came, a
#: lower bound — a background response's cut attempt, whose total its reattach reads; and
#: records written before the estimate erred high).
CountSource = Literal["usage", "tokenizer", "estimate", "chunks"]


class AttemptRecord(BaseModel):
    model_config = ConfigDict(frozen=True, extra="allow")

    attempt: int
    kind: Literal["fresh", "retry", "resume", "reattach"]
    worker: str
    #: When the attempt fell due (enqueued, or its delay over), a worker took its RQ job,
    #: it started (its lease taken), the provider's first byte came, and it ended (ms):
    #: where a job's time to answer goes.
    due_ms: int | None = None
    dequeued_ms: int | None = None
    started_ms: int | None = None
    first_byte_ms: int | None = None
    ended_ms: int | None = None
    #: What ended the attempt: the gate's action, ``handoff`` (the worker shut down and handed
    #: the job on at once), or ``worker_died`` / ``lost``.
    outcome: str
    cut: str | None = None
    detail: str = ""
    #: The gate's reason for the outcome, and the delay it chose before the next attempt.
    reason: str = ""
    delay_ms: int = 0
    provider: str | None = None
    max_tokens: int | None = None
    #: The stored prefix when the attempt started (tokens), and how much of it was sent.
    prefix_tokens: int = 0
    prefix_chars_sent: int = 0
    input_tokens: int | None = None
    cached_input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    #: The provider's count of this attempt's output, by its usage or its counting
    #: endpoint (None: it did not say, or what it said was not believed).
    output_tokens: int | None = None
    #: Output tokens written to the cursor by this attempt (reasoning included).
    output_tokens_persisted: int = 0
    #: Among them, the output of a background response that could not be read on (billed
    #: by the provider, never read) that this attempt counted before it continued.
    carried_output_tokens: int = 0
    #: Output billed and never read, nor counted into the cursor: what a cancelled job's
    #: background response made after its last checkpoint, until it was cancelled.
    unread_output_tokens: int = 0
    #: Output billed that the next attempt buys again, and why: a tool call cut halfway
    #: (asked again, never finished by guesswork), or an answer let go because it was not
    #: what was asked (``on_invalid = "retry"``).
    regenerated_tokens: int = 0
    regenerated: str = ""
    #: The reasoning (thinking) tokens among them, where known: billed, never resumed.
    reasoning_tokens: int | None = None
    chars_persisted: int = 0
    #: UTF-8 bytes this attempt added to the stored text: where its splice ends.
    bytes_persisted: int = 0
    count_source: CountSource = "estimate"
    counts_exact: bool = False
    #: Why a provider count was not believed, if one was refused.
    count_refused: str | None = None
    #: What the seam dropped from the continuation: an echo of the prefix it was sent,
    #: and (``instruction`` mode) a restated ending.
    echo_chars: int = 0
    overlap_chars: int = 0
    #: The provider billed at least what is recorded, maybe more: an attempt that died, or
    #: was stopped, with tokens in flight that nobody counted.
    billed_lower_bound: bool = False

    @property
    def billed_output(self) -> int:
        """Output tokens this attempt is charged for: the provider's count where known."""
        return billed_output(
            self.output_tokens,
            self.output_tokens_persisted,
            self.carried_output_tokens,
            self.unread_output_tokens,
        )

    def totals(self) -> dict[str, int]:
        """What this record adds to the running totals (``stats``, the metrics)."""
        deltas = {
            "attempts": 1,
            f"attempts:{self.kind}:{self.outcome}": 1,
            "output_tokens_billed": self.billed_output,
            "output_tokens_persisted": self.output_tokens_persisted,
            "input_tokens_billed": self.input_tokens or 0,
            "cached_input_tokens": self.cached_input_tokens or 0,
            "cache_creation_input_tokens": self.cache_creation_input_tokens or 0,
            "reasoning_tokens": self.reasoning_tokens or 0,
            # A naive replay buys every resumed (or read on) prefix again.
            "naive_output_tokens_billed": self.billed_output
            + (self.prefix_tokens if self.kind in ("resume", "reattach") else 0),
            "lower_bound_attempts": int(self.billed_lower_bound),
        }
        if self.cut and self.cut != "finished":
            deltas[f"cuts:{self.cut}"] = 1
        return {field: n for field, n in deltas.items() if n}

    def to_json_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")
