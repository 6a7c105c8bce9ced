"""Lists: a numbered list, then a bulleted one with nested bullets, each under a heading
line. Items come from a pool of five, so the same item recurs, sometimes back to back."""

from __future__ import annotations

from collections.abc import Iterator

from resumeq.fake.genres.draws import Draws


def _items(draws: Draws, low: int, high: int) -> list[str]:
    pool = [draws.words(2, 6).capitalize() for _ in range(5)]
    items = [draws.choice(pool)]
    for _ in range(draws.between(low, high) - 1):
        items.append(items[-1] if draws.chance(5) else draws.choice(pool))
    return items


def numbered(draws: Draws) -> str:
    items = _items(draws, 6, 12)
    return "".join(f"{number}. {item}\n" for number, item in enumerate(items, 1))


def bulleted(draws: Draws) -> str:
    lines = []
    for item in _items(draws, 5, 10):
        lines.append(f"- {item}\n")
        if draws.chance(4):
            lines.append(f"  - {draws.words(2, 4)}\n")
    return "".join(lines)


def sections(draws: Draws) -> Iterator[str]:
    while True:
        yield draws.sentence(2, 4, ":") + "\n\n" + numbered(draws) + "\n"
        yield draws.sentence(2, 4, ":") + "\n\n" + bulleted(draws) + "\n"
