"""``[fake:reasoning=N]``: N reasoning tokens before the text of a request without a
continuation, on both wires, raw and through the official SDKs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from resumeq.fake import FakeProvider

pytestmark = pytest.mark.timeout(20)

THINK = 12
TOKENS = 40
SYSTEM = "You think first. [fake:reasoning=12]"
USER = {"role": "user", "content": "Why is the sea salty?"}
MESSAGES = [{"role": "system", "content": SYSTEM}, USER]
OPENAI_BODY = {"model": "m", "messages": MESSAGES, "stream": True}
ANTHROPIC_BODY = {"model": "m", "max_tokens": 4096, "system": SYSTEM, "messages": [USER]}
USAGE = {"include_usage": True, "continuous_usage_stats": True}


@pytest.fixture(scope="module")
def server() -> Iterator[FakeProvider]:
    with FakeProvider(completion_tokens=TOKENS) as fake:
        yield fake


@pytest.fixture
def fake(server: FakeProvider) -> FakeProvider:
    server.reset()
    return server


@pytest.fixture
def http(fake: FakeProvider) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=fake.url, timeout=10) as client:
        yield client


@pytest.fixture
def reasoning(fake: FakeProvider) -> list[str]:
    tokens = fake.canonical_reasoning(MESSAGES)
    assert len(tokens) == THINK and tokens != fake.canonical_tokens(MESSAGES)[:THINK]
    return tokens


@pytest.fixture
def text(fake: FakeProvider) -> list[str]:
    return fake.canonical_tokens(MESSAGES)


def data_of(http: httpx.Client, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The JSON events of a stream, read until it ends or is cut."""
    events = []
    try:
        with http.stream("POST", path, json=body) as response:
            assert response.status_code == 200, response.read()
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    events.append(json.loads(line[6:]))
    except httpx.RemoteProtocolError:
        pass
    return events


def deltas(chunks: list[dict[str, Any]], field: str) -> list[str]:
    found = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    return [delta[field] for delta in found if field in delta]


def anthropic_blocks(events: list[dict[str, Any]]) -> list[tuple[str, str, bool]]:
    """(type, text, closed) of each content block, in index order."""
    blocks: dict[int, list[Any]] = {}
    for event in events:
        if event["type"] == "content_block_start":
            kind = event["content_block"]["type"]
            blocks[event["index"]] = [kind, "", False]
        elif event["type"] == "content_block_delta":
            delta = event["delta"]
            if delta["type"] != "signature_delta":
                blocks[event["index"]][1] += delta.get("text", delta.get("thinking"))
        elif event["type"] == "content_block_stop":
            blocks[event["index"]][2] = True
    return [tuple(blocks[index]) for index in sorted(blocks)]  # type: ignore[misc]


# -- OpenAI wire -----------------------------------------------------------------------------


def test_openai_streams_reasoning_content_first_and_counts_it(
    fake: FakeProvider, http: httpx.Client, reasoning: list[str], text: list[str]
) -> None:
    chunks = data_of(http, "/v1/chat/completions", {**OPENAI_BODY, "stream_options": USAGE})
    body = [c for c in chunks if c["choices"]][1:-1]  # no role chunk, no finish chunk
    assert deltas(body, "reasoning_content") == reasoning  # one chunk per token
    assert all("content" not in c["choices"][0]["delta"] for c in body[:THINK])
    assert deltas(body, "content") == text
    assert [c["usage"]["completion_tokens"] for c in body] == list(range(1, THINK + TOKENS + 1))
    usage = chunks[-1]["usage"]
    assert usage["completion_tokens"] == THINK + TOKENS
    assert usage["completion_tokens_details"]["reasoning_tokens"] == THINK
    entry = fake.journal(settle_s=5)[-1]
    assert (entry["reasoning_tokens"], entry["tokens_emitted"]) == (THINK, THINK + TOKENS)
    assert entry["output_tokens_billed"] == THINK + TOKENS
    assert entry["reasoning"] == "".join(reasoning) and entry["text"] == "".join(text)


def test_a_continuation_thinks_no_more(
    fake: FakeProvider, http: httpx.Client, text: list[str]
) -> None:
    prefill = [*MESSAGES, {"role": "assistant", "content": "".join(text[:10])}]
    chunks = data_of(http, "/v1/chat/completions", {**OPENAI_BODY, "messages": prefill})
    assert deltas(chunks, "reasoning_content") == []
    assert deltas(chunks, "content")[1:] == text[10:]
    assert fake.journal(settle_s=5)[-1]["reasoning_tokens"] == 0
    retry = data_of(http, "/v1/chat/completions", OPENAI_BODY)  # a retry is not a continuation
    assert len(deltas(retry, "reasoning_content")) == THINK


@pytest.mark.parametrize("after", [0, 5, THINK, THINK + 3])
def test_openai_fault_counts_reasoning_then_text(
    fake: FakeProvider, http: httpx.Client, reasoning: list[str], text: list[str], after: int
) -> None:
    fake.add_faults([{"kind": "disconnect", "after_tokens": after}])
    chunks = data_of(http, "/v1/chat/completions", OPENAI_BODY)
    assert deltas(chunks, "reasoning_content") == reasoning[:after]
    assert [t for t in deltas(chunks, "content") if t] == text[: max(0, after - THINK)]
    entry = fake.journal(settle_s=5)[-1]
    assert entry["tokens_emitted"] == entry["output_tokens_billed"] == after
    assert entry["reasoning_tokens"] == min(after, THINK)


@pytest.mark.parametrize("max_tokens", [1, 8, THINK, THINK + 3])
def test_openai_max_tokens_counts_reasoning_and_text(
    http: httpx.Client, reasoning: list[str], text: list[str], max_tokens: int
) -> None:
    body = {**OPENAI_BODY, "max_tokens": max_tokens, "stream_options": USAGE}
    chunks = data_of(http, "/v1/chat/completions", body)
    assert deltas(chunks, "reasoning_content") == reasoning[:max_tokens]
    assert [t for t in deltas(chunks, "content") if t] == text[: max(0, max_tokens - THINK)]
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == max_tokens
    details = chunks[-1]["usage"]["completion_tokens_details"]
    assert details["reasoning_tokens"] == min(max_tokens, THINK)


def test_openai_non_streaming(http: httpx.Client, reasoning: list[str], text: list[str]) -> None:
    answer = http.post("/v1/chat/completions", json={**OPENAI_BODY, "stream": False}).json()
    message = answer["choices"][0]["message"]
    assert message["reasoning_content"] == "".join(reasoning)
    assert message["content"] == "".join(text)
    assert answer["usage"]["completion_tokens"] == THINK + TOKENS
    assert answer["usage"]["completion_tokens_details"]["reasoning_tokens"] == THINK


# -- Anthropic wire --------------------------------------------------------------------------


def test_anthropic_thinking_block_then_text_block(
    fake: FakeProvider, http: httpx.Client, reasoning: list[str], text: list[str]
) -> None:
    events = data_of(http, "/v1/messages", {**ANTHROPIC_BODY, "stream": True})
    starts = [e for e in events if e["type"] == "content_block_start"]
    assert starts[0] == {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "thinking", "thinking": ""},
    }
    assert starts[1]["index"] == 1 and starts[1]["content_block"]["type"] == "text"
    assert anthropic_blocks(events) == [
        ("thinking", "".join(reasoning), True),
        ("text", "".join(text), True),
    ]
    thinking = [e["delta"] for e in events if e.get("index") == 0 and "delta" in e]
    assert [d["type"] for d in thinking][-1] == "signature_delta" and thinking[-1]["signature"]
    assert 1 < len(thinking) - 1 < THINK  # grouped like text
    stop = events.index({"type": "content_block_stop", "index": 0})
    assert events[stop - 1]["delta"]["type"] == "signature_delta"
    assert events[-2]["usage"]["output_tokens"] == THINK + TOKENS
    entry = fake.journal(settle_s=5)[-1]
    assert entry["reasoning_tokens"] == THINK and entry["output_tokens_billed"] == THINK + TOKENS


@pytest.mark.parametrize("after", [3, THINK - 1])
def test_anthropic_cut_inside_the_thinking_block(
    fake: FakeProvider, http: httpx.Client, reasoning: list[str], after: int
) -> None:
    fake.add_faults([{"kind": "truncate", "after_tokens": after}])
    events = data_of(http, "/v1/messages", {**ANTHROPIC_BODY, "stream": True})
    assert anthropic_blocks(events) == [("thinking", "".join(reasoning[:after]), False)]
    assert fake.journal(settle_s=5)[-1]["output_tokens_billed"] == after


def test_anthropic_max_tokens_inside_the_thinking_block(
    http: httpx.Client, reasoning: list[str]
) -> None:
    body = {**ANTHROPIC_BODY, "stream": True, "max_tokens": 7}
    events = data_of(http, "/v1/messages", body)
    assert anthropic_blocks(events) == [("thinking", "".join(reasoning[:7]), True)]
    assert events[-2]["delta"]["stop_reason"] == "max_tokens"
    assert events[-2]["usage"]["output_tokens"] == 7
    whole = http.post("/v1/messages", json={**body, "stream": False}).json()
    assert [block["type"] for block in whole["content"]] == ["thinking"]


def test_anthropic_non_streaming(http: httpx.Client, reasoning: list[str], text: list[str]) -> None:
    answer = http.post("/v1/messages", json=ANTHROPIC_BODY).json()
    thinking, said = answer["content"]
    assert thinking["type"] == "thinking" and thinking["thinking"] == "".join(reasoning)
    assert thinking["signature"]
    assert said == {"type": "text", "text": "".join(text)}
    assert answer["usage"]["output_tokens"] == THINK + TOKENS


# -- the official SDKs -----------------------------------------------------------------------


def test_openai_sdk_reads_reasoning_content(
    fake: FakeProvider, reasoning: list[str], text: list[str]
) -> None:
    with openai.OpenAI(base_url=fake.openai_base_url, api_key="x", max_retries=0) as client:
        stream = client.chat.completions.create(
            model="m",
            messages=MESSAGES,  # type: ignore[arg-type]
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
    extras = [(c.choices[0].delta.model_extra or {}) for c in chunks if c.choices]
    assert "".join(e.get("reasoning_content", "") for e in extras) == "".join(reasoning)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "".join(text)
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == THINK + TOKENS
    assert usage.completion_tokens_details is not None
    assert usage.completion_tokens_details.reasoning_tokens == THINK


def test_anthropic_sdk_reads_thinking_and_grouped_text(
    fake: FakeProvider, reasoning: list[str], text: list[str]
) -> None:
    with anthropic.Anthropic(base_url=fake.anthropic_base_url, api_key="x", max_retries=0) as c:
        with c.messages.stream(
            model="m",
            max_tokens=4096,
            system=SYSTEM,
            messages=[USER],  # type: ignore[list-item]
        ) as stream:
            streamed = "".join(stream.text_stream)
            message = stream.get_final_message()
        capped = c.messages.create(
            model="m",
            max_tokens=5,
            system=SYSTEM,
            messages=[USER],  # type: ignore[list-item]
        )
    assert streamed == "".join(text)
    thinking, said = message.content
    assert thinking.type == "thinking" and thinking.thinking == "".join(reasoning)
    assert thinking.signature
    assert said.type == "text" and said.text == "".join(text)
    assert message.usage.output_tokens == THINK + TOKENS and message.stop_reason == "end_turn"
    assert [block.type for block in capped.content] == ["thinking"]
    assert capped.stop_reason == "max_tokens"
