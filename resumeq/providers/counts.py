"""Reading a count out of a provider's JSON: shared by the wires and the counting endpoints
(:mod:`resumeq.providers.tokenize`), which import nothing else of each other."""

from __future__ import annotations

from typing import Any


def int_or_none(value: Any) -> int | None:
    """A count from a provider's JSON: an int (not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None
