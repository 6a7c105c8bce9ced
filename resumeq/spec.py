"""What a producer submits: the JobSpec, its limits, and the canonical prompt hash.

A spec names a provider *profile* (configured on the workers, where the API keys live),
never a URL, a header or a key: a producer must not be able to point workers at an
arbitrary host. Every field that is a short identifier is checked for things that look
like a URL or a credential and refused with a message that names the field.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    JsonValue,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from resumeq.defaults import LIMIT_DEFAULTS
from resumeq.errors import FieldError, InvalidSpec
from resumeq.keys import IDEMPOTENCY_KEY_RE

#: Version of the canonical form hashed by :meth:`JobSpec.prompt_hash`.
PROMPT_HASH_VERSION = 1
#: The floor of a job that gives none, unless its budget is under twice this.
DEFAULT_FLOOR_TOKENS = 32


def json_integer(value: Any) -> Any:
    """A JSON integer, as JSON Schema has it: an int, or a number with no fractional part
    (``800.0`` is 800). Never a string, a boolean or a fraction: pydantic's lax mode would
    take ``"800"`` and ``true``."""
    if isinstance(value, bool):
        raise ValueError("must be an integer, not a boolean")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if math.isfinite(value) and value.is_integer():
            return int(value)
        raise ValueError(f"must be an integer, got {value!r}")
    if isinstance(value, str):
        raise ValueError(f"must be an integer, not a string ({value[:40]!r})")
    return value  # None where allowed; anything else is refused by the type


def json_number(value: Any) -> Any:
    """A JSON number: never a string or a boolean."""
    if isinstance(value, bool):
        raise ValueError("must be a number, not a boolean")
    if isinstance(value, str):
        raise ValueError(f"must be a number, not a string ({value[:40]!r})")
    return value


def json_boolean(value: Any) -> Any:
    """A JSON boolean: ``true`` or ``false``, never 0, 1 or a string such as ``"yes"``
    (which pydantic's lax mode would read as one)."""
    if isinstance(value, bool):
        return value
    raise ValueError(f"must be true or false, not {type(value).__name__} {str(value)[:40]!r}")


#: Integer, number and boolean fields of a job spec, as strict as JSON is.
JsonInt = Annotated[int, BeforeValidator(json_integer)]
JsonFloat = Annotated[float, BeforeValidator(json_number)]
JsonBool = Annotated[bool, BeforeValidator(json_boolean)]

#: The patterns a spec's identifiers are held to, written once for Python's ``re`` and for
#: the JSON Schema (ECMA 262) the HTTP API publishes (:mod:`resumeq.server.openapi`): no
#: flags, no look-behind, explicit character classes where the two engines read a shorthand
#: differently (``\s``), and ``\b`` read as ASCII by both (compiled with ``re.ASCII``).
#: Anchored ones are matched whole (``fullmatch``: Python's ``$`` would also match before a
#: final newline).
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
MODEL_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:/@+-]{0,199}$"
#: White space as ``str.isspace`` has it (what ``str.strip`` removes), spelled out.
SPACE_CLASS = r"\t\n\x0b\x0c\r\x1c-\x20\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
#: Something other than white space: a prompt is not empty.
NOT_BLANK_PATTERN = f"[^{SPACE_CLASS}]"
URL_PATTERN = f"^[{SPACE_CLASS}]*(?:[A-Za-z][A-Za-z0-9+.-]*://|//|[Ww][Ww][Ww]\\.)"
SECRET_PATTERNS = (
    r"\bsk-[A-Za-z0-9_-]{16,}",  # OpenAI, Anthropic (sk-ant-…), DeepSeek
    r"\bAKIA[0-9A-Z]{16}\b",  # AWS access key id
    r"\bAIza[0-9A-Za-z_-]{30,}",  # Google API key
    r"\b(?:ghp|gho|ghs|github_pat)_[A-Za-z0-9_]{20,}",  # GitHub tokens
    r"\bxox[abprs]-[A-Za-z0-9-]{10,}",  # Slack tokens
    r"\bhf_[A-Za-z0-9]{20,}",  # Hugging Face tokens
    # an Authorization header
    f"^[{SPACE_CLASS}]*(?:[Bb][Ee][Aa][Rr][Ee][Rr]|[Bb][Aa][Ss][Ii][Cc])[{SPACE_CLASS}]+"
    f"[^{SPACE_CLASS}]{{8,}}",
)

_NAME_RE = re.compile(NAME_PATTERN)
_MODEL_RE = re.compile(MODEL_PATTERN)
_NOT_BLANK_RE = re.compile(NOT_BLANK_PATTERN)
_URL_RE = re.compile(URL_PATTERN, re.ASCII)
_SECRET_RES = tuple(re.compile(p, re.ASCII) for p in SECRET_PATTERNS)


def looks_like_url(value: str) -> bool:
    return bool(_URL_RE.search(value))


def looks_like_secret(value: str) -> bool:
    return any(p.search(value) for p in _SECRET_RES)


def _refuse_url_or_secret(value: str, what: str) -> str:
    if looks_like_url(value):
        raise ValueError(f"must be {what}, not a URL")
    if looks_like_secret(value):
        raise ValueError(f"must be {what}; it looks like a credential, which a job never carries")
    return value


class Limits(BaseModel):
    """Size limits a spec must respect; configured on the producer and worker side."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_messages: int = Field(default=LIMIT_DEFAULTS.max_messages, gt=0)
    max_prompt_bytes: int = Field(default=LIMIT_DEFAULTS.max_prompt_bytes, gt=0)
    max_budget_tokens: int = Field(default=LIMIT_DEFAULTS.max_budget_tokens, gt=0)
    max_metadata_bytes: int = Field(default=LIMIT_DEFAULTS.max_metadata_bytes, gt=0)
    max_hooks: int = Field(default=LIMIT_DEFAULTS.max_hooks, ge=0)


DEFAULT_LIMITS = Limits()


def _limits(info: ValidationInfo) -> Limits:
    ctx = info.context
    if isinstance(ctx, Mapping):
        limits = ctx.get("limits")
        if isinstance(limits, Limits):
            return limits
    return DEFAULT_LIMITS


class Role(StrEnum):
    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"


class Message(BaseModel):
    """One chat message with text content."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    role: Role = Field(description="Who speaks: `system`, `user` or `assistant`.")
    content: str = Field(description="The message's text.")


def default_floor(budget_tokens: int) -> int:
    """The floor of a job that gives none: :data:`DEFAULT_FLOOR_TOKENS`, or half the budget
    when that is less (a job of 10 tokens resumes with 5 or more left), and never under 1
    (a budget of 1, 2 or 3 has a floor of 1: no floor)."""
    return max(1, min(DEFAULT_FLOOR_TOKENS, budget_tokens // 2))


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
        size = sum(len(m.content.encode("utf-8")) for m in v)
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
        if not _NOT_BLANK_RE.search(v):
            raise ValueError("must not be empty")
        limits = _limits(info)
        size = len(v.encode("utf-8"))
        if size > limits.max_prompt_bytes:
            raise ValueError(f"is {size} bytes, over the limit of {limits.max_prompt_bytes}")
        return v

    @field_validator("provider")
    @classmethod
    def _check_provider(cls, v: str) -> str:
        what = "the name of a provider profile configured on the workers"
        _refuse_url_or_secret(v, what)
        if not _NAME_RE.fullmatch(v):
            raise ValueError(f"must be {what} (letters, digits, '_', '.', '-'; up to 64)")
        return v

    @field_validator("model")
    @classmethod
    def _check_model(cls, v: str) -> str:
        _refuse_url_or_secret(v, "a model name")
        if not _MODEL_RE.fullmatch(v):
            raise ValueError("must be a model name (no white space; up to 200 characters)")
        return v

    @field_validator("budget_tokens")
    @classmethod
    def _check_budget(cls, v: int, info: ValidationInfo) -> int:
        limit = _limits(info).max_budget_tokens
        if v > limit:
            raise ValueError(f"must be at most {limit}, got {v if v < 10**15 else f'{v:.3g}'}")
        return v

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
        budget = info.data.get("budget_tokens")
        if budget is None or v == 1 or v < budget:
            return v
        if budget == 1:
            raise ValueError(f"must be 1 when budget_tokens is 1, got {v}")
        raise ValueError(f"must be less than budget_tokens ({budget}), got {v}")

    @field_validator("idempotency_key")
    @classmethod
    def _check_idempotency_key(cls, v: str | None) -> str | None:
        if v is None:
            return v
        _refuse_url_or_secret(v, "an opaque key")
        if not IDEMPOTENCY_KEY_RE.fullmatch(v):
            raise ValueError("must be 1 to 200 characters from [A-Za-z0-9_.:@/+=-]")
        return v

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
            _refuse_url_or_secret(s, "plain data")
        return v

    @field_validator("hooks")
    @classmethod
    def _check_hooks(cls, v: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        limit = _limits(info).max_hooks
        if len(v) > limit:
            raise ValueError(f"at most {limit} hooks, got {len(v)}")
        for name in v:
            _refuse_url_or_secret(name, "the name of a hook registered on the workers")
            if not _NAME_RE.fullmatch(name):
                raise ValueError(f"hook name {name[:70]!r} must match {_NAME_RE.pattern}")
        if len(set(v)) != len(v):
            raise ValueError("names a hook twice")
        return v

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
        canonical = {
            "v": PROMPT_HASH_VERSION,
            "provider": self.provider,
            "model": self.model,
            "messages": [{"role": m.role.value, "content": m.content} for m in self.chat],
            "params": self.params.model_dump(mode="json", exclude_none=True),
        }
        blob = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()

    def to_json(self) -> str:
        return self.model_dump_json(exclude_defaults=True)


def _strings(value: JsonValue) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, item in value.items() for s in [k, *_strings(item)]]
    if isinstance(value, list):
        return [s for item in value for s in _strings(item)]
    return []


def parse_spec(data: JobSpec | Mapping[str, Any], *, limits: Limits | None = None) -> JobSpec:
    """Validate ``data`` into a JobSpec, or raise :class:`InvalidSpec` naming each field.

    A JobSpec already built is validated again against ``limits`` (which may be tighter
    than the defaults it was built with).
    """
    raw: Any = data.model_dump(exclude_defaults=True) if isinstance(data, JobSpec) else data
    if not isinstance(raw, Mapping):
        raise InvalidSpec([FieldError("spec", f"must be an object, got {type(raw).__name__}")])
    try:
        return JobSpec.model_validate(raw, context={"limits": limits or DEFAULT_LIMITS})
    except ValidationError as exc:
        raise InvalidSpec(_field_errors(exc)) from None


def parse_spec_json(blob: str | bytes, *, limits: Limits | None = None) -> JobSpec:
    """Like :func:`parse_spec`, from JSON text."""
    try:
        data = json.loads(blob)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidSpec([FieldError("spec", f"is not valid JSON: {exc}")]) from None
    return parse_spec(data, limits=limits)


def _field_errors(exc: ValidationError) -> list[FieldError]:
    out = []
    for err in exc.errors(include_url=False, include_input=False):
        loc = ".".join(str(p) for p in err["loc"]) or "spec"
        msg = err["msg"].removeprefix("Value error, ")
        out.append(FieldError(loc, msg))
    return out
