"""What every part of a job spec's model validates with: JSON's own integers, numbers and
booleans, the :class:`Limits`, and how a validator reads its context (the limits, and
whether the spec is being enqueued or read back from a job record) and reports a refusal
deep inside a field (:class:`~resumeq.core.spec_rules.AtPath`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo
from pydantic_core import PydanticCustomError

from resumeq.core.defaults import LIMIT_DEFAULTS
from resumeq.core.spec_rules import AtPath, json_boolean, json_integer, json_number

#: Integer, number and boolean fields of a job spec, as strict as JSON is.
JsonInt = Annotated[int, BeforeValidator(json_integer)]
JsonFloat = Annotated[float, BeforeValidator(json_number)]
JsonBool = Annotated[bool, BeforeValidator(json_boolean)]

#: The error type of a refusal inside a field; :func:`~resumeq.core.spec.parse_spec` puts
#: its path after the field's location.
AT_PATH = "at_path"


class Limits(BaseModel):
    """Size limits a spec must respect; configured on the producer and worker side."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_messages: int = Field(default=LIMIT_DEFAULTS.max_messages, gt=0)
    max_prompt_bytes: int = Field(default=LIMIT_DEFAULTS.max_prompt_bytes, gt=0)
    max_budget_tokens: int = Field(default=LIMIT_DEFAULTS.max_budget_tokens, gt=0)
    max_metadata_bytes: int = Field(default=LIMIT_DEFAULTS.max_metadata_bytes, gt=0)
    max_hooks: int = Field(default=LIMIT_DEFAULTS.max_hooks, ge=0)
    max_tools: int = Field(default=LIMIT_DEFAULTS.max_tools, ge=0)
    max_schema_bytes: int = Field(default=LIMIT_DEFAULTS.max_schema_bytes, gt=0)


DEFAULT_LIMITS = Limits()


def limits_of(info: ValidationInfo) -> Limits:
    """The limits the caller validates with (``context={"limits": ...}``), else the defaults."""
    ctx = info.context
    if isinstance(ctx, Mapping):
        limits = ctx.get("limits")
        if isinstance(limits, Limits):
            return limits
    return DEFAULT_LIMITS


def at_enqueue(info: ValidationInfo) -> bool:
    """Whether the spec is being enqueued, not read back from a job record
    (``context={"stored": True}``). A stored spec passed enqueue's rules when it was
    written; rules added or tightened since (a JSON Schema's checks, which also follow the
    jsonschema release) must not make a queued job unreadable."""
    ctx = info.context
    return not (isinstance(ctx, Mapping) and ctx.get("stored") is True)


def at_path(exc: AtPath, prefix: str = "") -> PydanticCustomError:
    """``exc`` as the model reports it: at the field's location, then ``prefix.path``."""
    found = exc.under(prefix) if prefix else exc
    return PydanticCustomError(AT_PATH, "{reason}", {"path": found.path, "reason": found.reason})
