"""The fake provider's deterministic text: vocabulary, tokenizer and canonical prose (the genre
without a marker; the others are :mod:`resumeq.fake.genres`).

Every canonical token is one piece the tokenizer also produces when it splits the canonical
text (a word with its leading space, a capitalised word at the start of a paragraph, ``,``,
``.``, ``\\n\\n``), so ``count_tokens`` over any token-aligned prefix of a canonical text equals
the number of tokens that were streamed for it. No three consecutive tokens repeat within
one completion, so any run of three or more tokens occurs once.
"""

from __future__ import annotations

import functools
import hashlib
import re
import zlib

VOCABULARY_SIZE = 2000
MIN_DEFAULT_TOKENS = 200
MAX_DEFAULT_TOKENS = 400

# Every character falls in exactly one alternative, so the pieces always join back to the text.
TOKEN_RE = re.compile(r" ?[^\W\d_]+| ?\d{1,3}|\n+|[^\S\n]|[^\w\s]|_")

_ONSETS = (
    *("b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w"),
    *("br", "ch", "cl", "dr", "fl", "gr", "pl", "pr", "sh", "sk", "st", "th", "tr"),
)
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ea", "io", "ou", "y")
_CODAS = ("", "", "", "n", "r", "s", "l", "m", "nd", "st", "rk", "ng")


def draw(seed: bytes, *parts: int) -> int:
    """64 bits from the seed and the parts, the same on every run and Python version."""
    digest = hashlib.blake2b(seed, digest_size=8)
    for part in parts:
        digest.update(part.to_bytes(8, "little", signed=False))
    return int.from_bytes(digest.digest(), "little")


def _build_vocabulary() -> tuple[str, ...]:
    words: dict[str, None] = {}
    attempt = 0
    while len(words) < VOCABULARY_SIZE:
        value = draw(b"resumeq-fake-vocabulary", attempt)
        attempt += 1
        syllables = 1 + value % 3
        value //= 3
        word = ""
        for _ in range(syllables):
            word += _ONSETS[value % len(_ONSETS)]
            value //= len(_ONSETS)
            word += _VOWELS[value % len(_VOWELS)]
            value //= len(_VOWELS)
        word += _CODAS[value % len(_CODAS)]
        if len(word) >= 2:
            words[word] = None
    return tuple(words)


VOCABULARY: tuple[str, ...] = _build_vocabulary()


def tokenize(text: str) -> list[str]:
    """Split ``text`` into the fake provider's tokens; ``"".join(tokenize(t)) == t``."""
    return TOKEN_RE.findall(text)


def count_tokens(text: str) -> int:
    return sum(1 for _ in TOKEN_RE.finditer(text))


def token_id(token: str) -> int:
    """A stable integer id for a token string (what ``/tokenize`` reports)."""
    return zlib.crc32(token.encode("utf-8"))


def default_length(seed: bytes) -> int:
    """The canonical length when none is configured: 200 to 400 tokens, from the seed."""
    span = MAX_DEFAULT_TOKENS - MIN_DEFAULT_TOKENS + 1
    return MIN_DEFAULT_TOKENS + draw(seed, 0xFFFF_FFFF) % span


class _Generator:
    """Sentences of 6-17 words, an occasional comma, paragraphs of 2-4 sentences."""

    def __init__(self, seed: bytes) -> None:
        self.seed = seed
        self.tokens: list[str] = []
        self.seen: set[tuple[str, str, str]] = set()
        self.words_in_sentence = 0
        self.sentence_target = 0
        self.sentences_in_paragraph = 0
        self.paragraph_target = 0
        self.line_start = True
        self.after_period = False
        self._new_sentence()
        self._new_paragraph()

    def _new_sentence(self) -> None:
        self.words_in_sentence = 0
        self.sentence_target = 6 + draw(self.seed, len(self.tokens), 1) % 12

    def _new_paragraph(self) -> None:
        self.sentences_in_paragraph = 0
        self.paragraph_target = 2 + draw(self.seed, len(self.tokens), 2) % 3

    def _word(self, attempt: int) -> str:
        word = VOCABULARY[draw(self.seed, len(self.tokens), 3, attempt) % len(VOCABULARY)]
        if self.line_start:
            return word.capitalize()
        if self.after_period:
            return " " + word.capitalize()
        return " " + word

    def _preferred(self) -> str | None:
        """The punctuation the structure asks for here, or None for a word."""
        if self.after_period:
            if self.sentences_in_paragraph >= self.paragraph_target:
                return "\n\n"
            return None
        if self.line_start or self.words_in_sentence == 0:
            return None
        if self.words_in_sentence >= self.sentence_target:
            return "."
        comma_ok = 3 <= self.words_in_sentence < self.sentence_target - 1
        if comma_ok and self.tokens[-1] != "," and draw(self.seed, len(self.tokens), 4) % 9 == 0:
            return ","
        return None

    def _fresh(self, token: str) -> bool:
        if len(self.tokens) < 2:
            return True
        return (self.tokens[-2], self.tokens[-1], token) not in self.seen

    def step(self) -> None:
        token = self._preferred()
        if token is None or not self._fresh(token):
            for attempt in range(64):
                token = self._word(attempt)
                if self._fresh(token):
                    break
        assert token is not None
        self._accept(token)

    def _accept(self, token: str) -> None:
        if len(self.tokens) >= 2:
            self.seen.add((self.tokens[-2], self.tokens[-1], token))
        self.tokens.append(token)
        if token == ".":
            self.after_period = True
            self.sentences_in_paragraph += 1
            self._new_sentence()
        elif token == "\n\n":
            self.after_period = False
            self.line_start = True
            self._new_paragraph()
        elif token != ",":
            self.after_period = False
            self.line_start = False
            self.words_in_sentence += 1


@functools.lru_cache(maxsize=64)
def canonical_tokens(seed: bytes, length: int) -> tuple[str, ...]:
    """The first ``length`` tokens of the canonical completion for ``seed``."""
    generator = _Generator(seed)
    for _ in range(length):
        generator.step()
    return tuple(generator.tokens)
