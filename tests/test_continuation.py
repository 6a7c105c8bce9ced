"""Planning an attempt's request (pure) and parsing Retry-After."""

from __future__ import annotations

import email.utils
from typing import Any

import pytest
from pydantic import ValidationError

from resumeq.core.continuation import PARTIAL_CLOSE, PARTIAL_OPEN, plan_request, tail_pieces
from resumeq.core.settings import ProviderProfile
from resumeq.core.spec import parse_spec
from resumeq.providers import parse_retry_after

SPEC = parse_spec(
    {
        "messages": [
            {"role": "system", "content": "Be terse."},
            {"role": "user", "content": "First question"},
            {"role": "assistant", "content": "First answer"},
            {"role": "user", "content": "Second question"},
        ],
        "provider": "p",
        "model": "m",
        "budget_tokens": 500,
    }
)


def prof(**over: Any) -> ProviderProfile:
    return ProviderProfile.model_validate({"kind": "openai", "base_url": "http://h/v1", **over})


def test_no_prefix_is_the_original_request_with_the_whole_budget() -> None:
    plan = plan_request(SPEC, prof(), prefix="", remaining_tokens=500)
    assert plan.kind == "fresh" and plan.max_tokens == 500
    assert [m.content for m in plan.messages] == [m.content for m in SPEC.chat]


def test_a_prefix_is_never_answered_with_the_original_request() -> None:
    for mode in ("prefill", "prefill_flag", "continue_final_message", "instruction"):
        plan = plan_request(SPEC, prof(continue_mode=mode), prefix="So far", remaining_tokens=9)
        assert plan.kind == "resume" and plan.max_tokens == 9
        assert len(plan.messages) == len(SPEC.chat) + 1
        assert "So far" in plan.messages[-1].content


def test_instruction_block() -> None:
    plan = plan_request(SPEC, prof(), prefix="Half a sentence ", remaining_tokens=9)
    last = plan.messages[-1]
    assert last.role == "user"
    assert last.content.endswith(f"{PARTIAL_OPEN}Half a sentence {PARTIAL_CLOSE}")


def test_tail_context_keeps_system_and_the_last_request() -> None:
    plan = plan_request(
        SPEC, prof(resume_context="tail:2"), prefix="one two three four", remaining_tokens=9
    )
    assert [m.content for m in plan.messages[:2]] == ["Be terse.", "Second question"]
    assert plan.messages[-1].content.endswith(f"{PARTIAL_OPEN} three four{PARTIAL_CLOSE}")


def test_anthropic_prefill_trims_trailing_white_space() -> None:
    p = ProviderProfile(kind="anthropic", base_url="http://h", continue_mode="prefill")
    plan = plan_request(SPEC, p, prefix="Words here \n", remaining_tokens=9)
    assert plan.messages[-1].content == "Words here" and plan.trimmed == " \n"
    openai_plan = plan_request(SPEC, prof(continue_mode="prefill"), prefix="x ", remaining_tokens=9)
    assert openai_plan.messages[-1].content == "x " and openai_plan.trimmed == ""


def test_remaining_must_be_positive() -> None:
    with pytest.raises(ValueError, match="remaining_tokens"):
        plan_request(SPEC, prof(), prefix="x", remaining_tokens=0)


@pytest.mark.parametrize(("text", "n", "tail"), [
    ("a b c d", 2, " c d"), ("a b", 5, "a b"), ("Hi, there!", 2, " there!"), ("x", 0, ""),
])  # fmt: skip
def test_tail_pieces(text: str, n: int, tail: str) -> None:
    assert tail_pieces(text, n) == tail


def test_anthropic_profiles_only_prefill_or_instruction() -> None:
    with pytest.raises(ValidationError, match="not an Anthropic mode"):
        ProviderProfile(kind="anthropic", base_url="http://h", continue_mode="prefill_flag")


def test_retry_after_seconds_date_and_ms() -> None:
    assert parse_retry_after({"retry-after": "2"}) == 2.0
    assert parse_retry_after({"retry-after": "1.5"}) == 1.5
    now = 1_800_000_000.0
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert parse_retry_after({"retry-after": date}, now=now) == pytest.approx(30, abs=1)
    past = email.utils.formatdate(now - 30, usegmt=True)
    assert parse_retry_after({"retry-after": past}, now=now) == 0.0
    assert parse_retry_after({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert parse_retry_after({}) is None
