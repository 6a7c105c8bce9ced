"""Faults queued through ``POST /_fake/faults`` and applied to the next generation requests.

Each fault serves ``times`` requests, in queue order. Only generation requests
(``/v1/chat/completions``, ``/v1/messages``, ``/v1/responses``) take faults, and only once
they passed validation. A stream fault fires after ``min(after_tokens, tokens the request
would send)`` tokens, so a queued fault is always observed.

Every queued fault has an id (1, 2, ... for the provider's life; a reset does not reuse
them): ``GET /_fake/faults`` lists what is still queued with each one's ``id`` and
``uses_left``, ``DELETE /_fake/faults/{id}`` takes one out, ``DELETE /_fake/faults`` them
all, and ``GET /_fake/faults/schema`` is the JSON schema of one fault (:class:`Fault`).
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

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
    "corrupt",
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
    - ``corrupt``: after ``after_tokens`` tokens the rest of the JSON the answer holds (the
      document, or the call the cut falls in and every call after it) is sent broken — its
      closing brackets dropped, ``<garbage>`` after it — so it is no longer valid JSON; the
      answer then ends as it would have, with its finish reason (a non-streamed one is the
      body with that content). Text that is no JSON document is broken the same way.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: What goes wrong (the list above).
    kind: FaultKind
    #: The stream faults fire after this many output tokens (at most all the request would
    #: send, so a queued fault always fires); reasoning and arguments tokens count.
    after_tokens: int = Field(default=0, ge=0)
    #: ``status``: the HTTP status answered, with the wire's error body.
    status: int = Field(default=429, ge=400, le=599)
    #: ``status``: the ``Retry-After`` header, in seconds (none when unset).
    retry_after: float | None = Field(default=None, ge=0)
    #: ``stall`` and ``pause``: how long nothing is sent.
    seconds: float = Field(default=30.0, ge=0)
    #: ``stall`` and ``pause``: an SSE comment every this many seconds meanwhile.
    keepalive_s: float | None = Field(default=None, gt=0)
    #: How many requests the fault serves before it leaves the queue.
    times: int = Field(default=1, ge=1)
    #: ``status``: the error body's message (the wire's usual one for the status when unset).
    message: str | None = None
    #: Only a request whose messages contain this text takes the fault (others skip it).
    match: str | None = Field(default=None, min_length=1)


@dataclass
class _Queued:
    id: int
    fault: Fault
    left: int

    def describe(self) -> dict[str, Any]:
        return {"id": self.id, **self.fault.model_dump(), "uses_left": self.left}


class FaultQueue:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: deque[_Queued] = deque()
        self._ids = itertools.count(1)

    def add(self, faults: Iterable[Fault | Mapping[str, Any]]) -> list[Fault]:
        """Queue ``faults`` after those already queued; all of them or, when one is not a
        fault, none (the ValidationError names it by its place in the list)."""
        return [q.fault for q in self._add(faults)]

    def queue(self, faults: Iterable[Fault | Mapping[str, Any]]) -> list[dict[str, Any]]:
        """As :meth:`add`; what was queued as :meth:`pending` lists it (with the ids)."""
        return [q.describe() for q in self._add(faults)]

    def _add(self, faults: Iterable[Fault | Mapping[str, Any]]) -> list[_Queued]:
        parsed = _FAULTS.validate_python(
            [f.model_dump() if isinstance(f, Fault) else f for f in faults]
        )
        with self._lock:
            queued = [_Queued(next(self._ids), fault, fault.times) for fault in parsed]
            self._queue.extend(queued)
        return queued

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
        """The faults still queued, in the order they apply: each one's fields, ``id`` and
        ``uses_left``."""
        with self._lock:
            return [q.describe() for q in self._queue]

    def remove(self, fault_id: int) -> dict[str, Any] | None:
        """Take the fault ``fault_id`` out of the queue: what it was, or None when no queued
        fault has that id (it was never queued, or it was used up)."""
        with self._lock:
            for queued in self._queue:
                if queued.id == fault_id:
                    self._queue.remove(queued)
                    return queued.describe()
            return None

    def clear(self) -> int:
        """Empty the queue; how many faults were in it."""
        with self._lock:
            count = len(self._queue)
            self._queue.clear()
            return count


_FAULTS: TypeAdapter[list[Fault]] = TypeAdapter(list[Fault])
