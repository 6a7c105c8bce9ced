"""Canonical texts that repeat themselves, as real models' answers do (``[fake:GENRE]``).

Each genre is an endless series of sections drawn from the seed; its canonical tokens are
``tokenize`` of the first sections, cut to the length. So the tokens are exactly what the
tokenizer sees, every token-aligned prefix tokenizes to the tokens streamed for it, and a
longer completion extends a shorter one. Unlike prose (:mod:`resumeq.fake.text`), runs of
tokens do recur: a continuation sent as a tail can be ambiguous here, while one whose prefix
is the start of the canonical text never is.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator

from resumeq.fake.genres import (
    code,
    html,
    laughter,
    listing,
    mixed,
    periodic,
    song,
    table,
    unicode,
)
from resumeq.fake.genres.draws import Draws
from resumeq.fake.markers import Genre
from resumeq.fake.text import canonical_tokens, default_length, draw, tokenize

Sections = Callable[[Draws], Iterator[str]]

#: Each genre's sections and its default length range in tokens, long enough for the
#: repetition it stands for to occur.
SECTIONS: dict[Genre, tuple[Sections, int, int]] = {
    "code": (code.sections, 500, 800),
    "table": (table.sections, 600, 900),
    "song": (song.sections, 400, 600),
    "laughter": (laughter.sections, 300, 500),
    "periodic": (periodic.sections, 1400, 1800),
    "list": (listing.sections, 400, 600),
    "unicode": (unicode.sections, 400, 600),
    "mixed": (mixed.sections, 1000, 1300),
    "html": (html.sections, 400, 700),
}


def genre_length(genre: Genre, seed: bytes) -> int:
    """The canonical length when none is configured, from the seed."""
    if genre == "prose":
        return default_length(seed)
    _, low, high = SECTIONS[genre]
    return low + draw(seed, 0xFFFF_FFFE) % (high - low + 1)


@functools.lru_cache(maxsize=64)
def genre_tokens(genre: Genre, seed: bytes, length: int) -> tuple[str, ...]:
    """The first ``length`` tokens of the canonical completion of ``genre`` for ``seed``."""
    if genre == "prose":
        return canonical_tokens(seed, length)
    sections, _, _ = SECTIONS[genre]
    source = sections(Draws(seed, genre))
    parts: list[str] = []
    chars, want = 0, 4 * length
    while True:
        while chars < want:
            parts.append(next(source))
            chars += len(parts[-1])
        tokens = tokenize("".join(parts))
        # The last token could still grow with the next section; the ones before it cannot.
        if len(tokens) > length:
            return tuple(tokens[:length])
        want *= 2
