"""Markdown tables: a header, a ``|---|`` separator, then 20 to 40 rows drawn from a pool of
six, so rows recur, often back to back. A sentence separates one table from the next."""

from __future__ import annotations

from collections.abc import Iterator

from resumeq.fake.genres.draws import Draws

COLUMNS = ("Name", "Region", "Count", "Status")
STATUSES = ("ok", "pending", "failed", "ok")


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |\n"


def table(draws: Draws, low: int = 20, high: int = 40) -> str:
    header = _row(list(COLUMNS))
    separator = "|" + "|".join("-" * (len(name) + 2) for name in COLUMNS) + "|\n"
    pool = [
        _row([draws.word(), draws.word(), str(draws.between(1, 999)), draws.choice(STATUSES)])
        for _ in range(6)
    ]
    rows = [draws.choice(pool)]
    for _ in range(draws.between(low, high) - 1):
        rows.append(rows[-1] if draws.chance(4) else draws.choice(pool))
    return header + separator + "".join(rows)


def sections(draws: Draws) -> Iterator[str]:
    while True:
        yield draws.sentence() + "\n\n" + table(draws) + "\n"
