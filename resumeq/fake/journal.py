"""The request journal behind ``GET /_fake/requests``: every provider request and what it got.

Admin requests (``/_fake/...``) are not journalled. An exchange is journalled when it arrives
and updated while it streams, so a stalled stream shows what it sent so far.

``tokens_emitted`` and ``output_tokens_billed`` count every output token sent, reasoning
included (``reasoning_tokens`` of them), a cut stream's too; for a non-streaming request cut by
a fault ``output_tokens_billed`` counts the tokens generated before the fault. ``text`` is the
answer's text as generated; ``echo_chars`` is the length of the prefill the engine repeats in
front of it (``prefill_echo``, sent with the first generated token), not output, not billed.
``input_tokens_billed`` is the whole prompt, cached part included (OpenAI ``prompt_tokens``;
Anthropic ``input_tokens + cache_read_input_tokens + cache_creation_input_tokens``); counting
endpoints and refused requests bill nothing. ``fault`` is the fault applied, with its ``source``:
``queue`` (``/_fake/faults``) or ``chaos`` (the seeded random plan).

``tool_calls`` are the calls sent, in order: ``{"id", "name", "arguments", "tokens",
"complete"}`` with ``arguments`` the text sent (partial when the answer was cut inside it,
broken by a ``corrupt`` fault) and ``complete`` true once the whole of it went out unbroken;
their tokens count in ``tokens_emitted`` and ``output_tokens_billed``. ``refusal`` is a
refusal's text (None when the model did not refuse; ``text`` is then empty).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from resumeq.fake.plan import Segment


@dataclass
class SentCall:
    """A tool call as far as it went out."""

    id: str
    name: str
    pieces: list[str] = field(default_factory=list)
    complete: bool = False

    def snapshot(self) -> dict[str, Any]:
        pieces = list(self.pieces)
        return {
            "id": self.id,
            "name": self.name,
            "arguments": "".join(pieces),
            "tokens": len(pieces),
            "complete": self.complete,
        }


@dataclass
class Exchange:
    seq: int
    path: str
    wire: str
    body: Any
    received_at: float = field(default_factory=time.time)
    model: str | None = None
    stream: bool = False
    status: int | None = None
    continuation: dict[str, Any] | None = None
    fault: dict[str, Any] | None = None
    outcome: str = "in_progress"
    finish_reason: str | None = None
    pieces: list[str] = field(default_factory=list)
    reasoning_pieces: list[str] = field(default_factory=list)
    refusal_pieces: list[str] = field(default_factory=list)
    calls: list[SentCall] = field(default_factory=list)
    echo_chars: int = 0
    output_tokens_billed: int = 0
    input_tokens_billed: int = 0
    cached_input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    response: Any = None

    def record(self, segment: Segment) -> list[str]:
        """The list a segment's pieces are journalled in as they go out (a call's opens)."""
        if segment.part == "reasoning":
            return self.reasoning_pieces
        if segment.part == "refusal":
            return self.refusal_pieces
        if segment.call is None:
            return self.pieces
        for sent in self.calls:
            if sent.id == segment.call.id:
                return sent.pieces
        self.calls.append(SentCall(segment.call.id, segment.call.name))
        return self.calls[-1].pieces

    def closed(self, segment: Segment) -> None:
        """A segment went out to its end: a call whose arguments are whole is complete."""
        if segment.call is not None and segment.call.complete:
            for sent in self.calls:
                if sent.id == segment.call.id:
                    sent.complete = len(sent.pieces) == len(segment.pieces)

    def mark(self) -> tuple[int, ...]:
        """How much is journalled now (see :meth:`rollback`)."""
        lists = (self.reasoning_pieces, self.pieces, self.refusal_pieces)
        return (*(len(x) for x in lists), len(self.calls), *(len(c.pieces) for c in self.calls))

    def rollback(self, mark: tuple[int, ...]) -> None:
        """Forget what was journalled since ``mark``: it never went out."""
        del self.reasoning_pieces[mark[0] :], self.pieces[mark[1] :]
        del self.refusal_pieces[mark[2] :], self.calls[mark[3] :]
        for sent, count in zip(self.calls, mark[4:], strict=True):
            del sent.pieces[count:]

    def snapshot(self) -> dict[str, Any]:
        pieces = list(self.pieces)
        reasoning = list(self.reasoning_pieces)
        refusal = list(self.refusal_pieces)
        calls = [call.snapshot() for call in list(self.calls)]
        emitted = len(reasoning) + len(pieces) + len(refusal) + sum(c["tokens"] for c in calls)
        return {
            "seq": self.seq,
            "received_at": self.received_at,
            "path": self.path,
            "wire": self.wire,
            "body": self.body,
            "model": self.model,
            "stream": self.stream,
            "status": self.status,
            "is_continuation": self.continuation is not None,
            "continuation": self.continuation,
            "fault": self.fault,
            "outcome": self.outcome,
            "finish_reason": self.finish_reason,
            "tokens_emitted": emitted,
            "text": "".join(pieces),
            "reasoning_tokens": len(reasoning),
            "reasoning": "".join(reasoning),
            "refusal": "".join(refusal) if refusal else None,
            "tool_calls": calls,
            "echo_chars": self.echo_chars,
            "output_tokens_billed": max(self.output_tokens_billed, emitted),
            "input_tokens_billed": self.input_tokens_billed,
            "cached_input_tokens": self.cached_input_tokens,
            "cache_creation_input_tokens": self.cache_creation_input_tokens,
            "response": self.response,
        }


class Journal:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._exchanges: list[Exchange] = []

    def open(self, path: str, wire: str, body: Any) -> Exchange:
        with self._lock:
            exchange = Exchange(seq=len(self._exchanges) + 1, path=path, wire=wire, body=body)
            self._exchanges.append(exchange)
            return exchange

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            exchanges = list(self._exchanges)
        return [exchange.snapshot() for exchange in exchanges]

    def clear(self) -> None:
        with self._lock:
            self._exchanges.clear()
