"""Continuations in every form: cut at token k, continue with the prefix, get the rest exactly."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest

from resumeq.fake import PARTIAL_CLOSE, PARTIAL_OPEN, FakeProvider

pytestmark = pytest.mark.timeout(20)

SYSTEM = {"role": "system", "content": "You write tersely."}
USER = {"role": "user", "content": "Tell me about lighthouses."}
MESSAGES = [SYSTEM, USER]
FORMS = ["prefill", "prefill_flag", "continue_final_message", "instruction"]
INSTRUCTION = "Continue the text below exactly where it stops, without repeating any of it.\n"


@pytest.fixture(scope="module")
def server() -> Iterator[FakeProvider]:
    with FakeProvider(completion_tokens=300) as fake:
        yield fake


@pytest.fixture
def fake(server: FakeProvider) -> FakeProvider:
    server.reset()
    return server


@pytest.fixture
def http(fake: FakeProvider) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=fake.url, timeout=10) as client:
        yield client


def continuation_body(form: str, prefix: str, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "m", "stream": True, **extra}
    if form == "instruction":
        tail = {"role": "user", "content": INSTRUCTION + PARTIAL_OPEN + prefix + PARTIAL_CLOSE}
        body["messages"] = [*MESSAGES, tail]
        return body
    assistant: dict[str, Any] = {"role": "assistant", "content": prefix}
    if form == "prefill_flag":
        assistant["prefix"] = True
    if form == "continue_final_message":
        body |= {"continue_final_message": True, "add_generation_prompt": False}
    body["messages"] = [*MESSAGES, assistant]
    return body


def openai_stream(http: httpx.Client, body: dict[str, Any]) -> tuple[str, str | None]:
    """Text and finish reason of an OpenAI-wire stream; raises if the stream is cut."""
    text, finish, done = "", None, False
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                continue
            chunk = json.loads(line[len("data: ") :])
            for choice in chunk["choices"]:
                text += choice["delta"].get("content") or ""
                finish = choice["finish_reason"] or finish
    assert done
    return text, finish


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("cut", [1, 2, 57, 299])
@pytest.mark.parametrize("context", ["full", "tail:8", "tail:3"])
def test_continuation_yields_the_rest_of_the_canonical_text(
    fake: FakeProvider, http: httpx.Client, form: str, cut: int, context: str
) -> None:
    tokens = fake.canonical_tokens(MESSAGES)
    stored = "".join(tokens[:cut])
    sent = stored if context == "full" else "".join(tokens[:cut][-int(context[5:]) :])
    text, finish = openai_stream(http, continuation_body(form, sent))
    assert stored + text == fake.canonical_text(MESSAGES)
    assert finish == "stop"
    entry = fake.journal()[-1]
    assert entry["is_continuation"] and entry["continuation"]["mode"] == form
    assert entry["output_tokens_billed"] == len(tokens) - cut


@pytest.mark.parametrize("form", FORMS)
def test_max_tokens_counts_from_the_continuation_point(
    fake: FakeProvider, http: httpx.Client, form: str
) -> None:
    tokens = fake.canonical_tokens(MESSAGES)
    stored = "".join(tokens[:40])
    text, finish = openai_stream(http, continuation_body(form, stored, max_tokens=25))
    assert text == "".join(tokens[40:65])
    assert finish == "length"
    rest, finish = openai_stream(http, continuation_body(form, stored + text, max_tokens=500))
    assert stored + text + rest == fake.canonical_text(MESSAGES) and finish == "stop"


def test_a_real_cut_then_a_continuation_splices_byte_for_byte(
    fake: FakeProvider, http: httpx.Client
) -> None:
    fake.add_faults([{"kind": "disconnect", "after_tokens": 123}])
    received = ""
    body = {"model": "m", "messages": MESSAGES, "stream": True}
    with (
        pytest.raises(httpx.RemoteProtocolError),
        http.stream("POST", "/v1/chat/completions", json=body) as response,
    ):
        for line in response.iter_lines():
            if line.startswith("data: {"):
                received += json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
    assert fake.journal()[-1]["output_tokens_billed"] == 123
    text, finish = openai_stream(http, continuation_body("instruction", received))
    assert received + text == fake.canonical_text(MESSAGES) and finish == "stop"


def test_a_prefix_cut_inside_a_token_resumes_with_the_rest_of_that_token(
    fake: FakeProvider, http: httpx.Client
) -> None:
    tokens = fake.canonical_tokens(MESSAGES)
    index = next(i for i in range(20, 200) if len(tokens[i]) >= 6)
    stored = "".join(tokens[:index]) + tokens[index][:3]
    text, _ = openai_stream(http, continuation_body("prefill", stored, max_tokens=2))
    assert text == tokens[index][3:] + tokens[index + 1]


def test_a_whole_prefix_leaves_nothing_to_generate(fake: FakeProvider, http: httpx.Client) -> None:
    text, finish = openai_stream(http, continuation_body("prefill", fake.canonical_text(MESSAGES)))
    assert (text, finish) == ("", "stop")


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
def test_a_prefix_that_is_not_canonical_is_refused(
    fake: FakeProvider, http: httpx.Client, path: str
) -> None:
    body = continuation_body("instruction", "Words the model never wrote", max_tokens=10)
    if path == "/v1/messages":
        body["system"] = SYSTEM["content"]
        body["messages"] = body["messages"][1:]
    response = http.post(path, json=body)
    assert response.status_code == 400
    assert "not part of the canonical text" in response.text
    assert fake.journal(settle_s=5)[-1]["outcome"] == "invalid_request"


# -- Anthropic prefill, white space trimmed ----------------------------------------------------


@pytest.fixture
def claude(fake: FakeProvider) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(
        base_url=fake.anthropic_base_url, api_key="x", max_retries=0
    ) as client:
        yield client


def anthropic_continue(
    claude: anthropic.Anthropic, final: dict[str, Any], max_tokens: int = 4096
) -> tuple[str, str | None]:
    with claude.messages.stream(
        model="claude-x",
        max_tokens=max_tokens,
        system=SYSTEM["content"],
        messages=[USER, final],  # type: ignore[list-item]
    ) as stream:
        text = "".join(stream.text_stream)
        return text, stream.get_final_message().stop_reason


@pytest.mark.parametrize("tail", [None, 5])
def test_anthropic_prefill_with_trimmed_white_space(
    fake: FakeProvider, claude: anthropic.Anthropic, tail: int | None
) -> None:
    tokens = fake.canonical_tokens(MESSAGES)
    cut = tokens.index("\n\n") + 1  # the stored prefix ends in white space
    stored = "".join(tokens[:cut])
    sent = "".join(tokens[cut - tail : cut] if tail else tokens[:cut]).rstrip()
    assert stored.endswith("\n\n") and not sent.endswith("\n")
    text, stop = anthropic_continue(claude, {"role": "assistant", "content": sent})
    assert text.startswith("\n\n")
    assert stored.rstrip() + text == fake.canonical_text(MESSAGES)
    assert stop == "end_turn"
    assert fake.journal()[-1]["continuation"]["mode"] == "prefill"


def test_anthropic_instruction_continuation_with_max_tokens(
    fake: FakeProvider, claude: anthropic.Anthropic
) -> None:
    tokens = fake.canonical_tokens(MESSAGES)
    stored = "".join(tokens[:90])
    block = INSTRUCTION + PARTIAL_OPEN + "".join(tokens[82:90]) + PARTIAL_CLOSE
    final = {"role": "user", "content": [{"type": "text", "text": block}]}
    text, stop = anthropic_continue(claude, final, max_tokens=10)
    assert stop == "max_tokens" and text == "".join(tokens[90:100])
    text, stop = anthropic_continue(claude, final)
    assert stored + text == fake.canonical_text(MESSAGES) and stop == "end_turn"
