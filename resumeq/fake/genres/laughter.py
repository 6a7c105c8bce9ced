"""Laughter between short sentences: runs of ``ha ha ha`` and ``hahaha`` of 2 to 12 beats."""

from __future__ import annotations

from collections.abc import Iterator

from resumeq.fake.genres.draws import Draws


def _laugh(draws: Draws) -> str:
    beats = draws.between(2, 12)
    shape = draws.below(4)
    joined = "Ha" + "ha" * (beats - 1)
    if shape == 0:
        return joined + "!"
    if shape == 1:
        return joined.upper() + "!"
    return "Ha" + " ha" * (beats - 1) + draws.choice((".", "!", "..."))


def sections(draws: Draws) -> Iterator[str]:
    while True:
        parts = [draws.sentence(3, 6, draws.choice((".", "!", "?")))]
        for _ in range(draws.between(1, 3)):
            parts.append(_laugh(draws))
            parts.append(draws.sentence(2, 5))
        yield " ".join(parts) + draws.choice((" ", " ", "\n\n"))
