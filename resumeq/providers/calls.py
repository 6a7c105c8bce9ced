"""The tool calls of one streamed answer, numbered once for every wire (SPEC §23).

Each wire names a call its own way — Chat Completions by the ``index`` of its ``tool_calls``
pieces, Anthropic by its ``tool_use`` content block, the Responses API by its
``function_call`` item (``item_id``, ``output_index``) — and streams the call's arguments in
pieces. :class:`ToolCalls` numbers the calls 0, 1, … in the order they start, turns their
pieces into :class:`~resumeq.providers.base.ToolCallDelta` events (the first carrying the
call's id and name) and their ends into one :class:`~resumeq.providers.base.ToolCallEnd`
each. What cannot be placed — a piece of a call never announced, or of one that has ended,
arguments that end inside a surrogate pair — is a :class:`MalformedChunk` cut, never skipped:
a call's arguments are JSON, and a lost piece would make them another document.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass, field

from resumeq.core.errors import MalformedChunk
from resumeq.providers.base import ToolCallDelta, ToolCallEnd

#: The stream's text repair: ``(text, channel)`` to valid Unicode (a surrogate pair split
#: across pieces joined, a lone half a cut).
Unicode = Callable[[str, str], str]


@dataclass
class StreamedCall:
    """One call of the answer, as far as this stream has read it."""

    index: int
    id: str
    name: str
    #: Whether this stream gave its id and name yet (a call begun before a reattached
    #: stream's starting point is announced by its first piece here).
    announced: bool = False
    #: Its arguments as this stream read them, and whether it read them from their start.
    arguments: list[str] = field(default_factory=list)
    from_start: bool = True
    ended: bool = False

    @property
    def channel(self) -> str:
        """Its arguments' channel for surrogate pairs split across pieces."""
        return f"tool call {self.index}"


class ToolCalls:
    """The calls of one stream, found by the keys the wire gives them."""

    def __init__(self, unicode: Unicode, held: Callable[[str], bool]) -> None:
        self._unicode = unicode
        self._held = held
        self._calls: list[StreamedCall] = []
        self._keys: dict[Hashable, StreamedCall] = {}

    def __len__(self) -> int:
        return len(self._calls)

    def __getitem__(self, index: int) -> StreamedCall:
        return self._calls[index]

    def find(self, *keys: Hashable) -> StreamedCall | None:
        """The call any of ``keys`` names (None keys are no keys)."""
        for key in keys:
            if key is not None and key in self._keys:
                return self._keys[key]
        return None

    def open(self) -> list[StreamedCall]:
        """The calls this stream announced and that have not ended, in order."""
        return [c for c in self._calls if c.announced and not c.ended]

    def known(self, keys: Iterable[Hashable], call_id: str, name: str) -> StreamedCall:
        """A call begun before this stream's starting point (a reattached background
        response): numbered as the first stream numbered it, its arguments read on from
        wherever this stream takes them up."""
        call = StreamedCall(len(self._calls), call_id, name, from_start=False)
        self._add(call, keys)
        return call

    def start(
        self,
        keys: Iterable[Hashable],
        call_id: str,
        name: str,
        arguments: str,
        *,
        tokens: int,
        exact: bool,
    ) -> ToolCallDelta:
        """A call starts: its first delta, with its id and name."""
        keys = tuple(keys)
        call = self.find(*keys)
        if call is None:
            call = StreamedCall(len(self._calls), call_id, name)
            self._add(call, keys)
        elif call.announced or call.ended:
            raise MalformedChunk(f"tool call {call.index} ({call.id}) started twice")
        elif (call.id, call.name) != (call_id, name):
            raise MalformedChunk(
                f"tool call {call.index} started as {call_id} {name!r}, "
                f"known as {call.id} {call.name!r}"
            )
        else:
            call.from_start = True  # known from the response's status, started here
        return self.piece(call, arguments, tokens=tokens, exact=exact)

    def piece(
        self, call: StreamedCall, arguments: str, *, tokens: int, exact: bool
    ) -> ToolCallDelta:
        """The next piece of ``call``'s arguments."""
        if call.ended:
            raise MalformedChunk(f"a piece of tool call {call.index} ({call.id}) after its end")
        text = self._unicode(arguments, call.channel)
        call.arguments.append(text)
        first = not call.announced
        call.announced = True
        return ToolCallDelta(
            index=call.index,
            id=call.id if first else None,
            name=call.name if first else None,
            arguments=text,
            tokens=tokens,
            exact=exact,
        )

    def end(
        self, call: StreamedCall, whole: str | None = None
    ) -> Iterator[ToolCallDelta | ToolCallEnd]:
        """``call`` is whole (once; again is nothing). ``whole``: its arguments as the wire
        repeats them at the end — what the pieces did not carry of them comes first; arguments
        that are not the pieces' are a cut."""
        if call.ended:
            return
        if whole is not None and call.from_start:
            read = "".join(call.arguments)
            if not whole.startswith(read):
                raise MalformedChunk(
                    f"tool call {call.index} ({call.id}) ends with arguments that are not "
                    f"its pieces': {whole[:80]!r}"
                )
            if len(whole) > len(read):
                yield self.piece(call, whole[len(read) :], tokens=1, exact=False)
        if self._held(call.channel):
            raise MalformedChunk(f"tool call {call.index}'s arguments end inside a surrogate pair")
        call.ended = True
        yield ToolCallEnd(call.index)

    def end_open(self) -> Iterator[ToolCallDelta | ToolCallEnd]:
        """Every open call is whole (the answer finished, or text came after them)."""
        for call in self.open():
            yield from self.end(call)

    def ended_before(self, call: StreamedCall) -> None:
        """``call`` ended before this stream's starting point: nothing of it comes here."""
        call.ended = True

    def _add(self, call: StreamedCall, keys: Iterable[Hashable]) -> None:
        self._calls.append(call)
        for key in keys:
            if key is not None:
                self._keys[key] = call
