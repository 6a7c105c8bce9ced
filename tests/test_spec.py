"""JobSpec validation and the prompt hash; refused specs write nothing to Redis."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
import redis

from resumeq.core.errors import InvalidSpec
from resumeq.core.spec import JobSpec, Limits, parse_spec, parse_spec_json
from resumeq.store import Store

SMALL = Limits(max_messages=3, max_prompt_bytes=100, max_budget_tokens=1000, max_metadata_bytes=60)


def valid(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Name three rivers."},
        ],
        "provider": "local",
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "budget_tokens": 500,
    }
    base.update(over)
    return {k: v for k, v in base.items() if v is not DROP}


DROP = object()

# (field the error must name, the change that makes the spec invalid)
INVALID: list[tuple[str, dict[str, Any]]] = [
    ("messages", {"messages": []}),
    ("messages", {"messages": [{"role": "user", "content": "x"}] * 4}),
    ("messages", {"messages": [{"role": "system", "content": "only a system message"}]}),
    ("messages", {"messages": [{"role": "user", "content": "x" * 101}]}),
    ("messages.0.role", {"messages": [{"role": "robot", "content": "x"}]}),
    ("messages.0.content", {"messages": [{"role": "user", "content": 5}]}),
    ("messages.0.name", {"messages": [{"role": "user", "content": "x", "name": "n"}]}),
    ("messages", {"messages": "not a list"}),
    ("prompt", {"prompt": "also a prompt"}),
    ("prompt", {"messages": DROP}),
    ("prompt", {"messages": DROP, "prompt": "   "}),
    ("prompt", {"messages": DROP, "prompt": "é" * 51}),
    ("provider", {"provider": "https://attacker.example/v1"}),
    ("provider", {"provider": "sk-ant-api03-abcdefghijklmnopqrstuvwxyz"}),
    ("provider", {"provider": "my provider"}),
    ("provider", {"provider": ""}),
    ("provider", {"provider": DROP}),
    ("model", {"model": "http://10.0.0.1:8000/v1"}),
    ("model", {"model": "gpt 4"}),
    ("model", {"model": ""}),
    ("budget_tokens", {"budget_tokens": 0}),
    ("budget_tokens", {"budget_tokens": -5}),
    ("budget_tokens", {"budget_tokens": 1001}),
    ("budget_tokens", {"budget_tokens": "lots"}),
    ("budget_tokens", {"budget_tokens": DROP}),
    # JSON's types, strictly: a string, a boolean or a fraction is no integer
    ("budget_tokens", {"budget_tokens": "800"}),
    ("budget_tokens", {"budget_tokens": 800.5}),
    ("budget_tokens", {"budget_tokens": True}),
    ("budget_tokens", {"budget_tokens": 1e30}),
    ("floor_tokens", {"floor_tokens": "10"}),
    ("exit.max_attempts", {"exit": {"max_attempts": "3"}}),
    ("params.seed", {"params": {"seed": "7"}}),
    ("params.seed", {"params": {"seed": 7.5}}),
    ("params.temperature", {"params": {"temperature": "0.5"}}),
    ("params.top_p", {"params": {"top_p": True}}),
    # booleans are true or false: never 0, 1 or "yes"
    ("byte_exact", {"byte_exact": 0}),
    ("require_exact_counts", {"require_exact_counts": "true"}),
    ("exit.droppable", {"exit": {"droppable": 1}}),
    # an identifier is matched whole: not even a final newline
    ("model", {"model": "gpt-4\n"}),
    ("provider", {"provider": "fake\n"}),
    ("hooks", {"hooks": ["audit\n"]}),
    ("prompt", {"messages": DROP, "prompt": "\u3000\x1c\n"}),
    ("model", {"model": "WWW.example.com"}),
    ("floor_tokens", {"floor_tokens": 500}),
    ("floor_tokens", {"floor_tokens": 900}),
    ("floor_tokens", {"floor_tokens": 0}),
    ("params.temperature", {"params": {"temperature": 3}}),
    ("params.top_p", {"params": {"top_p": 0}}),
    ("params.stop", {"params": {"stop": ["a", "b", "c", "d", "e"]}}),
    ("params.logit_bias", {"params": {"logit_bias": {}}}),
    ("exit.on_cut", {"exit": {"on_cut": "retry-forever"}}),
    ("exit.max_attempts", {"exit": {"max_attempts": 0}}),
    ("idempotency_key", {"idempotency_key": ""}),
    ("idempotency_key", {"idempotency_key": "has space"}),
    ("idempotency_key", {"idempotency_key": "https://example.com/cb"}),
    ("metadata", {"metadata": {"note": "x" * 80}}),
    ("metadata", {"metadata": {"callback": "https://example.com/hook"}}),
    ("metadata", {"metadata": {"auth": "Bearer abcdefghijklmnop"}}),
    ("metadata", {"metadata": {"nested": {"k": ["sk-proj-abcdefghijklmnopqrstu"]}}}),
    ("hooks", {"hooks": ["https://example.com/webhook"]}),
    ("hooks", {"hooks": ["notify", "notify"]}),
    ("require_exact_counts", {"require_exact_counts": "sometimes"}),
    ("byte_exact", {"byte_exact": [1]}),
    ("base_url", {"base_url": "https://attacker.example"}),
    ("api_key", {"api_key": "sk-abcdefghijklmnopqrstuvwx"}),
    ("headers", {"headers": {"Authorization": "Bearer x"}}),
]


@pytest.mark.parametrize(
    ("field", "change"), INVALID, ids=[f"{f}-{i}" for i, (f, _) in enumerate(INVALID)]
)
def test_invalid_field_is_named_and_nothing_is_written(
    real_store: Store, redis_client: redis.Redis, field: str, change: dict[str, Any]
) -> None:
    store = Store(redis_client, limits=SMALL)
    with pytest.raises(InvalidSpec) as info:
        store.create(valid(**change))
    assert field in info.value.fields, info.value
    assert field in str(info.value)
    assert list(redis_client.scan_iter("*")) == []


def test_valid_spec_passes_the_small_limits() -> None:
    assert parse_spec(valid(), limits=SMALL).budget_tokens == 500


def test_limits_come_from_the_caller() -> None:
    big = valid(budget_tokens=5000)
    assert parse_spec(big).budget_tokens == 5000
    with pytest.raises(InvalidSpec, match="budget_tokens: must be at most 1000"):
        parse_spec(big, limits=SMALL)
    built = JobSpec.model_validate(big)
    with pytest.raises(InvalidSpec):
        parse_spec(built, limits=SMALL)


def test_every_error_is_reported_at_once() -> None:
    with pytest.raises(InvalidSpec) as info:
        parse_spec(valid(provider="http://x", budget_tokens=0, model=""))
    assert {"provider", "budget_tokens", "model"} <= set(info.value.fields)


def test_not_an_object_or_not_json() -> None:
    with pytest.raises(InvalidSpec, match="spec: must be an object"):
        parse_spec([1, 2])  # type: ignore[arg-type]
    with pytest.raises(InvalidSpec, match="spec: is not valid JSON"):
        parse_spec_json("{nope")
    assert parse_spec_json('{"prompt": "hi", "provider": "p", "model": "m", "budget_tokens": 50}')


def test_defaults() -> None:
    s = parse_spec(valid())
    assert s.floor_tokens == 32 and s.exit.on_cut == "resume" and not s.exit.droppable
    assert not s.require_exact_counts and not s.byte_exact and s.exit.max_attempts == 5


@pytest.mark.parametrize(
    ("budget", "floor"), [(1, 1), (2, 1), (3, 1), (10, 5), (63, 31), (64, 32), (500, 32)]
)
def test_the_default_floor_follows_a_small_budget(budget: int, floor: int) -> None:
    s = parse_spec(valid(budget_tokens=budget))
    assert s.floor_tokens == floor
    assert parse_spec(s).floor_tokens == floor  # and survives being validated again
    assert JobSpec.model_validate_json(s.to_json()).floor_tokens == floor


def test_a_job_with_a_budget_of_one_is_stored_and_read_back(real_store: Store) -> None:
    job_id = real_store.create(valid(budget_tokens=1)).id
    record = real_store.get(job_id)
    assert (record.budget_tokens, record.floor_tokens, record.spec.floor_tokens) == (1, 1, 1)


@pytest.mark.parametrize(
    ("budget", "floor", "message"),
    [
        (10, 10, "floor_tokens: must be less than budget_tokens (10), got 10"),
        (10, 32, "floor_tokens: must be less than budget_tokens (10), got 32"),
        (1, 2, "floor_tokens: must be 1 when budget_tokens is 1, got 2"),
    ],
)
def test_an_explicit_floor_too_high_is_refused(budget: int, floor: int, message: str) -> None:
    with pytest.raises(InvalidSpec) as info:
        parse_spec(valid(budget_tokens=budget, floor_tokens=floor))
    assert info.value.fields == ("floor_tokens",) and str(info.value).endswith(message)


def test_an_explicit_floor_of_one_fits_any_budget() -> None:
    assert parse_spec(valid(budget_tokens=1, floor_tokens=1)).floor_tokens == 1
    assert parse_spec(valid(budget_tokens=2, floor_tokens=1)).floor_tokens == 1


@pytest.mark.parametrize("budget", [0, -5, 1001, "lots", "800", 800.5, False, 1e30, DROP])
def test_a_bad_budget_is_the_only_error_when_no_floor_was_given(budget: object) -> None:
    with pytest.raises(InvalidSpec) as info:
        parse_spec(valid(budget_tokens=budget), limits=SMALL)
    assert info.value.fields == ("budget_tokens",), info.value


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("800", "budget_tokens: must be an integer, not a string ('800')"),
        (800.5, "budget_tokens: must be an integer, got 800.5"),
        (True, "budget_tokens: must be an integer, not a boolean"),
        (1e30, "budget_tokens: must be at most 1000, got 1e+30"),
    ],
)
def test_a_budget_that_is_no_json_integer_is_named_for_what_it_is(
    value: object, message: str
) -> None:
    with pytest.raises(InvalidSpec) as info:
        parse_spec(valid(budget_tokens=value), limits=SMALL)
    assert message in str(info.value)


def test_an_integral_number_is_an_integer_as_json_schema_has_it() -> None:
    spec = parse_spec(
        valid(budget_tokens=800.0, floor_tokens=40.0, params={"seed": 7.0, "temperature": 1}),
    )
    assert (spec.budget_tokens, spec.floor_tokens, spec.params.seed) == (800, 40, 7)
    assert type(spec.budget_tokens) is int and spec.params.temperature == 1.0
    assert parse_spec(valid(budget_tokens=500.0)) == parse_spec(valid())  # the same spec


# -- prompt hash -------------------------------------------------------------------------


def base_hash(**over: Any) -> str:
    return parse_spec(valid(**over)).prompt_hash()


def test_prompt_and_its_message_form_hash_the_same() -> None:
    a = parse_spec({"prompt": "hi", "provider": "p", "model": "m", "budget_tokens": 50})
    b = parse_spec(
        {
            "messages": [{"role": "user", "content": "hi"}],
            "provider": "p",
            "model": "m",
            "budget_tokens": 50,
        }
    )
    assert a.prompt_hash() == b.prompt_hash()


@pytest.mark.parametrize(
    "change",
    [
        {"provider": "other"},
        {"model": "other-model"},
        {"messages": [{"role": "user", "content": "Name three rivers!"}]},
        {"params": {"temperature": 0.5}},
        {"params": {"seed": 7}},
        {"params": {"stop": ["\n"]}},
    ],
)
def test_what_determines_the_answer_changes_the_hash(change: dict[str, Any]) -> None:
    assert base_hash(**change) != base_hash()


@pytest.mark.parametrize(
    "change",
    [
        {"budget_tokens": 900},
        {"floor_tokens": 10},
        {"metadata": {"user": 42}},
        {"idempotency_key": "k-1"},
        {"exit": {"on_cut": "spill"}},
        {"hooks": ["notify"]},
    ],
)
def test_what_does_not_determine_the_answer_keeps_the_hash(change: dict[str, Any]) -> None:
    assert base_hash(**change) == base_hash()


def test_hash_is_stable() -> None:
    s = parse_spec({"prompt": "hi", "provider": "p", "model": "m", "budget_tokens": 50})
    # The canonical form is a contract: changing it would orphan every stored cursor.
    canonical = (
        '{"messages":[{"content":"hi","role":"user"}],"model":"m","params":{},"provider":"p","v":1}'
    )
    assert s.prompt_hash() == hashlib.sha256(canonical.encode()).hexdigest()
