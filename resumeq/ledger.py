"""The ledger: one record per attempt, and what a job's attempts add up to (SPEC §6).

Input and output tokens are kept apart: a continuation re-sends input (the prompt and the
prefix), and the summary's ``input_replay_ratio`` says how much. Counts the provider did not
report are None, never guessed: a cut OpenAI stream has no usage, and its record says so.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from resumeq.settings import Prices

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
        if self.output_tokens is None:
            return self.output_tokens_persisted + self.unread_output_tokens
        return self.output_tokens + self.carried_output_tokens + self.unread_output_tokens

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


def summary(
    attempts: Iterable[Mapping[str, Any]],
    *,
    original_input_tokens: int | None = None,
    prices: Prices | None = None,
) -> dict[str, Any]:
    """Totals over a job's ledger: tokens billed and persisted, input replay, money."""
    records = [AttemptRecord.model_validate(a) for a in attempts]
    billed_out = sum(r.billed_output for r in records)
    persisted = sum(r.output_tokens_persisted for r in records)
    billed_in = sum(r.input_tokens or 0 for r in records)
    cached_in = sum(r.cached_input_tokens or 0 for r in records)
    resume_in = sum(r.input_tokens or 0 for r in records if r.kind == "resume")
    first_in = next((r.input_tokens for r in records if r.input_tokens), None)
    base_in = original_input_tokens or first_in
    out: dict[str, Any] = {
        "attempts": len(records),
        "resumes": sum(1 for r in records if r.kind == "resume"),
        "retries": sum(1 for r in records if r.kind == "retry"),
        "reattaches": sum(1 for r in records if r.kind == "reattach"),
        "output_tokens_billed": billed_out,
        "output_tokens_persisted": persisted,
        "input_tokens_billed": billed_in,
        "cached_input_tokens": cached_in,
        "output_counts_complete": all(r.output_tokens is not None for r in records),
        # Whether the billed figures are final: no attempt's bill is only a lower bound.
        "counts_complete": not any(r.billed_lower_bound for r in records),
        "input_replay_ratio": None,
    }
    if base_in and resume_in:
        # What resumes re-sent against the most they could have: prompt plus prefix, each.
        ceiling = sum(base_in + r.prefix_tokens for r in records if r.kind == "resume")
        out["input_replay_ratio"] = round(resume_in / ceiling, 4)
    if prices is not None:
        cached_price = prices.cached_input if prices.cached_input is not None else prices.input
        out["cost"] = round(
            ((billed_in - cached_in) * prices.input + cached_in * cached_price) / 1e6
            + billed_out * prices.output / 1e6,
            6,
        )
    return out
