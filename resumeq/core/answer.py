"""What an answer holds besides its text, and whether it is what was asked (SPEC §23). Pure.

A job's tool calls are kept in its record as they stream (:class:`DurableCall`), checkpointed
with the text by the same script: a call is *complete* once its wire said it ended, and only
complete calls are shown (the job view, ``event: tool_call``). A call cut halfway is kept
too, never shown, and never finished by guesswork: :func:`redo_of` says what the next
attempt asks instead — the call again, from the text before it — and how many billed tokens
that buys a second time.

:func:`problem_of` checks a finished answer: every call's arguments a JSON object (valid for
its tool's schema when the tool is strict), the text of a structured answer one JSON document
valid for its schema. A problem is the job's ``on_invalid`` case, never a crash.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the calls are read where no model is loaded (``resumeq status``)
    from resumeq.core.spec import FunctionDef, JobSpec, ToolChoice

#: What a continuation of a structured answer tells the model, where the provider cannot
#: constrain a continuation: the schema follows as JSON. The fake provider reads it.
SCHEMA_NOTE = "Answer with one JSON document valid for this JSON Schema:\n"
#: What the continuation of a tool call cut inside its arguments tells the model: the tool's
#: name, :data:`CALL_NOTE_SCHEMA`, then its parameters' JSON Schema. The fake provider reads
#: it.
CALL_NOTE = "Write only the arguments of a call to the tool "
CALL_NOTE_SCHEMA = ": one JSON object valid for this JSON Schema:\n"
#: The same for ``json_object``, which names no schema (and Anthropic's wire, which has no
#: form of its own for it, on every attempt).
JSON_OBJECT_NOTE = "Answer with one JSON object.\n"


#: Finish reasons that say the output limit or a filter ended the answer, on any wire (the
#: wires' own words: Anthropic's ``max_tokens``, the Responses API's ``incomplete``).
LIMITED = frozenset({"length", "max_tokens", "max_output_tokens", "incomplete", "content_filter"})


@dataclass(frozen=True)
class DurableCall:
    """One tool call as checkpointed: ``arguments`` so far (all of them once ``complete``),
    the output tokens they took, and the attempt that made it."""

    id: str
    name: str
    arguments: str = ""
    complete: bool = False
    tokens: int = 0
    attempt: int = 0

    def shown(self) -> dict[str, str]:
        """The call as the job view and the event stream show it."""
        return {"id": self.id, "name": self.name, "arguments": self.arguments}


def dumps_calls(calls: Iterable[DurableCall]) -> str:
    return json.dumps([asdict(c) for c in calls], separators=(",", ":"), ensure_ascii=False)


def loads_calls(raw: str) -> tuple[DurableCall, ...]:
    """The calls a record holds ("" : none); raises ValueError for anything else."""
    if not raw:
        return ()
    data = json.loads(raw)
    if not isinstance(data, list):
        raise ValueError("tool_calls: not a list")
    out = []
    for item in data:
        if not isinstance(item, dict):
            raise ValueError("tool_calls: an item is not an object")
        try:
            out.append(DurableCall(**item))
        except TypeError as exc:
            raise ValueError(f"tool_calls: {exc}") from None
    return tuple(out)


def shown(calls: Iterable[DurableCall]) -> list[dict[str, str]]:
    """The complete calls, in order: what a reader may see."""
    return [c.shown() for c in calls if c.complete]


@dataclass(frozen=True)
class Redo:
    """What the attempt after a cut inside a tool call asks, and what it buys again."""

    #: The calls kept, in order: the complete ones (already shown), and the cut one when
    #: it is continued.
    kept: tuple[DurableCall, ...]
    #: The next attempt's tool choice: the cut call forced by name, the whole set again,
    #: or ``none`` while a continued call's arguments are asked for as text.
    tool_choice: ToolChoice
    #: Output tokens billed for the cut call's partial arguments, bought again.
    regenerated_tokens: int
    why: str
    #: The cut call whose arguments the next attempt continues (None: asked again).
    continued: DurableCall | None = None


def redo_of(
    calls: Sequence[DurableCall], spec: JobSpec, *, continue_calls: bool = False
) -> Redo | None:
    """What follows a cut call, if the stored calls end with one (None: nothing to redo).

    ``continue_calls`` (the profile's): a call cut inside its arguments is continued — the
    next attempt asks for the rest of them as text, from where they stop, and nothing is
    bought twice; its arguments are checked as JSON at the end like any call's. Otherwise —
    none of its arguments arrived, a ``byte_exact`` job, a call to a tool the job does not
    have — it is asked again. A call cut after complete
    ones is asked again alone, ``tool_choice`` forced to its name: the complete ones were
    shown and are kept. A set cut in its first call is asked again whole (``required``, or
    the job's own forced choice): no wire can carry completed calls without their results
    and ask for the rest, and nothing of that set was shown."""
    from resumeq.core.spec import FunctionName, NamedToolChoice  # noqa: PLC0415

    cut = [c for c in calls if not c.complete]
    if not cut:
        return None
    partial = cut[0]
    kept = tuple(c for c in calls if c.complete)
    tokens = sum(c.tokens for c in cut)
    size = f"{len(partial.arguments)} characters, {tokens} tokens"
    known = not spec.tools or any(t.function.name == partial.name for t in spec.tools)
    continuable = continue_calls and known and not spec.byte_exact  # a continuation is a new draw
    if continuable and partial.arguments and len(cut) == 1 and calls[-1] is partial:
        why = f"tool call {partial.name} cut ({size}): its arguments continued"
        return Redo((*kept, partial), "none", 0, why, continued=partial)
    if kept or isinstance(spec.tool_choice, NamedToolChoice):
        choice: ToolChoice = NamedToolChoice(function=FunctionName(name=partial.name))
        why = f"tool call {partial.name} cut ({size}): asked again, tool_choice {partial.name}"
        if kept:
            why += f"; {len(kept)} complete call(s) kept"
    else:
        choice = "required"
        why = f"tool call {partial.name} cut ({size}): the set asked again"
    return Redo(kept, choice, tokens, why)


def _json(text: str) -> tuple[Any, str | None]:
    try:
        return json.loads(text), None
    except ValueError as exc:
        return None, f"not JSON ({exc})"


def problem_of(
    spec: JobSpec, text: str, calls: Sequence[DurableCall], finish_reason: str | None
) -> str | None:
    """Why a finished answer is not what was asked, or None when it is."""
    tools = {t.function.name: t.function for t in spec.tools or ()}
    for call in calls:
        problem = _call_problem(call, tools)
        if problem is not None:
            return problem
    if spec.response_format is None or calls:
        return None
    return _document_problem(spec, text, finish_reason)


def _call_problem(call: DurableCall, tools: Mapping[str, FunctionDef]) -> str | None:
    if not call.complete:
        return f"tool call {call.name} did not end before the stream did"
    if tools and call.name not in tools:
        return f"tool call names {call.name!r}, which is not one of the job's tools"
    value, bad = _json(call.arguments)
    if bad is not None:
        return f"tool call {call.name}: arguments are {bad}"
    if not isinstance(value, dict):
        return f"tool call {call.name}: arguments are not a JSON object"
    function = tools.get(call.name)
    if function is None or not function.strict or function.parameters is None:
        return None
    invalid = schema_problem(value, function.parameters)
    return None if invalid is None else f"tool call {call.name}: arguments {invalid}"


def _document_problem(spec: JobSpec, text: str, finish_reason: str | None) -> str | None:
    rf = spec.response_format
    assert rf is not None
    if finish_reason in LIMITED:
        return f"the document was cut off by the output limit (finish reason {finish_reason})"
    value, bad = _json(text)
    if bad is not None:
        return f"the answer is {bad}"
    if rf.type == "json_object" or rf.json_schema is None:
        return None if isinstance(value, dict) else "the answer is not a JSON object"
    invalid = schema_problem(value, rf.json_schema.schema_)
    return None if invalid is None else f"the document {invalid}"


def schema_problem(value: Any, schema: dict[str, Any]) -> str | None:
    """How ``value`` fails ``schema`` (its first error, with where), or None."""
    import jsonschema  # noqa: PLC0415  (a finished structured answer is the only reader)

    cls = jsonschema.validators.validator_for(schema)
    error = jsonschema.exceptions.best_match(cls(schema).iter_errors(value))
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path) or "(root)"
    return f"does not match the schema at {where}: {error.message[:300]}"
