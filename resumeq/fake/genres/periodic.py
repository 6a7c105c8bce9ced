"""A short pattern repeated 200 to 300 times, a paragraph, the same pattern again, a
paragraph; then the next pattern. A pattern of letters alone would tokenize as one huge
word, so each has a separator or is not made of letters."""

from __future__ import annotations

from collections.abc import Iterator

from resumeq.fake.genres.draws import Draws

PATTERNS = ("-=", "la ", "ab ", "*-", "01", "=", "na ", "<>", "ho-")


def sections(draws: Draws) -> Iterator[str]:
    while True:
        pattern = draws.choice(PATTERNS)
        for _ in range(2):
            yield pattern * draws.between(200, 300) + "\n\n" + draws.paragraph() + "\n\n"
