"""Wire fidelity: the official ``openai`` and ``anthropic`` SDKs against the fake, over loopback."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import openai
import pytest

from resumeq.fake import FakeProvider, count_tokens

pytestmark = pytest.mark.timeout(20)

SYSTEM = "You write tersely."
USER = "Describe the harbour at dawn."
MESSAGES = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]
ANTHROPIC_MESSAGES = [{"role": "user", "content": USER}]
# <|system|> ... <|end|> <|user|> ... <|end|> <|assistant|>
PROMPT_TOKENS = count_tokens(SYSTEM) + count_tokens(USER) + 5


@pytest.fixture
def oai(fake: FakeProvider) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=fake.openai_base_url, api_key="x", max_retries=0) as client:
        yield client


@pytest.fixture
def claude(fake: FakeProvider) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(
        base_url=fake.anthropic_base_url, api_key="x", max_retries=0
    ) as client:
        yield client


# -- OpenAI ----------------------------------------------------------------------------------


def test_openai_stream_gets_canonical_text_finish_and_usage(
    fake: FakeProvider, oai: openai.OpenAI
) -> None:
    stream = oai.chat.completions.create(
        model="gpt-x",
        messages=MESSAGES,  # type: ignore[arg-type]
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    content = [c.choices[0].delta.content for c in chunks if c.choices]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].object == "chat.completion.chunk"
    assert len({c.id for c in chunks}) == 1 and chunks[0].model == "gpt-x"
    text = "".join(part or "" for part in content)
    tokens = fake.canonical_tokens(MESSAGES)
    assert text == fake.canonical_text(MESSAGES)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == []
    usage = chunks[-1].usage
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (PROMPT_TOKENS, len(tokens))
    assert usage.total_tokens == PROMPT_TOKENS + len(tokens)
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == 0
    assert all(c.usage is None for c in chunks[:-1])
    # one chunk per token: role chunk + tokens + finish chunk + usage chunk
    assert len(chunks) == len(tokens) + 3


def test_openai_stream_without_include_usage_has_no_usage(
    fake: FakeProvider, oai: openai.OpenAI
) -> None:
    chunks = list(
        oai.chat.completions.create(
            model="m",
            messages=MESSAGES,  # type: ignore[arg-type]
            stream=True,
            max_tokens=7,
        )
    )
    assert all(c.usage is None and c.choices for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == "".join(fake.canonical_tokens(MESSAGES)[:7])


def test_openai_non_streaming(fake: FakeProvider, oai: openai.OpenAI) -> None:
    result = oai.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    assert result.object == "chat.completion"
    assert result.choices[0].message.content == fake.canonical_text(MESSAGES)
    assert result.choices[0].finish_reason == "stop"
    assert result.usage is not None and result.usage.prompt_tokens == PROMPT_TOKENS
    capped = oai.chat.completions.create(
        model="m",
        messages=MESSAGES,  # type: ignore[arg-type]
        max_completion_tokens=12,
    )
    assert capped.choices[0].finish_reason == "length"
    assert capped.usage is not None and capped.usage.completion_tokens == 12


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (429, openai.RateLimitError),
        (400, openai.BadRequestError),
        (500, openai.InternalServerError),
        (503, openai.InternalServerError),
    ],
)
def test_openai_sdk_raises_on_status_faults(
    fake: FakeProvider, oai: openai.OpenAI, status: int, error: type[openai.APIStatusError]
) -> None:
    fake.add_faults([{"kind": "status", "status": status, "retry_after": 2}])
    with pytest.raises(error) as caught:
        oai.chat.completions.create(model="m", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
    assert caught.value.status_code == status
    assert caught.value.response.headers["retry-after"] == "2"
    body = caught.value.body
    assert isinstance(body, dict) and set(body) == {"message", "type", "param", "code"}
    if status == 429:
        assert body["code"] == "rate_limit_exceeded"


def test_openai_sdk_raises_on_an_in_band_error(fake: FakeProvider, oai: openai.OpenAI) -> None:
    fake.add_faults([{"kind": "error_event", "after_tokens": 3}])
    stream = oai.chat.completions.create(model="m", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
    seen = []
    with pytest.raises(openai.APIError, match="overloaded"):
        for chunk in stream:
            seen.append(chunk.choices[0].delta.content or "")
    assert "".join(seen) == "".join(fake.canonical_tokens(MESSAGES)[:3])


def test_openai_sdk_rejects_a_continue_final_message_without_add_generation_prompt(
    oai: openai.OpenAI,
) -> None:
    messages = [*MESSAGES, {"role": "assistant", "content": "Some"}]
    with pytest.raises(openai.BadRequestError, match="add_generation_prompt"):
        oai.chat.completions.create(
            model="m",
            messages=messages,  # type: ignore[arg-type]
            extra_body={"continue_final_message": True},
        )


# -- Anthropic -------------------------------------------------------------------------------


def test_anthropic_stream_gets_text_stop_reason_and_usage(
    fake: FakeProvider, claude: anthropic.Anthropic
) -> None:
    with claude.messages.stream(
        model="claude-x", max_tokens=4096, system=SYSTEM, messages=ANTHROPIC_MESSAGES
    ) as stream:
        text = "".join(stream.text_stream)
        message = stream.get_final_message()
    tokens = fake.canonical_tokens(ANTHROPIC_MESSAGES, system=SYSTEM)
    assert text == "".join(tokens) == fake.canonical_text(MESSAGES)
    assert message.stop_reason == "end_turn" and message.model == "claude-x"
    assert message.usage.output_tokens == len(tokens)
    assert message.usage.input_tokens == PROMPT_TOKENS
    assert message.usage.cache_read_input_tokens == 0
    assert message.usage.cache_creation_input_tokens == 0


def test_anthropic_max_tokens_and_non_streaming(
    fake: FakeProvider, claude: anthropic.Anthropic
) -> None:
    with claude.messages.stream(
        model="m", max_tokens=9, system=SYSTEM, messages=ANTHROPIC_MESSAGES
    ) as stream:
        message = stream.get_final_message()
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 9
    whole = claude.messages.create(
        model="m", max_tokens=4096, system=SYSTEM, messages=ANTHROPIC_MESSAGES
    )
    assert whole.content[0].type == "text"
    assert whole.content[0].text == fake.canonical_text(MESSAGES)
    assert whole.stop_reason == "end_turn"


def test_anthropic_raw_events_arrive_in_order(
    fake: FakeProvider, claude: anthropic.Anthropic
) -> None:
    events = list(
        claude.messages.create(model="m", max_tokens=9, messages=ANTHROPIC_MESSAGES, stream=True)
    )
    names = [event.type for event in events]
    deltas = [event for event in events if event.type == "content_block_delta"]
    assert 3 <= len(deltas) < 9  # 1 to 4 tokens each, as the real API groups them
    assert names == [
        "message_start",
        "content_block_start",
        *["content_block_delta"] * len(deltas),
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]  # the SDK swallows ping
    texts = [d.delta.text for d in deltas if d.delta.type == "text_delta"]
    assert "".join(texts) == "".join(fake.canonical_tokens(ANTHROPIC_MESSAGES)[:9])
    assert events[0].type == "message_start"
    assert events[0].message.usage.output_tokens == 1
    assert events[-2].type == "message_delta" and events[-2].usage.output_tokens == 9


def test_anthropic_sdk_raises_rate_limit_overloaded_and_bad_request(
    fake: FakeProvider, claude: anthropic.Anthropic
) -> None:
    fake.add_faults([{"kind": "status", "status": 429, "retry_after": 1.5}])
    with pytest.raises(anthropic.RateLimitError) as limited:
        claude.messages.create(model="m", max_tokens=5, messages=ANTHROPIC_MESSAGES)
    # Anthropic says whole seconds, rounded up; no retry-after-ms on its wire.
    assert limited.value.response.headers["retry-after"] == "2"
    assert "retry-after-ms" not in limited.value.response.headers
    assert isinstance(limited.value.body, dict)
    assert limited.value.body["error"]["type"] == "rate_limit_error"
    fake.add_faults([{"kind": "status", "status": 529}])
    with pytest.raises(anthropic.OverloadedError) as overloaded:
        claude.messages.create(model="m", max_tokens=5, messages=ANTHROPIC_MESSAGES)
    assert isinstance(overloaded.value.body, dict)
    assert overloaded.value.body["error"] == {"type": "overloaded_error", "message": "Overloaded"}
    prefill = [*ANTHROPIC_MESSAGES, {"role": "assistant", "content": "Once upon "}]
    with pytest.raises(anthropic.BadRequestError, match="trailing whitespace"):
        claude.messages.create(model="m", max_tokens=5, messages=prefill)  # type: ignore[arg-type]


def test_anthropic_sdk_raises_on_an_in_band_overloaded_error(
    fake: FakeProvider, claude: anthropic.Anthropic
) -> None:
    fake.add_faults([{"kind": "error_event", "after_tokens": 2}])
    with (
        pytest.raises(anthropic.APIStatusError, match="overloaded_error"),
        claude.messages.stream(model="m", max_tokens=50, messages=ANTHROPIC_MESSAGES) as stream,
    ):
        for _ in stream.text_stream:
            pass


def test_anthropic_count_tokens_matches_billed_input(
    fake: FakeProvider, claude: anthropic.Anthropic
) -> None:
    counted = claude.messages.count_tokens(model="m", system=SYSTEM, messages=ANTHROPIC_MESSAGES)
    assert counted.input_tokens == PROMPT_TOKENS
    claude.messages.create(model="m", max_tokens=5, system=SYSTEM, messages=ANTHROPIC_MESSAGES)
    assert fake.journal()[-1]["input_tokens_billed"] == PROMPT_TOKENS
    assert fake.journal()[0]["wire"] == "count_tokens"
