"""Joining a continuation onto the stored prefix. Pure: no I/O, never changes the prefix.

What the seam may need depends on how the request continued (``mode``, SPEC §5):

- **An echo.** Some engines answer a prefill by first repeating the prefix they were sent
  (llama.cpp's server does, in its first delta), and a model asked in ``instruction`` mode
  sometimes writes the whole unfinished text out again. A continuation that begins with
  the text that was sent (``sent``: the whole prefix or the tail that went out) has exactly
  that repeat removed, whatever its length — also when it differs from what was sent in
  white space or Unicode normalisation, and when the stream was cut during the echo.
  ``echo`` says whether the engine does this: ``"yes"``, ``"no"``, or ``"auto"`` — in the
  prefill modes an echo is recognised by the whole sent text arriving at the start of the
  first piece (a model writes a token at a time; an echo arrives at once); in
  ``instruction`` mode by the continuation starting with the whole tail, where that tail
  is long enough, occurs once in the prefix and does not repeat itself.
- **Trimmed white space.** Anthropic refuses a prefill that ends in white space, so the
  prefix is sent trimmed (``trimmed``: what was cut off; the stored prefix still ends with
  it) and the model usually opens with the white space it expects there, perhaps spelt
  otherwise (``"\\n"`` for ``"\\r\\n"``). The seam keeps as many line breaks as the trimmed
  white space or the continuation's leading white space has, whichever has more — never
  both added up — and the indentation of the line that follows.
- **A short repeat** (``instruction`` mode only: the prefill modes continue exactly and
  never repeat beyond an echo). A model asked to continue may restate the last words.
  A start of the continuation that the prefix ends with is dropped only when it is at
  least ``min_overlap`` characters long, begins and ends on word boundaries, and the
  repeated passage occurs nowhere else near the prefix's end — repetitive text (laughter,
  table rows, periodic patterns, a repeated code line) is left alone, because there a
  continuation that repeats is what the text does.

:class:`Splicer` does this on a stream: it holds text back only while it could still turn
out to be an echo, re-spelt white space or a repeat, then passes everything through. It
also carries each piece's output tokens through, so that the tokens of pieces that were
wholly echo (prompt text, never billed as output) are not counted.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field
from typing import Literal

ContinueMode = Literal["prefill", "prefill_flag", "continue_final_message", "instruction"]
EchoPolicy = Literal["auto", "yes", "no"]

#: Modes in which the engine continues the prefix exactly: nothing but an echo is trimmed.
EXACT_MODES: frozenset[str] = frozenset({"prefill", "prefill_flag", "continue_final_message"})

#: ``instruction`` mode: a repeat shorter than this many characters is taken for text.
DEFAULT_MIN_OVERLAP = 16
#: How far back into the prefix a short repeat is looked for.
DEFAULT_WINDOW = 2_000
#: An echo of only the start of what was sent is removed when at least this long (and the
#: engine is known to echo), or when the stream ended during it.
PARTIAL_ECHO_MIN = 32

_LINE_BREAK = re.compile(r"\r\n|[\n\r\v\f\x1c-\x1e\x85\u2028\u2029]")


def leading_whitespace(text: str) -> str:
    return text[: len(text) - len(text.lstrip())]


def trailing_whitespace(text: str) -> str:
    return text[len(text.rstrip()) :]


def line_breaks(text: str) -> int:
    """Line breaks in ``text``; ``"\\r\\n"`` is one."""
    return len(_LINE_BREAK.findall(text))


def _after_breaks(text: str, n: int) -> str:
    """``text`` after its first ``n`` line breaks (all of it for ``n == 0``)."""
    end = 0
    for i, m in enumerate(_LINE_BREAK.finditer(text)):
        if i == n:
            break
        end = m.end()
    return text[end:] if n else text


def _last_line(text: str) -> str:
    """What follows the last line break of ``text`` (all of it if there is none)."""
    return _after_breaks(text, line_breaks(text))


def seam_whitespace(trimmed: str, lead: str) -> str:
    """What to append of the continuation's leading white space ``lead`` after the stored
    ``trimmed`` white space: a suffix of ``lead`` such that the seam holds as many line
    breaks as the one of the two with more, and the longer indentation of the next line."""
    if lead.startswith(trimmed):
        return lead[len(trimmed) :]  # the model wrote what was trimmed again, then more
    have, want = line_breaks(trimmed), line_breaks(lead)
    if want > have:
        kept = _after_breaks(lead, have)
    else:
        indent, stored = _last_line(lead), _last_line(trimmed)
        kept = indent[len(stored) :] if len(indent) > len(stored) else ""
    # A stored "\r" and a "\n" after it read as one line break: take more of ``lead``.
    while line_breaks(trimmed + kept) < max(have, want) and len(kept) < len(lead):
        kept = lead[len(lead) - len(kept) - 1 :]
    return kept


def shown_whitespace(stored: str, lead: str) -> str:
    """``instruction`` mode: what to append of the continuation's leading white space
    ``lead`` after the prefix's trailing white space ``stored``, which the model was shown.
    Line breaks it writes again are not doubled (the seam keeps the larger count), nor are
    spaces within a line; spaces after a line break go on with that line's indentation."""
    if not line_breaks(lead) and line_breaks(stored):
        return lead
    return seam_whitespace(stored, lead)


def drop_repeated_whitespace(continuation: str, trimmed: str) -> str:
    """The continuation with its leading white space reconciled with ``trimmed``."""
    lead = leading_whitespace(continuation)
    return seam_whitespace(trimmed, lead) + continuation[len(lead) :]


def smallest_period(text: str) -> int:
    """The smallest ``p`` with ``text[p:] == text[:-p]`` (``len(text)`` if none)."""
    n = len(text)
    fail = [0] * (n + 1)
    fail[0] = -1
    k = -1
    for i in range(n):
        while k >= 0 and text[k] != text[i]:
            k = fail[k]
        k += 1
        fail[i + 1] = k
    return n - fail[n] if n else 0


def _word(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


def _plausible_repeat(prefix: str, continuation: str, k: int) -> bool:
    """Whether the continuation's first ``k`` characters, which the prefix ends with, look
    like a model restating the end of the text rather than the text going on."""
    start = len(prefix) - k
    if start > 0 and _word(prefix[start - 1]) and _word(prefix[start]):
        return False  # starts inside a word
    if k < len(continuation) and _word(continuation[k - 1]) and _word(continuation[k]):
        return False  # what follows would glue onto a cut word
    passage = prefix[start:]
    core = passage.strip() or passage
    if prefix.find(core) < start + len(passage) - len(passage.lstrip()):
        return False  # the text already repeats this passage
    return smallest_period(passage) > k // 2  # a pattern repeating itself goes on


def overlap(prefix: str, continuation: str, *, min_overlap: int, window: int) -> int:
    """Length of the longest start of ``continuation`` that the prefix ends with, at most
    ``window`` long, that is a plausible repeat (see the module docstring), if at least
    ``min_overlap``; else 0."""
    longest = min(len(prefix), len(continuation), window)
    for k in range(longest, min_overlap - 1, -1):
        if prefix.endswith(continuation[:k]) and _plausible_repeat(prefix, continuation, k):
            return k
    return 0


# -- matching an echo --------------------------------------------------------------------


def _segment_end(text: str, i: int) -> int:
    """End of the character at ``i`` with the combining marks that follow it."""
    i += 1
    while i < len(text) and unicodedata.combining(text[i]):
        i += 1
    return i


def _space_end(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i


def _segment_start(text: str, i: int) -> int:
    while i > 0 and (unicodedata.combining(text[i]) if i < len(text) else False):
        i -= 1
    return i


EchoState = Literal["complete", "more", "diverged"]


class EchoMatch:
    """Matches the start of a continuation against the text that was sent, allowing runs
    of white space to differ and characters to differ in Unicode normalisation (NFC).
    Incremental: each :meth:`advance` resumes where the last one stopped."""

    def __init__(self, sent: str) -> None:
        self.sent = sent
        #: Characters of ``sent`` matched, and of the continuation that match them.
        self.i = 0
        self.j = 0
        #: Whether the match needed white space or normalisation to differ.
        self.normalised = False

    def advance(self, head: str, *, final: bool) -> EchoState:
        sent = self.sent
        while True:
            if self.i == len(sent):
                return "complete"
            if self.j == len(head):
                return "diverged" if final else "more"
            self._exact_run(head)
            if self.i == len(sent):
                return "complete"
            if self.j == len(head):
                continue
            state = self._normalised_step(head, final=final)
            if state is not None:
                return state

    def _exact_run(self, head: str) -> None:
        sent, i, j = self.sent, self.i, self.j
        n = min(len(sent) - i, len(head) - j)
        step = 256
        k = 0
        while k < n:
            m = min(step, n - k)
            if sent[i + k : i + k + m] == head[j + k : j + k + m]:
                k += m
                continue
            while sent[i + k] == head[j + k]:
                k += 1
            break
        self.i, self.j = i + k, j + k

    def _normalised_step(  # noqa: PLR0911 - one answer per way a unit can end
        self, head: str, *, final: bool
    ) -> EchoState | None:
        """One unit past a mismatch: a white space run, or a character with its marks.
        Backs up to the unit's start first (the exact run may have matched half of it)."""
        sent = self.sent
        i, j = self.i, self.j
        if sent[i].isspace() or head[j].isspace():
            # Inside a run of white space the exact run may have matched its start.
            while i > 0 and j > 0 and sent[i - 1].isspace() and head[j - 1].isspace():
                i, j = i - 1, j - 1
        else:
            # A combining mark: back to the character it belongs to.
            back = min(i - _segment_start(sent, i), j - _segment_start(head, j))
            i, j = i - back, j - back
        s_space = sent[i].isspace()
        h_space = j < len(head) and head[j].isspace()
        if s_space or h_space:
            i2, j2 = _space_end(sent, i), _space_end(head, j)
            if j2 == len(head) and not final:
                return "more"  # the run may go on in the next piece
            if i2 == len(sent):
                self.i, self.j, self.normalised = i2, j2, True
                return "complete"  # trailing white space of what was sent is optional
            if i2 == i or j2 == j:
                return "diverged"
            self.i, self.j, self.normalised = i2, j2, True
            return None
        i2, j2 = _segment_end(sent, i), _segment_end(head, j)
        if j2 == len(head) and not final:
            return "more"  # combining marks may follow in the next piece
        a, b = sent[i:i2], head[j:j2]
        if unicodedata.normalize("NFC", a) != unicodedata.normalize("NFC", b):
            return "diverged"
        self.i, self.j, self.normalised = i2, j2, True
        return None


# -- the splicer -------------------------------------------------------------------------


@dataclass(frozen=True)
class SpliceReport:
    """What the seam needed."""

    whitespace_dropped: int = 0
    overlap_dropped: int = 0
    #: Characters of echo removed from the continuation's start, and how it matched:
    #: ``exact``, ``normalised`` (white space or Unicode normalisation differed) or
    #: ``partial`` (only the start of what was sent); "" for none.
    echo_dropped: int = 0
    echo: str = ""
    #: Of the dropped echo, the characters the engine did not generate (the prefill modes
    #: repeat the prompt: no output), and the pieces that were such an echo and nothing
    #: else. A model that rewrites its tail in ``instruction`` mode generated it: billed.
    echo_unbilled: int = 0
    echo_pieces: int = 0
    #: What a person reading the log should know about this seam.
    notes: tuple[str, ...] = field(default_factory=tuple)


Phase = Literal["echo", "seam", "overlap", "pass"]


class Splicer:
    """Splice a continuation that arrives in pieces.

    ``feed`` answers the text that may be appended now; ``finish`` answers what was held
    back. The concatenation of the answers equals :func:`splice` of the whole text — save
    for ``echo = "auto"`` in the prefill modes, which looks at how the first piece came.
    ``feed(piece, tokens)`` also takes the piece's output tokens; :meth:`take_tokens`
    answers those released since it was last called (tokens of a piece held back are
    released with it; those of pieces that were wholly an engine's echo of the prompt
    never are).

    White space at the seam is reconciled with ``trimmed`` (the prefill modes) or, in
    ``instruction`` mode, with the prefix's own trailing white space: the model sees the
    tail and may open with white space it already ends with.
    """

    def __init__(
        self,
        prefix: str,
        *,
        sent: str | None = None,
        trimmed: str = "",
        mode: ContinueMode = "instruction",
        echo: EchoPolicy = "auto",
        min_overlap: int = DEFAULT_MIN_OVERLAP,
        window: int = DEFAULT_WINDOW,
    ) -> None:
        if trimmed and not prefix.endswith(trimmed):
            raise ValueError("trimmed must be the end of the prefix")
        if min_overlap < 1:
            raise ValueError("min_overlap must be >= 1")
        body = prefix[: len(prefix) - len(trimmed)]
        if sent is None:
            sent = body
        elif not body.endswith(sent):
            raise ValueError("sent must be the end of the prefix (before what was trimmed)")
        self._prefix = prefix
        self._sent = sent
        self._trimmed = trimmed
        self._seam_ws = trimmed or (trailing_whitespace(prefix) if mode not in EXACT_MODES else "")
        self._mode = mode
        self._policy = echo
        self._min_overlap = min_overlap
        self._window = window
        # White space alone is no evidence of anything: an echo must carry some text.
        echoable = bool(sent.strip()) and echo != "no"
        self._phase: Phase = "echo" if echoable else "seam"
        if not prefix:
            self._phase = "pass"
        self._match = EchoMatch(sent)
        self._pieces = 0
        self._held = ""
        #: (start, end) in the held text and the tokens of each piece held back.
        self._held_pieces: list[tuple[int, int, int]] = []
        self._released_tokens = 0
        self._echo_active: bool | None = None if echo == "auto" else echo == "yes"
        self._whitespace_dropped = 0
        self._overlap_dropped = 0
        self._echo_dropped = 0
        self._echo_kind = ""
        self._echo_pieces = 0
        self._notes: list[str] = []

    @property
    def report(self) -> SpliceReport:
        return SpliceReport(
            whitespace_dropped=self._whitespace_dropped,
            overlap_dropped=self._overlap_dropped,
            echo_dropped=self._echo_dropped,
            echo=self._echo_kind,
            echo_unbilled=self._echo_dropped if self._mode in EXACT_MODES else 0,
            echo_pieces=self._echo_pieces,
            notes=tuple(self._notes),
        )

    @property
    def passing(self) -> bool:
        """Whether the seam is settled: all text fed so far is released, and what follows
        passes through as it comes."""
        return self._phase == "pass"

    @property
    def held(self) -> str:
        """Text received but not yet released."""
        return self._held

    def take_tokens(self) -> int:
        """Output tokens of the pieces released since the last call."""
        tokens, self._released_tokens = self._released_tokens, 0
        return tokens

    def feed(self, piece: str, tokens: int = 0) -> str:
        if self._phase == "pass":
            self._released_tokens += tokens
            return piece
        first = self._pieces == 0 and bool(piece)
        self._pieces += bool(piece)
        if piece or tokens:
            self._held_pieces.append((len(self._held), len(self._held) + len(piece), tokens))
        self._held += piece
        if first and self._echo_active is None:
            self._echo_active = self._auto_echo(piece)
        return self._run(final=False)

    def finish(self) -> str:
        if self._phase == "pass":
            return ""
        return self._run(final=True)

    # -- phases --------------------------------------------------------------------------

    def _run(self, *, final: bool) -> str:
        if self._phase == "echo" and not self._echo_phase(final=final):
            return ""
        if self._phase == "seam" and not self._seam_phase(final=final):
            return ""
        if self._phase == "overlap" and not self._overlap_phase(final=final):
            return ""
        return self._release_all()

    def _auto_echo(self, first: str) -> bool:
        """``echo = "auto"``: whether to look for an echo, from the first piece."""
        if self._mode in EXACT_MODES:
            probe = EchoMatch(self._sent)
            # A model writes a token at a time: the whole sent text at once is an echo.
            return probe.advance(first, final=False) == "complete"
        sent = self._sent
        return (
            len(sent) >= self._min_overlap
            and self._prefix.find(sent) == len(self._prefix) - len(self._trimmed) - len(sent)
            and smallest_period(sent) == len(sent)
        )

    def _echo_phase(self, *, final: bool) -> bool:
        """Answers whether the phase is over (the held text may go on to the next)."""
        if not self._echo_active:
            self._phase = "seam"
            return True
        state = self._match.advance(self._held, final=final)
        if state == "more":
            return False
        matched = self._match.j
        sent_len = len(self._sent)
        if state == "complete":
            kind = "normalised" if self._match.normalised else "exact"
            self._drop_echo(matched, kind)
            how = " (white space or Unicode normalisation differed)" if kind == "normalised" else ""
            self._note(
                f"the continuation began by repeating the {sent_len}-character prefix it was "
                f"sent{how}: the repeat was dropped"
            )
        elif matched and (matched >= PARTIAL_ECHO_MIN or (final and matched == len(self._held))):
            if matched < len(self._held):
                # Where the echo stops and the text goes on, white space belongs to the text.
                matched = len(self._held[:matched].rstrip()) or matched
            if final and matched == len(self._held):
                self._note(
                    f"the stream ended {matched} characters into an echo of the "
                    f"{sent_len}-character prefix: the echo was dropped"
                )
            else:
                self._note(
                    f"the continuation repeated only the first {matched} of the {sent_len} "
                    "characters it was sent: that partial echo was dropped"
                )
            self._drop_echo(matched, "partial")
        elif self._policy == "yes":
            self._note("prefill_echo is yes but the continuation did not repeat the prefix")
        self._phase = "seam"
        return True

    def _drop_echo(self, n: int, kind: str) -> None:
        self._echo_dropped, self._echo_kind = n, kind
        self._held = self._held[n:]
        if self._mode not in EXACT_MODES:
            return  # the model wrote it: its tokens were generated, and count
        echo = [p for p in self._held_pieces if p[1] <= n]
        self._echo_pieces = sum(1 for start, end, _ in echo if end > start)
        self._held_pieces = [
            (max(0, start - n), end - n, tokens)
            for start, end, tokens in self._held_pieces[len(echo) :]
        ]

    def _seam_phase(self, *, final: bool) -> bool:
        if self._seam_ws:
            lead = leading_whitespace(self._held)
            if len(lead) == len(self._held) and not final:
                return False  # the white space may go on
            reconcile = seam_whitespace if self._trimmed else shown_whitespace
            kept = reconcile(self._seam_ws, lead)
            self._whitespace_dropped = len(lead) - len(kept)
            self._held = kept + self._held[len(lead) :]  # piece offsets are not used again
        use_overlap = self._mode not in EXACT_MODES and not self._echo_dropped
        self._phase = "overlap" if use_overlap else "pass"
        return True

    def _overlap_phase(self, *, final: bool) -> bool:
        tail = self._prefix[-self._window :]
        if not final and len(self._held) < len(tail) and self._held in tail:
            return False  # a repeat longer than what is held is still possible
        k = overlap(self._prefix, self._held, min_overlap=self._min_overlap, window=self._window)
        if k and k == len(self._held) and not final:
            return False  # whether it glues onto a cut word is told by what comes next
        if k:
            self._note(f"the continuation restated the prefix's last {k} characters: dropped")
            self._overlap_dropped = k
            self._held = self._held[k:]
        self._phase = "pass"
        return True

    def _release_all(self) -> str:
        out, self._held = self._held, ""
        self._released_tokens += sum(tokens for _, _, tokens in self._held_pieces)
        self._held_pieces = []
        self._phase = "pass"
        return out

    def _note(self, text: str) -> None:
        self._notes.append(text)


def splice(
    prefix: str,
    continuation: str,
    *,
    sent: str | None = None,
    trimmed: str = "",
    mode: ContinueMode = "instruction",
    echo: EchoPolicy = "auto",
    min_overlap: int = DEFAULT_MIN_OVERLAP,
    window: int = DEFAULT_WINDOW,
) -> tuple[str, SpliceReport]:
    """Answer what to append to ``prefix`` for a whole continuation, and what was dropped.

    ``sent`` is the prefix text as the request carried it (default: the whole prefix
    without ``trimmed``); ``trimmed`` is the white space cut off the prefix's end before it
    was sent (the stored prefix still ends with it).
    """
    s = Splicer(
        prefix,
        sent=sent,
        trimmed=trimmed,
        mode=mode,
        echo=echo,
        min_overlap=min_overlap,
        window=window,
    )
    out = s.feed(continuation) + s.finish()
    return out, s.report
