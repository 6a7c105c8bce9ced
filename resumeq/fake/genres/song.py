"""Song lyrics: a title, then verses, each followed by the same four-line chorus, verbatim.
The chorus sings its last line twice in a row; a verse sometimes does the same."""

from __future__ import annotations

from collections.abc import Iterator

from resumeq.fake.genres.draws import Draws


def _line(draws: Draws) -> str:
    return draws.words(3, 7).capitalize() + draws.choice(("", "", ",", "!"))


def sections(draws: Draws) -> Iterator[str]:
    chorus_lines = [_line(draws) for _ in range(4)]
    chorus = "[Chorus]\n" + "\n".join([*chorus_lines, chorus_lines[-1]]) + "\n\n"
    yield f"{draws.words(1, 3).title()}\n\n"
    verse = 0
    while True:
        verse += 1
        lines = [_line(draws) for _ in range(4)]
        if draws.chance(3):
            lines.insert(1, lines[0])
        yield f"[Verse {verse}]\n" + "\n".join(lines) + "\n\n" + chorus
