"""Markers a prompt sets in its own text to shape the fake's answer.

``[fake:GENRE]`` picks the genre of the canonical text (:data:`GENRES`; without one it is
prose); ``[fake:reasoning=N]`` makes a request without a continuation think N tokens first;
``[fake:tool]`` asks for one tool call and ``[fake:tools=N]`` (1 to :data:`MAX_TOOL_CALLS`)
for N parallel ones, which a request makes only when it carries tools
(:mod:`resumeq.fake.answer`); ``[fake:refusal]`` makes the model refuse.
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
MAX_TOOL_CALLS = 8

MARKER_RE = re.compile(r"\[fake:([^\]=\s]*)(?:=([^\]\s]*))?\]")


@dataclass(frozen=True)
class Markers:
    genre: Genre = "prose"
    reasoning: int = 0
    #: Tool calls asked for (0: none).
    tool_calls: int = 0
    refusal: bool = False


def _merge(found: dict[str, str], text: str) -> None:
    for match in MARKER_RE.finditer(text):
        name, value = match.group(1), match.group(2)
        if name in ("reasoning", "tools"):
            found.setdefault(name, value or "")
        elif value is None and name in ("tool", "refusal"):
            found.setdefault(name, "")
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
    calls = found.get("tools", "1" if "tool" in found else "0")
    if "tools" in found and not (
        calls.isascii() and calls.isdigit() and 1 <= int(calls) <= MAX_TOOL_CALLS
    ):
        raise ValueError(f"fake provider: [fake:tools=N] takes N from 1 to {MAX_TOOL_CALLS}")
    return Markers(
        genre=_BY_NAME[found.get("genre", "prose")],
        reasoning=int(reasoning),
        tool_calls=int(calls),
        refusal="refusal" in found,
    )
