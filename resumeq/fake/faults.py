"""Faults queued through ``POST /_fake/faults`` and applied to the next generation requests.

Each fault serves ``times`` requests, in queue order. Only generation requests
(``/v1/chat/completions``, ``/v1/messages``, ``/v1/responses``) take faults, and only once
they passed validation. A stream fault fires after ``min(after_tokens, tokens the request
would send)`` tokens, so a queued fault is always observed.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

FaultKind = Literal[
    "disconnect",
    "truncate",
    "malformed",
    "stall",
    "pause",
    "error_event",
    "status",
    "sequence_skip",
    "sequence_repeat",
]


class Fault(BaseModel):
    """One fault.

    - ``disconnect``: close the socket after ``after_tokens`` tokens, mid-body.
    - ``truncate``: end the body cleanly after ``after_tokens`` tokens, with no finish reason
      and no ``[DONE]`` / ``message_stop``.
    - ``malformed``: after ``after_tokens`` tokens send one event whose data is not valid JSON,
      then end the body.
    - ``stall``: after ``after_tokens`` tokens send nothing for ``seconds``, then close; with
      ``keepalive_s``, an SSE comment (``: keep-alive``) every that many seconds meanwhile,
      as providers keep an idle stream open: bytes, no content.
    - ``pause``: as ``stall``, but the stream then goes on to its end, as a provider that
      thinks, or is busy, for a while mid-answer does (a non-streamed answer comes whole,
      ``seconds`` late).
    - ``error_event``: after ``after_tokens`` tokens send the wire's in-band error, then end.
    - ``status``: answer ``status`` at once with the wire's error body; ``retry_after`` (if
      set) goes into the ``Retry-After`` header, in seconds.
    - ``sequence_skip`` / ``sequence_repeat`` (the Responses wire, whose events are
      numbered): after ``after_tokens`` tokens send a delta whose ``sequence_number`` skips
      one, or the last delta again under its own number, then end the body. A wire without
      numbers sends a malformed event instead.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: FaultKind
    after_tokens: int = Field(default=0, ge=0)
    status: int = Field(default=429, ge=400, le=599)
    retry_after: float | None = Field(default=None, ge=0)
    seconds: float = Field(default=30.0, ge=0)
    keepalive_s: float | None = Field(default=None, gt=0)
    times: int = Field(default=1, ge=1)
    message: str | None = None
    #: Only a request whose messages contain this text takes the fault (others skip it).
    match: str | None = Field(default=None, min_length=1)


@dataclass
class _Queued:
    fault: Fault
    left: int


class FaultQueue:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: deque[_Queued] = deque()

    def add(self, faults: Iterable[Fault | Mapping[str, Any]]) -> list[Fault]:
        parsed = [f if isinstance(f, Fault) else Fault.model_validate(f) for f in faults]
        with self._lock:
            self._queue.extend(_Queued(fault, fault.times) for fault in parsed)
        return parsed

    def take(self, text: str = "") -> Fault | None:
        """The first queued fault for a request whose messages read ``text``: a fault
        without ``match`` applies to any request, one with it only where it occurs."""
        with self._lock:
            for queued in self._queue:
                match = queued.fault.match
                if match is not None and match not in text:
                    continue
                queued.left -= 1
                if queued.left <= 0:
                    self._queue.remove(queued)
                return queued.fault
            return None

    def pending(self) -> list[dict[str, Any]]:
        with self._lock:
            return [{**q.fault.model_dump(), "uses_left": q.left} for q in self._queue]

    def clear(self) -> None:
        with self._lock:
            self._queue.clear()
