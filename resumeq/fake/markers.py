"""Markers a prompt sets in its own text to shape the fake's answer.

``[fake:GENRE]`` picks the genre of the canonical text (:data:`GENRES`; without one it is
prose); ``[fake:reasoning=N]`` makes a request without a continuation think N tokens first.
Markers count in the system text and the last original user message, the same texts the
canonical text is seeded from; the user message's marker wins over the system's. An unknown
``[fake:...]`` marker is refused rather than ignored, so a typo does not pass for prose.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, get_args

Genre = Literal[
    "prose", "code", "table", "song", "laughter", "periodic", "list", "unicode", "mixed", "html"
]
GENRES: tuple[Genre, ...] = get_args(Genre)
_BY_NAME: dict[str, Genre] = {genre: genre for genre in GENRES}
MAX_REASONING_TOKENS = 100_000

MARKER_RE = re.compile(r"\[fake:([^\]=\s]*)(?:=([^\]\s]*))?\]")


@dataclass(frozen=True)
class Markers:
    genre: Genre = "prose"
    reasoning: int = 0


def _merge(found: dict[str, str], text: str) -> None:
    for match in MARKER_RE.finditer(text):
        name, value = match.group(1), match.group(2)
        if name == "reasoning":
            found.setdefault("reasoning", value or "")
        elif value is None and name in _BY_NAME and name != "prose":
            found.setdefault("genre", name)
        else:
            raise ValueError(f"fake provider: unknown marker {match.group(0)!r}")


def markers_of(user: str, system: str) -> Markers:
    """The markers of a prompt; raises ValueError for a marker that is not one of them."""
    found: dict[str, str] = {}
    _merge(found, user)
    _merge(found, system)
    reasoning = found.get("reasoning", "0")
    if not (reasoning.isascii() and reasoning.isdigit()) or int(reasoning) > MAX_REASONING_TOKENS:
        raise ValueError(
            f"fake provider: [fake:reasoning=N] takes N from 0 to {MAX_REASONING_TOKENS}"
        )
    return Markers(genre=_BY_NAME[found.get("genre", "prose")], reasoning=int(reasoning))
