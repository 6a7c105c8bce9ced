"""Building the request of an attempt: fresh, retry or continuation. Pure: no I/O.

A continuation asks only for the rest: ``max_tokens = budget - spent`` and the stored
prefix, placed where the profile's ``continue_mode`` says (SPEC §5):

- ``prefill`` — a final assistant message holding the prefix (Anthropic, llama.cpp). For
  Anthropic it is sent without trailing white space, which it refuses; what was trimmed is
  remembered so the splice does not double it.
- ``prefill_flag`` — the same message with ``prefix: true`` (Mistral, DeepSeek).
- ``continue_final_message`` — the same message plus ``continue_final_message: true`` and
  ``add_generation_prompt: false`` (vLLM; both, or vLLM opens a new turn).
- ``instruction`` — no prefill (OpenAI Chat Completions, newer Claude models): one user
  message asking to continue without repeating, with the unfinished text in a marked block.

``resume_context`` decides how much input a continuation re-sends: ``full`` (the original
messages) or ``tail:N`` (the system messages, the last user request, and only the last N
tokens of the prefix).
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from typing import Literal

from resumeq.core.answer import (
    CALL_NOTE,
    CALL_NOTE_SCHEMA,
    JSON_OBJECT_NOTE,
    SCHEMA_NOTE,
    DurableCall,
)
from resumeq.core.settings import ProviderProfile
from resumeq.core.spec import (
    GenerationParams,
    JobSpec,
    ResponseFormat,
    Role,
    Tool,
    ToolCall,
    ToolChoice,
)

#: The markers around the unfinished text in an ``instruction`` continuation.
PARTIAL_OPEN = "<<<PARTIAL\n"
PARTIAL_CLOSE = "\nPARTIAL>>>"

INSTRUCTION = (
    "Your previous answer was cut off. Continue it from exactly where it stops: do not "
    "repeat any of it, add no preamble, and keep the same style. It ends with:\n"
)

#: ``reattach``: the rest of a background response read from the provider (no new request).
AttemptKind = Literal["fresh", "retry", "resume", "reattach"]

# Rough token pieces for choosing a tail: a word with its leading white space, or a run
# of punctuation. Providers' tokenizers differ; a tail only needs to be about N tokens.
_PIECE_RE = re.compile(r"\s*\w+|\s*[^\w\s]+|\s+")


@dataclass(frozen=True)
class ChatMessage:
    role: Literal["system", "user", "assistant", "tool"]
    content: str
    #: Mistral/DeepSeek's ``prefix: true`` on a final assistant message.
    prefix: bool = False
    #: Mark for the provider's prompt cache (Anthropic ``cache_control``).
    cache: bool = False
    #: An assistant message's tool calls (the app sends them back with their results).
    tool_calls: tuple[ToolCall, ...] = ()
    #: A tool message: the call it answers.
    tool_call_id: str | None = None


@dataclass(frozen=True)
class Shape:
    """What the answer may be besides text: the tools it may call, how it must choose
    among them, and the JSON document it must be (each translated per wire)."""

    tools: tuple[Tool, ...] = ()
    tool_choice: ToolChoice | None = None
    response_format: ResponseFormat | None = None

    @classmethod
    def of(cls, spec: JobSpec) -> Shape:
        return cls(spec.tools or (), spec.tool_choice, spec.response_format)


@dataclass(frozen=True)
class RequestPlan:
    """What an attempt sends, independent of the wire format."""

    kind: AttemptKind
    model: str
    messages: tuple[ChatMessage, ...]
    max_tokens: int
    params: GenerationParams = field(default_factory=GenerationParams)
    #: Extra top-level body fields (vLLM's continue_final_message flags).
    extra_body: dict[str, object] = field(default_factory=dict)
    #: White space cut off the prefix's end before it was sent (restored at the splice).
    trimmed: str = ""
    #: Characters of stored prefix the request carries (the whole prefix, or its tail).
    prefix_chars_sent: int = 0
    #: The prefix text exactly as the request carries it (an engine may echo it back).
    sent: str = ""
    #: A reattach: the background response, and the last sequence number already stored.
    response_id: str | None = None
    after: int | None = None
    #: Tools, tool choice and response format, as this request sends them.
    shape: Shape = field(default_factory=Shape)
    #: The request continues the arguments of the job's cut tool call (its last): the text
    #: it streams is theirs, and its end ends the call.
    continues_call: bool = False


def tail_pieces(text: str, n: int) -> str:
    """The last ``n`` token-like pieces of ``text`` (all of it if shorter)."""
    if n <= 0:
        return ""
    starts = [m.start() for m in _PIECE_RE.finditer(text)]
    if len(starts) <= n:
        return text
    return text[starts[-n] :]


def _context(spec: JobSpec, profile: ProviderProfile) -> list[ChatMessage]:
    """The original conversation, or its system messages and last user request."""
    chat = spec.chat
    if profile.tail_tokens is not None:
        last_user = max(i for i, m in enumerate(chat) if m.role is Role.USER)
        system = [m for m in chat[:last_user] if m.role is Role.SYSTEM]
        chat = (*system, chat[last_user])
    out = [
        ChatMessage(
            role=m.role.value,
            content=m.content,
            tool_calls=m.tool_calls or (),
            tool_call_id=m.tool_call_id,
        )
        for m in chat
    ]
    if profile.cache_prompt and out:
        # Mark the original conversation's last message: a continuation reads all of it
        # from the cache instead of paying for it again.
        out[-1] = dataclasses.replace(out[-1], cache=True)
    return out


def plan_reattach(
    spec: JobSpec, *, response_id: str, after: int, remaining_tokens: int
) -> RequestPlan:
    """Read the rest of background response ``response_id`` after event ``after``: nothing
    is sent again, nothing new is bought."""
    return RequestPlan(
        kind="reattach",
        model=spec.model,
        messages=(),
        max_tokens=remaining_tokens,
        params=spec.params,
        response_id=response_id,
        after=after,
    )


def _shaped(
    spec: JobSpec,
    profile: ProviderProfile,
    context: list[ChatMessage],
    *,
    continuing: bool,
    tool_choice: ToolChoice | None,
    call: DurableCall | None = None,
) -> tuple[list[ChatMessage], Shape]:
    """The shape an attempt sends, and its context with any note the shape needs.

    A continuation of a structured answer is asked without ``response_format``: constrained
    decoding starts a document at its root, and Anthropic refuses a prefill with structured
    outputs. The schema goes into a system note instead, and the whole document is checked
    at the end. ``json_object`` has no Anthropic form: the note, on every attempt. A redo
    of a cut tool call forces ``tool_choice``; a continued call's arguments are asked for
    as text (``tool_choice`` ``none``: the tools stay declared, as a conversation with
    calls in it must have them), its tool and schema in the note."""
    shape = Shape.of(spec)
    if tool_choice is not None:
        shape = dataclasses.replace(shape, tool_choice=tool_choice)
    rf = spec.response_format
    if call is not None:
        tool = next((t.function for t in spec.tools or () if t.function.name == call.name), None)
        parameters = tool.parameters if tool is not None and tool.parameters else {}
        schema = json.dumps(parameters or {"type": "object"}, ensure_ascii=False)
        note = f"{CALL_NOTE}{call.name}{CALL_NOTE_SCHEMA}{schema}"
    elif rf is None or not (
        continuing or (profile.kind == "anthropic" and rf.type == "json_object")
    ):
        return context, shape
    elif rf.type == "json_schema" and rf.json_schema is not None:
        schema = json.dumps(rf.json_schema.schema_, ensure_ascii=False)
        note = f"{SCHEMA_NOTE}{schema}"
    else:
        note = JSON_OBJECT_NOTE
    first = next((i for i, m in enumerate(context) if m.role != "system"), len(context))
    context = [*context[:first], ChatMessage(role="system", content=note), *context[first:]]
    return context, dataclasses.replace(shape, response_format=None)


def plan_request(
    spec: JobSpec,
    profile: ProviderProfile,
    *,
    prefix: str,
    remaining_tokens: int,
    tool_choice: ToolChoice | None = None,
    call: DurableCall | None = None,
) -> RequestPlan:
    """The request for the next attempt of a job whose stored prefix is ``prefix``.

    No prefix: a fresh request (or a retry of it). A prefix: a continuation — never the
    original request again, which would buy the prefix a second time. ``tool_choice``: the
    choice a redo of a cut tool call forces (:func:`resumeq.core.answer.redo_of`).
    ``call``: a tool call cut inside its arguments, continued — its arguments are the
    prefix, continued as text the way the profile continues any.
    """
    if remaining_tokens <= 0:
        raise ValueError(f"remaining_tokens must be > 0, got {remaining_tokens}")
    if call is not None:
        prefix, tool_choice = call.arguments, "none"
    context, shape = _shaped(
        spec,
        profile,
        _context(spec, profile),
        continuing=bool(prefix),
        tool_choice=tool_choice,
        call=call,
    )
    if not prefix:
        return RequestPlan(
            kind="fresh",
            model=spec.model,
            messages=tuple(context),
            max_tokens=remaining_tokens,
            params=spec.params,
            shape=shape,
        )
    # A call's arguments go whole: the model must see which objects and strings are open.
    keep = None if call is not None else profile.tail_tokens
    tail = prefix if keep is None else tail_pieces(prefix, keep)
    mode = profile.continue_mode
    extra: dict[str, object] = {}
    trimmed = ""
    sent = tail
    if mode == "instruction":
        block = f"{INSTRUCTION}{PARTIAL_OPEN}{tail}{PARTIAL_CLOSE}"
        added = ChatMessage(role="user", content=block)
    else:
        sent = tail
        if profile.kind == "anthropic":
            sent = tail.rstrip()
            trimmed = tail[len(sent) :]
        added = ChatMessage(role="assistant", content=sent, prefix=mode == "prefill_flag")
        if mode == "continue_final_message":
            extra = {"continue_final_message": True, "add_generation_prompt": False}
    return RequestPlan(
        kind="resume",
        model=spec.model,
        messages=(*context, added),
        max_tokens=remaining_tokens,
        params=spec.params,
        extra_body=extra,
        trimmed=trimmed,
        prefix_chars_sent=len(tail),
        sent=sent,
        shape=shape,
        continues_call=call is not None,
    )
