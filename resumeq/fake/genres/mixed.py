"""One long answer in the shape models give: an opening paragraph, a fenced code block, a
table, a numbered and a bulleted list, a closing paragraph, then the opening paragraph again
verbatim ("To sum up: ..."). Rounds of the same shape follow, each repeating its own opening.
"""

from __future__ import annotations

from collections.abc import Iterator

from resumeq.fake.genres import code, listing, table
from resumeq.fake.genres.draws import Draws

FENCE = "```"


def _code_block(draws: Draws) -> str:
    lines = [*code.function(draws), "", *code.function(draws)]
    return f"{FENCE}python\n" + "\n".join(lines) + f"\n{FENCE}\n\n"


def sections(draws: Draws) -> Iterator[str]:
    while True:
        opening = draws.paragraph(3, 4)
        yield opening + "\n\n"
        yield draws.sentence() + "\n\n" + _code_block(draws)
        yield draws.sentence() + "\n\n" + table.table(draws, 6, 10) + "\n"
        yield draws.sentence(2, 4, ":") + "\n\n" + listing.numbered(draws) + "\n"
        yield listing.bulleted(draws) + "\n"
        yield draws.paragraph() + "\n\n"
        yield "To sum up: " + opening + "\n\n"
