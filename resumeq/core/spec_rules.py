"""A job spec's rules that need no model: what a name, a model, a key or a prompt may be,
the default floor, the canonical prompt hash — and :func:`quick_spec`, which applies them to
the plain specs a command line makes.

:class:`~resumeq.core.spec.JobSpec` validates with these same functions. :func:`quick_spec` takes
only what it can decide exactly as the model would (a prompt, the names, the budget and
floor, the exit policy, an idempotency key, each of its JSON type): anything else, and every
spec the rules refuse, it leaves to the model, whose errors name each field. So
``resumeq enqueue`` writes a job without loading pydantic (tests/test_imports.py), and
tests/test_spec_rules.py holds it to the model's answers.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from resumeq.core.names import IDEMPOTENCY_KEY_RE

if TYPE_CHECKING:
    from resumeq.core.defaults import LimitDefaults
    from resumeq.core.spec import JobSpec, Limits

#: Version of the canonical form hashed by :func:`prompt_hash`: 1 for a conversation of plain
#: text messages, 2 once tools, a tool choice, a response format or tool messages enter it (a
#: job queued before them keeps the hash it was made with).
PROMPT_HASH_VERSION = 2
#: The floor of a job that gives none, unless its budget is under twice this.
DEFAULT_FLOOR_TOKENS = 32
#: The exit policy's fields and their defaults (:class:`~resumeq.core.spec.ExitPolicy`).
ON_CUT = ("resume", "abandon", "spill")
ON_INVALID = ("retry", "spill", "fail")
EXIT_DEFAULTS: dict[str, Any] = {
    "on_cut": "resume",
    "droppable": False,
    "max_attempts": 5,
    "on_invalid": "spill",
}
MAX_ATTEMPTS = 50

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

#: A function's name (a tool's, a tool call's) and a response format's, as OpenAI has them.
TOOL_NAME_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
#: A tool call's id: OpenAI's ``call_…``, Anthropic's ``toolu_…``, the Responses API's.
TOOL_CALL_ID_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"

NAME_RE = re.compile(NAME_PATTERN)
TOOL_NAME_RE = re.compile(TOOL_NAME_PATTERN)
TOOL_CALL_ID_RE = re.compile(TOOL_CALL_ID_PATTERN)
_MODEL_RE = re.compile(MODEL_PATTERN)
_NOT_BLANK_RE = re.compile(NOT_BLANK_PATTERN)
_URL_RE = re.compile(URL_PATTERN, re.ASCII)
_SECRET_RES = tuple(re.compile(p, re.ASCII) for p in SECRET_PATTERNS)


_PROVIDER = "the name of a provider profile configured on the workers"


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


def looks_like_url(value: str) -> bool:
    return bool(_URL_RE.search(value))


def looks_like_secret(value: str) -> bool:
    return any(p.search(value) for p in _SECRET_RES)


def refuse_url_or_secret(value: str, what: str) -> str:
    if looks_like_url(value):
        raise ValueError(f"must be {what}, not a URL")
    if looks_like_secret(value):
        raise ValueError(f"must be {what}; it looks like a credential, which a job never carries")
    return value


class AtPath(ValueError):
    """A refusal inside a field: ``path`` (dotted, from the field) says where, ``reason``
    why. The model reports it at the field's location followed by the path, so an error
    deep in a JSON Schema names the keyword it is about."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}" if path else reason)
        self.path = path
        self.reason = reason

    def under(self, prefix: str) -> AtPath:
        """The same refusal, seen from ``prefix`` up."""
        return AtPath(f"{prefix}.{self.path}" if self.path else prefix, self.reason)


def json_size(value: Any) -> int:
    """The bytes of ``value`` as compact JSON in UTF-8 (how a limit on JSON measures it)."""
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))


def default_floor(budget_tokens: int) -> int:
    """The floor of a job that gives none: :data:`DEFAULT_FLOOR_TOKENS`, or half the budget
    when that is less (a job of 10 tokens resumes with 5 or more left), and never under 1
    (a budget of 1, 2 or 3 has a floor of 1: no floor)."""
    return max(1, min(DEFAULT_FLOOR_TOKENS, budget_tokens // 2))


# Each rule answers the value, or raises ValueError with the message the field shows.


def check_prompt(v: str, limit: int) -> str:
    if not _NOT_BLANK_RE.search(v):
        raise ValueError("must not be empty")
    size = len(v.encode("utf-8"))
    if size > limit:
        raise ValueError(f"is {size} bytes, over the limit of {limit}")
    return v


def check_provider(v: str) -> str:
    refuse_url_or_secret(v, _PROVIDER)
    if not NAME_RE.fullmatch(v):
        raise ValueError(f"must be {_PROVIDER} (letters, digits, '_', '.', '-'; up to 64)")
    return v


def check_model(v: str) -> str:
    refuse_url_or_secret(v, "a model name")
    if not _MODEL_RE.fullmatch(v):
        raise ValueError("must be a model name (no white space; up to 200 characters)")
    return v


def check_budget(v: int, limit: int) -> int:
    """A budget past its ``gt=0`` bound, against the limit."""
    if v > limit:
        raise ValueError(f"must be at most {limit}, got {v if v < 10**15 else f'{v:.3g}'}")
    return v


def check_floor(v: int, budget: int | None) -> int:
    """A floor past its ``ge=1`` bound, against the budget (None: the budget was refused)."""
    if budget is None or v == 1 or v < budget:
        return v
    if budget == 1:
        raise ValueError(f"must be 1 when budget_tokens is 1, got {v}")
    raise ValueError(f"must be less than budget_tokens ({budget}), got {v}")


def check_tool_name(v: str, what: str = "a function's name") -> str:
    refuse_url_or_secret(v, what)
    if not TOOL_NAME_RE.fullmatch(v):
        raise ValueError(f"must be {what}: 1 to 64 of letters, digits, '_' and '-'")
    return v


def check_tool_call_id(v: str) -> str:
    refuse_url_or_secret(v, "a tool call's id")
    if not TOOL_CALL_ID_RE.fullmatch(v):
        raise ValueError("must be a tool call's id: 1 to 64 of letters, digits, '_' and '-'")
    return v


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def check_arguments(v: str) -> str:
    """A tool call's arguments: the text of one JSON object (as OpenAI sends them)."""
    try:
        value = json.loads(v, parse_constant=_no_constant)
    except ValueError as exc:
        raise ValueError(f"must be a JSON object, as text: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"must be a JSON object, as text, not {json_type(value)}")
    return v


def json_type(value: Any) -> str:
    """What JSON calls the type of ``value`` (a value ``json.loads`` made)."""
    if value is None or isinstance(value, bool):
        return "null" if value is None else "a boolean"
    if isinstance(value, dict | list | str):
        return {dict: "an object", list: "an array", str: "a string"}[type(value)]
    return "a number"


def check_idempotency_key(v: str) -> str:
    refuse_url_or_secret(v, "an opaque key")
    if not IDEMPOTENCY_KEY_RE.fullmatch(v):
        raise ValueError("must be 1 to 200 characters from [A-Za-z0-9_.:@/+=-]")
    return v


def prompt_hash(
    provider: str,
    model: str,
    messages: Sequence[Mapping[str, Any]],
    params: Mapping[str, Any],
    shape: Mapping[str, Any] | None = None,
) -> str:
    """SHA-256 over a canonical JSON of what determines the answer: provider, model, the
    messages (``role``, ``content``, and any ``tool_calls`` / ``tool_call_id``), the
    generation parameters that are set, and the answer's shape (``tools``, ``tool_choice``,
    ``response_format``). A spec with none of the newer parts hashes as version 1 did."""
    plain = not shape and all(set(m) <= {"role", "content"} for m in messages)
    canonical: dict[str, Any] = {
        "v": 1 if plain else PROMPT_HASH_VERSION,
        "provider": provider,
        "model": model,
        "messages": [dict(m) for m in messages],
        "params": dict(params),
    }
    if not plain:
        canonical["shape"] = dict(shape or {})
    blob = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class CheckedSpec:
    """A valid spec, as the store writes it: its canonical JSON (the model's, without its
    defaults), its prompt hash, and the fields the job record keeps beside it."""

    json: str
    prompt_hash: str
    budget_tokens: int
    floor_tokens: int
    idempotency_key: str | None

    @classmethod
    def of(cls, spec: JobSpec) -> CheckedSpec:
        return cls(
            spec.to_json(),
            spec.prompt_hash(),
            spec.budget_tokens,
            spec.floor_tokens,
            spec.idempotency_key,
        )


_QUICK_FIELDS = frozenset(
    {"prompt", "provider", "model", "budget_tokens", "floor_tokens", "exit", "idempotency_key"}
)
_REQUIRED = frozenset({"prompt", "provider", "model", "budget_tokens"})


def quick_spec(data: Mapping[str, Any], limits: Limits | LimitDefaults) -> CheckedSpec | None:
    """``data`` checked by the rules alone, as :func:`~resumeq.core.spec.parse_spec` would
    accept and write it; None for a spec this cannot decide or that the rules refuse (the
    model then says why)."""
    if not _plain(data):
        return None
    exit_out = _quick_exit(data.get("exit", {}))
    prompt, provider, model = data["prompt"], data["provider"], data["model"]
    budget, key = data["budget_tokens"], data.get("idempotency_key")
    floor = data.get("floor_tokens", default_floor(budget))
    try:
        check_prompt(prompt, limits.max_prompt_bytes)
        check_provider(provider)
        check_model(model)
        if exit_out is None or budget <= 0 or floor < 1:
            return None
        check_budget(budget, limits.max_budget_tokens)
        check_floor(floor, budget)
        if key is not None:
            check_idempotency_key(key)
    except ValueError:
        return None
    out: dict[str, Any] = {
        "prompt": prompt,
        "provider": provider,
        "model": model,
        "budget_tokens": budget,
    }
    if floor != DEFAULT_FLOOR_TOKENS:
        out["floor_tokens"] = floor
    if exit_out:
        out["exit"] = exit_out
    if key is not None:
        out["idempotency_key"] = key
    messages = [{"role": "user", "content": prompt}]
    return CheckedSpec(
        json.dumps(out, ensure_ascii=False, separators=(",", ":")),
        prompt_hash(provider, model, messages, {}),
        budget,
        floor,
        key,
    )


def _plain(data: Mapping[str, Any]) -> bool:
    """Whether ``data`` holds only the fields :func:`quick_spec` takes, each of its JSON
    type (an int that is no bool, a str, an object)."""
    return (
        _REQUIRED <= data.keys() <= _QUICK_FIELDS
        and all(type(data[k]) is str for k in ("prompt", "provider", "model"))
        and all(type(data[k]) is int for k in ("budget_tokens", "floor_tokens") if k in data)
        and ("idempotency_key" not in data or type(data["idempotency_key"]) is str)
        and type(data.get("exit", {})) is dict
    )


def _quick_exit(policy: Mapping[str, Any]) -> dict[str, Any] | None:
    """The exit policy's fields that are not defaults, in the model's order; None for one
    the rules cannot take."""
    if not policy.keys() <= EXIT_DEFAULTS.keys():
        return None
    chosen = {k: policy.get(k, default) for k, default in EXIT_DEFAULTS.items()}
    on_cut, droppable = chosen["on_cut"], chosen["droppable"]
    attempts, on_invalid = chosen["max_attempts"], chosen["on_invalid"]
    if not (
        type(on_cut) is str
        and on_cut in ON_CUT
        and type(droppable) is bool
        and type(attempts) is int
        and 1 <= attempts <= MAX_ATTEMPTS
        and type(on_invalid) is str
        and on_invalid in ON_INVALID
    ):
        return None
    return {k: v for k, v in chosen.items() if v != EXIT_DEFAULTS[k]}
