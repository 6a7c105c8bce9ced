"""Deterministic choices for the genres: one numbered sequence of draws per seed and genre."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TypeVar

from resumeq.fake.text import VOCABULARY, draw

T = TypeVar("T")


class Draws:
    """The n-th call draws from ``(seed, salt, n)``: the same text on every run."""

    def __init__(self, seed: bytes, salt: str) -> None:
        self._seed = hashlib.blake2b(seed + salt.encode(), digest_size=16).digest()
        self._count = 0

    def below(self, bound: int) -> int:
        self._count += 1
        return draw(self._seed, self._count) % bound

    def between(self, low: int, high: int) -> int:
        """An integer from ``low`` to ``high`` inclusive."""
        return low + self.below(high - low + 1)

    def chance(self, one_in: int) -> bool:
        return self.below(one_in) == 0

    def choice(self, items: Sequence[T]) -> T:
        return items[self.below(len(items))]

    def word(self) -> str:
        return self.choice(VOCABULARY)

    def words(self, low: int, high: int) -> str:
        """``low`` to ``high`` vocabulary words joined by spaces."""
        return " ".join(self.word() for _ in range(self.between(low, high)))

    def sentence(self, low: int = 4, high: int = 9, end: str = ".") -> str:
        """A capitalised sentence of ``low`` to ``high`` words."""
        return self.words(low, high).capitalize() + end

    def paragraph(self, low: int = 2, high: int = 4) -> str:
        return " ".join(self.sentence(5, 12) for _ in range(self.between(low, high)))
