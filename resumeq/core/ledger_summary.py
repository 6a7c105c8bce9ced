"""What a job's ledger adds up to (SPEC §6), from its records as stored.

No model is built: ``resumeq status`` sums a job's attempts without loading pydantic
(tests/test_imports.py). A stored record is what
:meth:`~resumeq.core.ledger.AttemptRecord.to_json_dict` wrote; a field a record written by an
earlier version lacks counts as :class:`~resumeq.core.ledger.AttemptRecord`'s default.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from resumeq.core.settings import Prices


def billed_output(
    output_tokens: int | None, persisted: int, carried: int = 0, unread: int = 0
) -> int:
    """Output tokens an attempt is charged for: the provider's count where known (with
    what it carried and what was never read), else what it persisted (and never read)."""
    if output_tokens is None:
        return persisted + unread
    return output_tokens + carried + unread


def _billed(a: Mapping[str, Any]) -> int:
    return billed_output(
        a.get("output_tokens"),
        a.get("output_tokens_persisted", 0),
        a.get("carried_output_tokens", 0),
        a.get("unread_output_tokens", 0),
    )


def summary(
    attempts: Iterable[Mapping[str, Any]],
    *,
    original_input_tokens: int | None = None,
    prices: Prices | None = None,
) -> dict[str, Any]:
    """Totals over a job's ledger: tokens billed and persisted, input replay, money."""
    records = list(attempts)
    kinds = [a.get("kind") for a in records]
    inputs = [a.get("input_tokens") or 0 for a in records]
    billed_out = sum(_billed(a) for a in records)
    persisted = sum(a.get("output_tokens_persisted", 0) for a in records)
    billed_in = sum(inputs)
    cached_in = sum(a.get("cached_input_tokens") or 0 for a in records)
    resume_in = sum(n for n, kind in zip(inputs, kinds, strict=True) if kind == "resume")
    first_in = next((n for n in inputs if n), None)
    base_in = original_input_tokens or first_in
    out: dict[str, Any] = {
        "attempts": len(records),
        "resumes": kinds.count("resume"),
        "retries": kinds.count("retry"),
        "reattaches": kinds.count("reattach"),
        "output_tokens_billed": billed_out,
        "output_tokens_persisted": persisted,
        "regenerated_tokens": sum(a.get("regenerated_tokens", 0) for a in records),
        "input_tokens_billed": billed_in,
        "cached_input_tokens": cached_in,
        "output_counts_complete": all(a.get("output_tokens") is not None for a in records),
        # Whether the billed figures are final: no attempt's bill is only a lower bound.
        "counts_complete": not any(a.get("billed_lower_bound", False) for a in records),
        "input_replay_ratio": None,
    }
    if base_in and resume_in:
        # What resumes re-sent against the most they could have: prompt plus prefix, each.
        ceiling = sum(
            base_in + a.get("prefix_tokens", 0)
            for a, kind in zip(records, kinds, strict=True)
            if kind == "resume"
        )
        out["input_replay_ratio"] = round(resume_in / ceiling, 4)
    if prices is not None:
        cached_price = prices.cached_input if prices.cached_input is not None else prices.input
        out["cost"] = round(
            ((billed_in - cached_in) * prices.input + cached_in * cached_price) / 1e6
            + billed_out * prices.output / 1e6,
            6,
        )
    return out
