"""The rules without the model: quick_spec decides a plain spec exactly as parse_spec does
(the same JSON, the same hash, the same record fields), or leaves it to the model; and it
decides the specs a command line makes."""

from __future__ import annotations

import typing
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resumeq.core.defaults import LIMIT_DEFAULTS
from resumeq.core.errors import InvalidSpec
from resumeq.core.spec import ExitPolicy, JobSpec, Limits, parse_spec
from resumeq.core.spec_rules import (
    DEFAULT_FLOOR_TOKENS,
    EXIT_DEFAULTS,
    MAX_ATTEMPTS,
    ON_CUT,
    ON_INVALID,
    CheckedSpec,
    quick_spec,
)

SMALL = Limits(max_prompt_bytes=40, max_budget_tokens=300)


def decided(data: dict[str, Any], limits: Limits) -> CheckedSpec | None:
    """What parse_spec makes of ``data``, as the store writes it (None: refused)."""
    try:
        return CheckedSpec.of(parse_spec(data, limits=limits))
    except InvalidSpec:
        return None


names = st.sampled_from(["local", "m", "a.b-c_d", "gpt-4o", "x" * 64, "x" * 65, "my name", ""])
models = st.sampled_from(["m", "meta-llama/Llama-3.1-8B:q4@x+y", "gpt 4", "https://h/v1", ""])
secrets = st.sampled_from(["sk-" + "a" * 20, "www.example.com", "bearer abcdefghij", "//h"])
texts = st.text(max_size=12) | st.sampled_from([" ", "\n", "é" * 21, "\udcff", "a\u2028b\x00"])
integers = st.integers(-3, 400) | st.sampled_from([32, 2**63, 10**16])
not_integers = st.booleans() | st.floats(allow_nan=False) | st.just(None) | st.just("5")
keys = st.sampled_from(["k1", "order:42/a+b=", "x" * 200, "x" * 201, "bad key", ""])
exits = st.dictionaries(
    st.sampled_from([*EXIT_DEFAULTS, "other"]),
    st.sampled_from([*ON_CUT, *ON_INVALID, "stop", True, False, 0, 1, 5, 50, 51, None]),
    max_size=4,
)
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
fields = {
    "prompt": texts | secrets | st.just("hello"),
    "provider": names | secrets | texts,
    "model": models | names | secrets,
    "budget_tokens": integers | not_integers,
    "floor_tokens": integers | not_integers,
    "exit": exits | st.just(None) | st.just([]),
    "idempotency_key": keys | secrets | st.just(None),
    "params": st.just({}),
    "metadata": st.just({"a": 1}),
    "messages": st.just([{"role": "user", "content": "hi"}]),
    # the shape of the answer: the model's alone to decide, valid or not
    "tools": st.sampled_from([[TOOL], [], None, [{"function": {"name": "a b"}}]]),
    "tool_choice": st.sampled_from(["auto", "none", "required", "any", None]),
    "response_format": st.sampled_from([{"type": "json_object"}, {"type": "json_schema"}, None]),
}
VALID: dict[str, Any] = {"prompt": "hello", "provider": "local", "model": "m", "budget_tokens": 50}


@st.composite
def specs(draw: st.DrawFn) -> dict[str, Any]:
    """A valid spec with a field or two changed, added or dropped."""
    changed = draw(st.lists(st.sampled_from(sorted(fields)), max_size=2, unique=True))
    dropped = draw(st.lists(st.sampled_from(sorted(VALID)), max_size=1))
    data = {**VALID, **{name: draw(fields[name]) for name in changed}}
    return {k: v for k, v in data.items() if k not in dropped}


@settings(max_examples=1000, deadline=None)
@given(data=specs(), small=st.booleans())
def test_quick_spec_decides_as_the_model_does_or_not_at_all(
    data: dict[str, Any], small: bool
) -> None:
    limits = SMALL if small else Limits()
    quick = quick_spec(data, SMALL if small else LIMIT_DEFAULTS)
    if quick is not None:
        assert quick == decided(data, limits)


@settings(max_examples=300, deadline=None)
@given(
    prompt=st.text(min_size=1, max_size=60).filter(str.strip),
    budget=st.integers(1, 300),
    floor=st.none() | st.integers(1, 300),
    exit_policy=st.fixed_dictionaries(
        {},
        optional={
            "on_cut": st.sampled_from(ON_CUT),
            "droppable": st.booleans(),
            "max_attempts": st.integers(1, MAX_ATTEMPTS),
            "on_invalid": st.sampled_from(ON_INVALID),
        },
    ),
    key=st.none() | st.from_regex(r"[A-Za-z0-9_.:@/+=-]{1,40}", fullmatch=True),
)
def test_a_command_lines_spec_is_decided_without_the_model(
    prompt: str, budget: int, floor: int | None, exit_policy: dict[str, Any], key: str | None
) -> None:
    """What ``resumeq enqueue`` sends: a prompt, the names, the numbers, the exit policy
    and a key, each of its type. Valid, quick_spec writes it as the model would."""
    data: dict[str, Any] = {
        "prompt": prompt,
        "provider": "local",
        "model": "m",
        "budget_tokens": budget,
    }
    if floor is not None:
        data["floor_tokens"] = floor
    if exit_policy:
        data["exit"] = exit_policy
    if key is not None:
        data["idempotency_key"] = key
    assert quick_spec(data, SMALL) == decided(data, SMALL)


def test_the_rules_hold_the_models_defaults_and_bounds() -> None:
    assert ExitPolicy().model_dump() == EXIT_DEFAULTS
    assert typing.get_args(ExitPolicy.model_fields["on_cut"].annotation) == ON_CUT
    assert typing.get_args(ExitPolicy.model_fields["on_invalid"].annotation) == ON_INVALID
    bounds = {type(m).__name__: m for m in ExitPolicy.model_fields["max_attempts"].metadata}
    assert getattr(bounds["Le"], "le") == MAX_ATTEMPTS  # noqa: B009
    assert JobSpec.model_fields["floor_tokens"].default == DEFAULT_FLOOR_TOKENS


@pytest.mark.parametrize(
    "data",
    [
        {"prompt": "hi", "provider": "p", "model": "m", "budget_tokens": 10},
        {"prompt": "hi", "provider": "p", "model": "m", "budget_tokens": 100, "floor_tokens": 32},
        {
            "prompt": 'hé\n"\\',
            "provider": "p",
            "model": "m",
            "budget_tokens": 100,
            "exit": {"on_cut": "spill", "droppable": True, "max_attempts": 5},
            "idempotency_key": "k:1",
        },
        {
            "prompt": "hi",
            "provider": "p",
            "model": "m",
            "budget_tokens": 10,
            "exit": {"on_invalid": "fail", "max_attempts": 2},
        },
        {
            "prompt": "hi",
            "provider": "p",
            "model": "m",
            "budget_tokens": 10,
            "exit": {"on_invalid": "spill"},
        },
    ],
)
def test_the_json_and_the_hash_are_the_models(data: dict[str, Any]) -> None:
    spec = parse_spec(data)
    quick = quick_spec(data, LIMIT_DEFAULTS)
    assert quick is not None
    assert (quick.json, quick.prompt_hash) == (spec.to_json(), spec.prompt_hash())


@pytest.mark.parametrize(
    "shape",
    [
        {"tools": [TOOL]},
        {"tool_choice": "none"},
        {"response_format": {"type": "json_object"}},
        {"tools": None},
    ],
)
def test_a_spec_with_the_shape_of_an_answer_is_left_to_the_model(shape: dict[str, Any]) -> None:
    data = {**VALID, **shape}
    assert quick_spec(data, LIMIT_DEFAULTS) is None
    assert decided(data, Limits()) is not None  # valid: the model writes it
