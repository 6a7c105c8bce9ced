"""Text that breaks byte- and code-point-naive code: emoji with skin tones and ZWJ
sequences, flags (regional indicator pairs), CJK, Arabic and Hebrew, decomposed accents
(a letter then a combining mark), no-break spaces, zero-width (non-)joiners, and ``\\r\\n``
line endings. The first line holds one of each; later lines mix them at random."""

from __future__ import annotations

from collections.abc import Iterator

from resumeq.fake.genres.draws import Draws

ZWJ = "\u200d"
NBSP = "\u00a0"
CRLF = "\r\n"

KINDS: dict[str, tuple[str, ...]] = {
    "emoji": ("\U0001f600", "\U0001f389", "\U0001f680", "\u2764\ufe0f", "\U0001f525"),
    "skin_tone": ("\U0001f44d\U0001f3fd", "\U0001f44b\U0001f3fb", "\U0001f64f\U0001f3ff"),
    "zwj_sequence": (
        f"\U0001f468{ZWJ}\U0001f469{ZWJ}\U0001f467",
        f"\U0001f3f3\ufe0f{ZWJ}\U0001f308",
        f"\U0001f469\U0001f3fd{ZWJ}\U0001f4bb",
    ),
    "flag": ("\U0001f1ef\U0001f1f5", "\U0001f1eb\U0001f1f7", "\U0001f1e7\U0001f1f7"),
    "cjk": ("日本語の文章", "你好世界", "東京タワー", "한국어 문장"),
    "arabic": ("مرحبا بالعالم", "شكرا جزيلا"),
    "hebrew": ("שלום עולם", "תודה רבה"),
    "combining": ("cafe\u0301", "nin\u0303o", "re\u0301sume\u0301", "u\u0308ber"),
    "nbsp": (f"100{NBSP}km", f"M.{NBSP}Dupont", f"5{NBSP}%"),
    "zero_width": (f"\u0915\u094d{ZWJ}\u0937", "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645"),
}


def _line(draws: Draws, kinds: list[str]) -> str:
    parts = [draws.word().capitalize()]
    for kind in kinds:
        parts.append(draws.choice(KINDS[kind]))
        parts.append(draws.word())
    return " ".join(parts) + "." + CRLF


def sections(draws: Draws) -> Iterator[str]:
    yield _line(draws, list(KINDS))
    names = list(KINDS)
    while True:
        line = _line(draws, [draws.choice(names) for _ in range(draws.between(1, 4))])
        yield line + (CRLF if draws.chance(4) else "")
