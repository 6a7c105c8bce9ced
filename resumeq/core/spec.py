"""What a producer submits: the JobSpec and its limits (the rules they validate with,
the patterns, and the canonical prompt hash are :mod:`resumeq.core.spec_rules`).

A spec names a provider *profile* (configured on the workers, where the API keys live),
never a URL, a header or a key: a producer must not be able to point workers at an
arbitrary host. Every field that is a short identifier is checked for things that look
like a URL or a credential and refused with a message that names the field.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from enum import StrEnum
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from resumeq.core.defaults import LimitDefaults
from resumeq.core.errors import FieldError, InvalidSpec
from resumeq.core.spec_rules import (
    DEFAULT_FLOOR_TOKENS,
    NAME_RE,
    check_budget,
    check_floor,
    check_idempotency_key,
    check_model,
    check_prompt,
    check_provider,
    check_tool_call_id,
    default_floor,
    json_integer,
    prompt_hash,
    refuse_url_or_secret,
)
from resumeq.core.spec_tools import (
    FunctionCall,
    FunctionDef,
    FunctionName,
    JsonSchemaFormat,
    NamedToolChoice,
    ResponseFormat,
    Tool,
    ToolCall,
    ToolChoice,
    check_called_tools,
    check_conversation,
    check_message,
    check_response_format,
    check_tool_choice,
    check_tools,
    read_tool_choice,
)
from resumeq.core.spec_types import (
    AT_PATH,
    DEFAULT_LIMITS,
    JsonBool,
    JsonFloat,
    JsonInt,
    Limits,
)
from resumeq.core.spec_types import limits_of as _limits

__all__ = [
    "DEFAULT_LIMITS",
    "ExitPolicy",
    "FunctionCall",
    "FunctionDef",
    "FunctionName",
    "GenerationParams",
    "JobSpec",
    "JsonBool",
    "JsonFloat",
    "JsonInt",
    "JsonSchemaFormat",
    "Limits",
    "Message",
    "NamedToolChoice",
    "ResponseFormat",
    "Role",
    "Tool",
    "ToolCall",
    "ToolChoice",
    "parse_spec",
    "parse_spec_json",
]


class Role(StrEnum):
    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


class Message(BaseModel):
    """One chat message: text, or an assistant's tool calls, or a tool's result."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    role: Role = Field(description="Who speaks: `system`, `user`, `assistant` or `tool`.")
    content: str = Field(default="", description="The message's text.")
    tool_calls: tuple[ToolCall, ...] | None = Field(
        default=None, description="An assistant message's tool calls."
    )
    tool_call_id: str | None = Field(
        default=None, description="A tool message's call: the id of the call it answers."
    )

    @field_validator("tool_call_id")
    @classmethod
    def _check_tool_call_id(cls, v: str | None) -> str | None:
        return v if v is None else check_tool_call_id(v)

    @model_validator(mode="after")
    def _check_parts(self, info: ValidationInfo) -> Message:
        check_message(self, info)
        return self

    def hashed(self) -> dict[str, Any]:
        """The message as the prompt hash reads it (a plain text message as before tools)."""
        out: dict[str, Any] = {"role": self.role.value, "content": self.content}
        if self.tool_calls is not None:
            out["tool_calls"] = [c.model_dump(mode="json") for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


class GenerationParams(BaseModel):
    """Sampling parameters that change the answer, and so the prompt hash."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    temperature: JsonFloat | None = Field(
        default=None, ge=0.0, le=2.0, description="The sampling temperature sent to the provider."
    )
    top_p: JsonFloat | None = Field(
        default=None, gt=0.0, le=1.0, description="Nucleus sampling's probability mass."
    )
    stop: tuple[str, ...] | None = Field(
        default=None,
        max_length=4,
        description="Sequences at which the provider stops the answer.",
    )
    seed: JsonInt | None = Field(
        default=None,
        ge=0,
        le=2**63 - 1,
        description="A sampling seed, for providers that take one.",
    )

    @field_validator("stop")
    @classmethod
    def _stop_sequences(cls, v: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if v is not None and any(not s or len(s) > 64 for s in v):
            raise ValueError("each stop sequence must be 1 to 64 characters")
        return v


class ExitPolicy(BaseModel):
    """The exit chosen before the call: what a cut leads to."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    on_cut: Literal["resume", "abandon", "spill"] = Field(
        default="resume",
        description="What a cut that leaves output behind leads to: `resume` continues from "
        "the stored text; `abandon` takes the job's exit at once; `spill` spills it at once, "
        "droppable or not.",
    )
    droppable: JsonBool = Field(
        default=False,
        description="A droppable job that cannot go on is abandoned (its partial text kept); "
        "one that is not is spilled for a person, once.",
    )
    max_attempts: JsonInt = Field(
        default=5,
        ge=1,
        le=50,
        description="After an attempt that delivered output, the job takes its exit once it "
        "has had this many attempts (attempts that deliver nothing are bounded by `[worker] "
        "retry_window_s` instead).",
    )
    on_invalid: Literal["retry", "spill", "fail"] = Field(
        default="spill",
        description="What an answer that is not what was asked leads to (a document that does "
        "not validate against `response_format`, a tool call whose arguments are not JSON): "
        "`retry` a fresh attempt (counted), `spill` for a person, or `fail`.",
    )


class JobSpec(BaseModel):
    """One generation request, validated at enqueue.

    Give either ``messages`` or ``prompt`` (a single user message). Unknown fields are
    refused, so a ``base_url``, ``api_key`` or ``headers`` field can never slip through.
    Limits come from the validation context (``context={"limits": Limits(...)}``), else
    the defaults.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    messages: tuple[Message, ...] | None = Field(
        default=None,
        description="The conversation, with at least one user message. Give this or `prompt`.",
    )
    prompt: str | None = Field(
        default=None,
        validate_default=True,
        description="The text of a single user message. Give this or `messages`.",
    )
    provider: str = Field(
        description="The name of a provider profile configured on the workers "
        "(`[providers.NAME]`); never a URL or a key."
    )
    model: str = Field(description="The model name sent to the provider.")
    budget_tokens: JsonInt = Field(
        gt=0,
        description="The most output tokens the job may consume, all attempts together "
        "(reasoning tokens included).",
    )
    #: The smallest remaining budget worth a continuation (SPEC §4): a cut job with less
    #: left takes its exit instead. ``1 <= floor_tokens < budget_tokens``, except that a
    #: floor of 1 fits every budget: it is no floor at all (any budget left is worth
    #: resuming), the only floor a budget of 1 can have. Not given, it is
    #: :func:`default_floor` of the budget (32, or half a smaller budget): a default never
    #: makes a request invalid, and an error about the floor means the caller set it.
    floor_tokens: JsonInt = Field(
        default=DEFAULT_FLOOR_TOKENS,
        ge=1,
        validate_default=True,
        description="The smallest remaining budget worth a continuation: a cut job with less "
        "left takes its exit instead. Less than `budget_tokens`, or 1 (no floor).",
    )
    params: GenerationParams = Field(
        default=GenerationParams(),
        description="Sampling parameters; they are part of the prompt hash.",
    )
    exit: ExitPolicy = Field(
        default=ExitPolicy(), description="The exit, chosen before the call: what a cut leads to."
    )
    idempotency_key: str | None = Field(
        default=None, description="Enqueueing again with the same key returns the same job."
    )
    require_exact_counts: JsonBool = Field(
        default=False,
        description="Never continue on an estimated count: a job whose output tokens were "
        "estimated takes its exit instead of a continuation.",
    )
    byte_exact: JsonBool = Field(
        default=False,
        description="The answer must be one sampling, byte for byte: a cut that leaves output "
        "is never continued with a new request (a continuation is a new draw); the job takes "
        "its exit.",
    )
    metadata: dict[str, JsonValue] = Field(
        default_factory=dict,
        validate_default=True,
        description="Plain JSON kept with the job and shown with it; never sent to the provider.",
    )
    hooks: tuple[str, ...] = Field(
        default=(),
        description="Names of after-completion hooks registered on the workers, run when the "
        "job ends `done`.",
    )
    tools: tuple[Tool, ...] | None = Field(
        default=None, description="Functions the model may call (OpenAI's function-tool shape)."
    )
    tool_choice: ToolChoice | None = Field(
        default=None,
        description='`auto`, `none`, `required`, or `{"type": "function", "function": '
        '{"name": ...}}` to force one of `tools`.',
    )
    response_format: ResponseFormat | None = Field(
        default=None,
        description='The answer as a JSON document: `{"type": "json_schema", "json_schema": '
        '{"name", "schema", "strict"}}` or `{"type": "json_object"}`.',
    )

    @field_validator("messages")
    @classmethod
    def _check_messages(
        cls, v: tuple[Message, ...] | None, info: ValidationInfo
    ) -> tuple[Message, ...] | None:
        if v is None:
            return v
        limits = _limits(info)
        if not v:
            raise ValueError("must hold at least one message")
        if len(v) > limits.max_messages:
            raise ValueError(f"at most {limits.max_messages} messages, got {len(v)}")
        if not any(m.role is Role.USER for m in v):
            raise ValueError("must hold at least one user message")
        size = check_conversation(v)
        if size > limits.max_prompt_bytes:
            limit = limits.max_prompt_bytes
            raise ValueError(f"content is {size} bytes, over the limit of {limit}")
        return v

    @field_validator("prompt")
    @classmethod
    def _check_prompt(cls, v: str | None, info: ValidationInfo) -> str | None:
        # A field that failed its own validation is absent from info.data: say nothing more.
        has_messages = info.data.get("messages") is not None
        if v is None:
            if "messages" in info.data and not has_messages:
                raise ValueError("give either messages or prompt")
            return v
        if has_messages:
            raise ValueError("give either messages or prompt, not both")
        return check_prompt(v, _limits(info).max_prompt_bytes)

    @field_validator("provider")
    @classmethod
    def _check_provider(cls, v: str) -> str:
        return check_provider(v)

    @field_validator("model")
    @classmethod
    def _check_model(cls, v: str) -> str:
        return check_model(v)

    @field_validator("budget_tokens")
    @classmethod
    def _check_budget(cls, v: int, info: ValidationInfo) -> int:
        return check_budget(v, _limits(info).max_budget_tokens)

    @model_validator(mode="before")
    @classmethod
    def _default_floor(cls, data: Any) -> Any:
        """No floor given: derive it from the budget, read as pydantic will read it (an
        unreadable budget is reported as such, and the floor then checked against none)."""
        if not isinstance(data, Mapping) or "floor_tokens" in data:
            return data
        try:
            budget = json_integer(data.get("budget_tokens"))
        except ValueError:
            return data
        if not isinstance(budget, int):
            return data
        return {**data, "floor_tokens": default_floor(budget)} if budget > 0 else data

    @field_validator("floor_tokens")
    @classmethod
    def _check_floor(cls, v: int, info: ValidationInfo) -> int:
        return check_floor(v, info.data.get("budget_tokens"))

    @field_validator("idempotency_key")
    @classmethod
    def _check_idempotency_key(cls, v: str | None) -> str | None:
        return v if v is None else check_idempotency_key(v)

    @field_validator("metadata")
    @classmethod
    def _check_metadata(cls, v: dict[str, JsonValue], info: ValidationInfo) -> dict[str, JsonValue]:
        limit = _limits(info).max_metadata_bytes
        size = len(json.dumps(v, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))
        if size > limit:
            raise ValueError(f"is {size} bytes as JSON, over the limit of {limit}")
        for key in v:
            if not key or len(key) > 64:
                raise ValueError(f"key {key[:70]!r} must be 1 to 64 characters")
        for s in _strings(v):
            refuse_url_or_secret(s, "plain data")
        return v

    @field_validator("hooks")
    @classmethod
    def _check_hooks(cls, v: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        limit = _limits(info).max_hooks
        if len(v) > limit:
            raise ValueError(f"at most {limit} hooks, got {len(v)}")
        for name in v:
            refuse_url_or_secret(name, "the name of a hook registered on the workers")
            if not NAME_RE.fullmatch(name):
                raise ValueError(f"hook name {name[:70]!r} must match {NAME_RE.pattern}")
        if len(set(v)) != len(v):
            raise ValueError("names a hook twice")
        return v

    @field_validator("tools")
    @classmethod
    def _check_tools(
        cls, v: tuple[Tool, ...] | None, info: ValidationInfo
    ) -> tuple[Tool, ...] | None:
        return v if v is None else check_tools(v, info)

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _read_tool_choice(cls, v: Any) -> Any:
        return read_tool_choice(v)

    @field_validator("tool_choice")
    @classmethod
    def _check_tool_choice(cls, v: ToolChoice | None, info: ValidationInfo) -> ToolChoice | None:
        return check_tool_choice(v, info)  # type: ignore[no-any-return]

    @field_validator("response_format")
    @classmethod
    def _check_response_format(
        cls, v: ResponseFormat | None, info: ValidationInfo
    ) -> ResponseFormat | None:
        return check_response_format(v, info)  # type: ignore[no-any-return]

    @model_validator(mode="after")
    def _check_called_tools(self) -> JobSpec:
        """The calls the conversation carries name the spec's tools (fields apart, checked
        once both are valid)."""
        check_called_tools(self.messages or (), self.tools)
        return self

    @property
    def chat(self) -> tuple[Message, ...]:
        """The messages, with ``prompt`` turned into one user message."""
        if self.messages is not None:
            return self.messages
        assert self.prompt is not None  # the validators guarantee one of them
        return (Message(role=Role.USER, content=self.prompt),)

    def prompt_hash(self) -> str:
        """SHA-256 over a canonical JSON of what determines the answer.

        Provider, model, messages (``prompt`` and its one-message form hash the same) and
        generation parameters; not the budget, the exit policy or the metadata. A
        continuation whose spec hashes differently is refused: a cursor is never spliced
        onto an edited prompt.
        """
        shape: dict[str, Any] = {}
        if self.tools is not None:
            shape["tools"] = [t.model_dump(mode="json", exclude_none=True) for t in self.tools]
        if self.tool_choice is not None:
            choice = self.tool_choice
            shape["tool_choice"] = choice if isinstance(choice, str) else choice.model_dump()
        if self.response_format is not None:
            shape["response_format"] = self.response_format.model_dump(
                mode="json", by_alias=True, exclude_none=True
            )
        return prompt_hash(
            self.provider,
            self.model,
            [m.hashed() for m in self.chat],
            self.params.model_dump(mode="json", exclude_none=True),
            shape,
        )

    @property
    def structured(self) -> bool:
        """Whether the answer is asked as a JSON document."""
        return self.response_format is not None

    def to_json(self) -> str:
        return self.model_dump_json(exclude_defaults=True, by_alias=True)


def _strings(value: JsonValue) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, item in value.items() for s in [k, *_strings(item)]]
    if isinstance(value, list):
        return [s for item in value for s in _strings(item)]
    return []


def parse_spec(
    data: JobSpec | Mapping[str, Any], *, limits: Limits | LimitDefaults | None = None
) -> JobSpec:
    """Validate ``data`` into a JobSpec, or raise :class:`InvalidSpec` naming each field.

    A JobSpec already built is validated again against ``limits`` (which may be tighter
    than the defaults it was built with); plain limits (a config file's digest,
    :mod:`resumeq.core.config_digest`) are taken as the model's.
    """
    raw: Any = data.model_dump(exclude_defaults=True) if isinstance(data, JobSpec) else data
    if not isinstance(raw, Mapping):
        raise InvalidSpec([FieldError("spec", f"must be an object, got {type(raw).__name__}")])
    if isinstance(limits, LimitDefaults):
        limits = Limits(**dataclasses.asdict(limits))
    try:
        return JobSpec.model_validate(raw, context={"limits": limits or DEFAULT_LIMITS})
    except ValidationError as exc:
        raise InvalidSpec(_field_errors(exc)) from None


def parse_spec_json(blob: str | bytes, *, limits: Limits | LimitDefaults | None = None) -> JobSpec:
    """Like :func:`parse_spec`, from JSON text."""
    try:
        data = json.loads(blob)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidSpec([FieldError("spec", f"is not valid JSON: {exc}")]) from None
    return parse_spec(data, limits=limits)


def _field_errors(exc: ValidationError) -> list[FieldError]:
    out = []
    for err in exc.errors(include_url=False, include_input=False):
        parts = [str(p) for p in err["loc"]]
        if err["type"] == AT_PATH:  # a refusal inside the field: where in it
            parts += [p for p in str(err.get("ctx", {}).get("path", "")).split(".") if p]
        msg = err["msg"].removeprefix("Value error, ")
        out.append(FieldError(".".join(parts) or "spec", msg))
    return out
