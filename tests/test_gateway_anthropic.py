"""The drop-in Messages endpoint (SPEC §24) through Anthropic's official Python SDK, pointed
at a real ``resumeq serve``: answers equal the fake's canonical ones while the fake cuts each
stream twice; tool calls arrive whole; bad requests get Anthropic's error shape, and nothing
is enqueued."""

from __future__ import annotations

import json
import uuid
from typing import Any

import anthropic
import httpx
import pytest
from gateway_support import TOOLS, Gateway, cut_twice, fresh_fake, gw, key

__all__ = ["fresh_fake", "gw"]  # the fixtures

pytestmark = pytest.mark.timeout(120)

CLAUDE_TOOLS = [
    {"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in TOOLS
]


def ask(prompt: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": prompt}]


def test_a_message_through_two_cuts_is_the_canonical_one(gw: Gateway) -> None:
    prompt = f"Tell me about the Loire, cut twice. {uuid.uuid4().hex}"
    cut_twice(gw)
    done = gw.claude().messages.create(model="claude-sonnet", max_tokens=2000, messages=ask(prompt))
    assert [b.type for b in done.content] == ["text"]
    assert done.content[0].text == gw.canonical(prompt)["text"]  # type: ignore[union-attr]
    assert done.stop_reason == "end_turn" and done.model == "claude-sonnet"
    assert done.usage.output_tokens == gw.canonical(prompt)["count"]
    extension = done.model_extra["resumeq"]  # type: ignore[index]
    assert extension["attempts"] == 3 and gw.job(done.id)["state"] == "done"


def test_a_streamed_message_through_two_cuts_arrives_whole_and_once(gw: Gateway) -> None:
    prompt = f"A table of Loire bridges, streamed. {uuid.uuid4().hex}"
    cut_twice(gw)
    with gw.claude().messages.stream(
        model="fake-anthropic/fake-claude",
        max_tokens=2000,
        system=[{"type": "text", "text": "You answer with tables."}],
        messages=ask(prompt),
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    expected = gw.fake.canonical({"system": "You answer with tables.", "messages": ask(prompt)})
    assert text == expected["text"] and final.content[0].text == text  # type: ignore[union-attr]
    assert final.stop_reason == "end_turn"
    assert final.usage.output_tokens == expected["count"]
    assert final.usage.input_tokens == gw.job(final.id)["attempts"][0]["input_tokens"]


def test_tool_use_arrives_whole_streamed_and_not(gw: Gateway) -> None:
    prompt = f"Weather in Tours for two days? [fake:tool] {uuid.uuid4().hex}"
    uncut = gw.canonical(prompt, tools=TOOLS)
    gw.fake.add_faults([{"kind": "disconnect", "after_tokens": 14}])
    done = gw.claude().messages.create(
        model="claude-sonnet", max_tokens=2000, messages=ask(prompt), tools=CLAUDE_TOOLS
    )
    uses = [b for b in done.content if b.type == "tool_use"]
    assert [(u.name, u.input) for u in uses] == [
        (c["name"], json.loads(c["arguments"])) for c in uncut["tool_calls"]
    ]
    assert done.stop_reason == "tool_use"

    gw.fake.add_faults([{"kind": "disconnect", "after_tokens": 14}])
    with gw.claude().messages.stream(
        model="claude-sonnet", max_tokens=2000, messages=ask(prompt + " again"), tools=CLAUDE_TOOLS
    ) as stream:
        final = stream.get_final_message()
    again = gw.canonical(prompt + " again", tools=TOOLS)["tool_calls"]
    assert [(b.name, b.input) for b in final.content if b.type == "tool_use"] == [
        (c["name"], json.loads(c["arguments"])) for c in again
    ]

    # The app sends the result back, and the conversation goes on.
    follow = gw.claude().messages.create(
        model="claude-sonnet",
        max_tokens=2000,
        tools=CLAUDE_TOOLS,
        messages=[
            *ask(prompt),
            {"role": "assistant", "content": [u.model_dump() for u in uses]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": uses[0].id, "content": "Sunny, 21 C"}
            ]},
        ],
    )  # fmt: skip
    assert follow.content and gw.job(follow.id)["state"] == "done"


def test_a_job_that_ends_otherwise_is_an_error_event_naming_it(gw: Gateway) -> None:
    prompt = f"Refused by the provider. {uuid.uuid4().hex}"
    gw.fake.add_faults([{"kind": "status", "status": 400, "after_tokens": 0}])
    with (
        pytest.raises(anthropic.APIStatusError) as info,
        gw.claude(max_retries=0).messages.stream(
            model="claude-sonnet", max_tokens=100, messages=ask(prompt)
        ) as stream,
    ):
        for _ in stream:
            pass
    assert "ended failed" in str(info.value)


@pytest.mark.parametrize(
    ("over", "param"),
    [
        ({"top_k": 5}, "top_k"),
        ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": 9}, "temperature"),
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
         "messages.0.content.0.type"),
        ({"system": "Be brief.", "messages": [{"role": "user", "content": "x"},
                                              {"role": "narrator", "content": "y"}]},
         "messages.1.role"),
    ],
)  # fmt: skip
def test_a_malformed_request_is_anthropics_400_naming_the_field(
    gw: Gateway, over: dict[str, Any], param: str
) -> None:
    before = gw.jobs()
    body = {"model": "claude-sonnet", "max_tokens": 100, "messages": ask("bad input"), **over}
    with pytest.raises(anthropic.BadRequestError) as info:
        # As sent: this SDK no longer takes some of the parameters it names.
        gw.claude(max_retries=0).post("/v1/messages", body=body, cast_to=anthropic.types.Message)
    error = info.value.body
    assert isinstance(error, dict) and error["type"] == "error", error
    assert error["error"]["type"] == "invalid_request_error"
    assert error["error"]["message"].startswith(param), error
    assert gw.jobs() == before


def test_an_unknown_model_and_a_bad_key_get_anthropics_own_errors(gw: Gateway) -> None:
    before = gw.jobs()
    with pytest.raises(anthropic.NotFoundError) as missing:
        gw.claude(max_retries=0).messages.create(model="claude-9", max_tokens=10, messages=ask("x"))
    assert missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    with pytest.raises(anthropic.AuthenticationError):
        gw.claude("nobody", max_retries=0).messages.create(
            model="claude-sonnet", max_tokens=10, messages=ask("x")
        )
    assert gw.jobs() == before
    # Anthropic's own header, as curl examples send it.
    answered = httpx.post(
        f"{gw.base}/v1/messages",
        headers={"x-api-key": key("web-app"), "anthropic-version": "2023-06-01"},
        json={"model": "claude-sonnet", "messages": ask("x")},
    )
    assert answered.status_code == 400
    assert answered.json()["error"]["message"] == "max_tokens: Field required"
