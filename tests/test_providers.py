"""Provider clients over real HTTP to the fake provider: streams, cuts, continuations."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from resumeq.core.continuation import INSTRUCTION, PARTIAL_CLOSE, PARTIAL_OPEN, plan_request
from resumeq.core.errors import (
    Disconnected,
    FatalProviderError,
    InBandError,
    MalformedChunk,
    ProviderConnectError,
    ProviderError,
    ProviderOverloaded,
    ProviderUnavailable,
    RateLimited,
    Stalled,
    StreamCut,
    Truncated,
)
from resumeq.core.settings import ProviderProfile
from resumeq.core.spec import JobSpec, parse_spec
from resumeq.core.splice import Splicer
from resumeq.fake import FakeProvider, count_tokens
from resumeq.providers import (
    OutputDelta,
    ProviderClient,
    TextDelta,
    ToolCallDelta,
    Usage,
    make_client,
)
from resumeq.testing import free_port

SPEC = parse_spec(
    {
        "messages": [
            {"role": "system", "content": "You are a careful writer."},
            {"role": "user", "content": "Tell me about lighthouses."},
        ],
        "provider": "p",
        "model": "fake-model",
        "budget_tokens": 2000,
    }
)

MODES = [
    ("openai", "prefill", "full"),
    ("openai", "prefill_flag", "full"),
    ("openai", "continue_final_message", "full"),
    ("openai", "instruction", "full"),
    ("openai", "instruction", "tail:8"),
    ("openai", "prefill", "tail:8"),
    ("anthropic", "prefill", "full"),
    ("anthropic", "prefill", "tail:8"),
    ("anthropic", "instruction", "full"),
    ("anthropic", "instruction", "tail:8"),
]


def profile(fake: FakeProvider, kind: str = "openai", **over: Any) -> ProviderProfile:
    base = fake.anthropic_base_url if kind == "anthropic" else fake.openai_base_url
    return ProviderProfile.model_validate({"kind": kind, "base_url": base, **over})


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client() as client:
        yield client


def canonical(fake: FakeProvider, spec: JobSpec = SPEC) -> str:
    return fake.canonical_text([m.model_dump(mode="json") for m in spec.chat])


def drain(client: ProviderClient, spec: JobSpec, prefix: str, remaining: int) -> tuple[
    list[TextDelta], BaseException | None, Any
]:  # fmt: skip
    plan = plan_request(spec, client.profile, prefix=prefix, remaining_tokens=remaining)
    deltas: list[TextDelta] = []
    error: BaseException | None = None
    with client.open(plan) as stream:
        try:
            deltas.extend(e for e in stream if isinstance(e, TextDelta))
        except StreamCut as exc:
            error = exc
    return deltas, error, stream


@pytest.mark.parametrize(("kind", "mode", "context"), MODES)
def test_cut_then_continue_gives_the_canonical_text(
    fake: FakeProvider, http: httpx.Client, kind: str, mode: str, context: str
) -> None:
    client = make_client(profile(fake, kind, continue_mode=mode, resume_context=context), http)
    want = canonical(fake)
    fake.add_faults([{"kind": "disconnect", "after_tokens": 37}])
    deltas, error, _ = drain(client, SPEC, "", SPEC.budget_tokens)
    assert isinstance(error, Disconnected)
    prefix = "".join(d.text for d in deltas)
    spent = count_tokens(prefix)
    assert spent == 37 and want.startswith(prefix)
    # The OpenAI wire streams a token per chunk; Anthropic's deltas carry one or several.
    assert len(deltas) == 37 if kind == "openai" else len(deltas) < 37
    assert sum(d.tokens for d in deltas) == len(deltas)  # one per chunk: a lower bound

    remaining = SPEC.budget_tokens - spent
    plan = plan_request(SPEC, client.profile, prefix=prefix, remaining_tokens=remaining)
    splicer = Splicer(prefix, sent=plan.sent, trimmed=plan.trimmed, mode=mode)  # type: ignore[arg-type]
    text = prefix
    with client.open(plan) as stream:
        for event in stream:
            if isinstance(event, TextDelta):
                text += splicer.feed(event.text)
        assert stream.finish_reason in ("stop", "end_turn")
    text += splicer.finish()
    assert text == want

    journal = fake.journal()
    resumed = journal[-1]
    assert resumed["is_continuation"]
    max_tokens = resumed["body"]["max_tokens"]
    assert max_tokens == remaining
    if kind == "anthropic" and mode == "prefill":
        sent = resumed["body"]["messages"][-1]["content"]
        assert sent == sent.rstrip()
    if mode == "continue_final_message":
        assert resumed["body"]["continue_final_message"] is True
        assert resumed["body"]["add_generation_prompt"] is False
    if mode == "prefill_flag":
        assert resumed["body"]["messages"][-1]["prefix"] is True
    extra_input = resumed["input_tokens_billed"] - journal[0]["input_tokens_billed"]
    overhead = count_tokens(INSTRUCTION + PARTIAL_OPEN + PARTIAL_CLOSE) + 8
    if context.startswith("tail"):
        # Only the system message, the request and a short tail went out again.
        assert plan.prefix_chars_sent < len(prefix)
        assert extra_input <= overhead + 8
    else:
        assert plan.prefix_chars_sent == len(prefix)
        assert extra_input >= spent


def test_prefill_at_trailing_white_space_is_trimmed_and_restored(
    fake: FakeProvider, http: httpx.Client
) -> None:
    client = make_client(profile(fake, "anthropic", continue_mode="prefill"), http)
    want = canonical(fake)
    cut = want.index(" ", 40) + 1  # a prefix that ends in white space
    prefix = want[:cut]
    plan = plan_request(SPEC, client.profile, prefix=prefix, remaining_tokens=1500)
    assert plan.trimmed == " " and plan.messages[-1].content == prefix[:-1]
    splicer = Splicer(prefix, trimmed=plan.trimmed)
    with client.open(plan) as stream:
        out = "".join(splicer.feed(e.text) for e in stream if isinstance(e, TextDelta))
    assert prefix + out + splicer.finish() == want


def test_max_tokens_is_honoured_from_the_continuation_point(
    fake: FakeProvider, http: httpx.Client
) -> None:
    client = make_client(profile(fake, counting="usage"), http)
    want_tokens = fake.canonical_tokens([m.model_dump(mode="json") for m in SPEC.chat])
    prefix = "".join(want_tokens[:50])
    deltas, error, stream = drain(client, SPEC, prefix, 10)
    assert error is None and stream.finish_reason == "length"
    assert sum(d.tokens for d in deltas) == 10 and all(d.exact for d in deltas)
    assert "".join(d.text for d in deltas) == "".join(want_tokens[50:60])


# -- counting ----------------------------------------------------------------------------


def test_openai_chunks_are_estimates_and_the_final_usage_is_exact(
    fake: FakeProvider, http: httpx.Client
) -> None:
    client = make_client(profile(fake, counting="chunks"), http)
    deltas, error, stream = drain(client, SPEC, "", 2000)
    assert error is None and stream.finish_reason == "stop"
    assert not any(d.exact for d in deltas)
    billed = fake.journal()[-1]["output_tokens_billed"]
    assert stream.usage.output_tokens == billed == len(deltas)
    assert stream.usage.input_tokens == fake.journal()[-1]["input_tokens_billed"]
    assert "continuous_usage_stats" not in fake.journal()[-1]["body"]["stream_options"]


def test_openai_continuous_usage_is_exact_per_delta(fake: FakeProvider, http: httpx.Client) -> None:
    client = make_client(profile(fake, counting="usage"), http)
    fake.add_faults([{"kind": "disconnect", "after_tokens": 20}])
    deltas, error, _ = drain(client, SPEC, "", 2000)
    assert isinstance(error, Disconnected)
    assert all(d.exact for d in deltas)
    assert sum(d.tokens for d in deltas) == fake.journal()[-1]["output_tokens_billed"] == 20


def test_anthropic_usage_is_cumulative_in_message_delta(
    fake: FakeProvider, http: httpx.Client
) -> None:
    client = make_client(profile(fake, "anthropic"), http)
    _deltas, error, stream = drain(client, SPEC, "", 2000)
    assert error is None and stream.finish_reason == "end_turn"
    entry = fake.journal()[-1]
    assert stream.usage.output_tokens == entry["output_tokens_billed"]
    assert stream.usage.input_tokens is not None


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_tokenizer_counts_the_stored_text_exactly(
    fake: FakeProvider, http: httpx.Client, kind: str
) -> None:
    client = make_client(profile(fake, kind, counting="tokenizer"), http)
    text = canonical(fake)[:300]
    assert client.count_text_tokens(text, model="fake-model") == count_tokens(text)
    assert client.count_text_tokens("", model="fake-model") == 0


def test_anthropic_prompt_cache_marks_the_original_messages(
    fake: FakeProvider, http: httpx.Client
) -> None:
    client = make_client(profile(fake, "anthropic", cache_prompt=True), http)
    fake.add_faults([{"kind": "disconnect", "after_tokens": 10}])
    deltas, _, first = drain(client, SPEC, "", 2000)
    prefix = "".join(d.text for d in deltas)
    _, _, second = drain(client, SPEC, prefix, 1990)
    body = fake.journal()[-1]["body"]
    assert body["system"][-1]["cache_control"] == {"type": "ephemeral"}
    assert body["messages"][0]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    assert first.usage.cache_creation_input_tokens
    assert second.usage.cached_input_tokens == first.usage.cache_creation_input_tokens


# -- faults ------------------------------------------------------------------------------

STREAM_FAULTS = [
    ({"kind": "disconnect", "after_tokens": 5}, Disconnected),
    ({"kind": "truncate", "after_tokens": 5}, Truncated),
    ({"kind": "malformed", "after_tokens": 5}, MalformedChunk),
    ({"kind": "error_event", "after_tokens": 5}, InBandError),
]


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
@pytest.mark.parametrize(("fault", "error"), STREAM_FAULTS, ids=str)
def test_mid_stream_faults_are_cuts(
    fake: FakeProvider,
    http: httpx.Client,
    kind: str,
    fault: dict[str, Any],
    error: type[StreamCut],
) -> None:
    client = make_client(profile(fake, kind), http)
    fake.add_faults([fault])
    deltas, raised, _stream = drain(client, SPEC, "", 2000)
    assert type(raised) is error
    received = "".join(d.text for d in deltas)
    assert received == canonical(fake)[: len(received)]
    assert count_tokens(received) == 5
    if kind == "anthropic" and error is InBandError:
        assert raised.error_type == "overloaded_error"


@pytest.mark.timeout(20)
@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_a_stall_is_detected_within_the_stall_timeout(
    fake: FakeProvider, http: httpx.Client, kind: str
) -> None:
    client = make_client(profile(fake, kind, stall_timeout_s=1.0), http)
    fake.add_faults([{"kind": "stall", "after_tokens": 3, "seconds": 6}])
    t0 = time.monotonic()
    deltas, raised, _ = drain(client, SPEC, "", 2000)
    assert isinstance(raised, Stalled) and count_tokens("".join(d.text for d in deltas)) == 3
    assert time.monotonic() - t0 < 1.0 + 1.0


@pytest.mark.parametrize(
    ("kind", "status", "error"),
    [
        ("openai", 429, RateLimited),
        ("anthropic", 429, RateLimited),
        ("anthropic", 529, ProviderOverloaded),
        ("openai", 500, ProviderUnavailable),
        ("openai", 503, ProviderUnavailable),
        ("anthropic", 500, ProviderUnavailable),
        ("openai", 400, FatalProviderError),
        ("openai", 401, FatalProviderError),
        ("openai", 403, FatalProviderError),
        ("openai", 404, FatalProviderError),
        ("anthropic", 422, FatalProviderError),
    ],
)
def test_error_statuses_are_classified_before_any_token(
    fake: FakeProvider, http: httpx.Client, kind: str, status: int, error: type[ProviderError]
) -> None:
    client = make_client(profile(fake, kind), http)
    fake.add_faults([{"kind": "status", "status": status, "retry_after": 2}])
    plan = plan_request(SPEC, client.profile, prefix="", remaining_tokens=100)
    with pytest.raises(ProviderError) as info:
        client.open(plan)
    assert type(info.value) is error
    assert info.value.status == status and info.value.retry_after == 2.0
    assert str(status) in str(info.value)


def test_a_real_400_names_the_providers_complaint(fake: FakeProvider, http: httpx.Client) -> None:
    """Anthropic refuses a final assistant message that ends in white space."""
    client = make_client(profile(fake, "anthropic"), http)
    request = client.http.build_request(
        "POST",
        f"{client.profile.base_url}/v1/messages",
        json={
            "model": "m",
            "max_tokens": 10,
            "stream": True,
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "trailing "},
            ],
        },
    )
    with pytest.raises(FatalProviderError, match="trailing whitespace") as info:
        client.send(request)
    assert info.value.error_type == "invalid_request_error"


def test_connection_refused_is_retryable(http: httpx.Client) -> None:
    prof = ProviderProfile(kind="openai", base_url=f"http://127.0.0.1:{free_port()}/v1")
    plan = plan_request(SPEC, prof, prefix="", remaining_tokens=100)
    with pytest.raises(ProviderConnectError):
        make_client(prof, http).open(plan)


def test_closing_the_stream_stops_it(fake: FakeProvider, http: httpx.Client) -> None:
    fake.token_delay_ms = 5
    client = make_client(profile(fake), http)
    plan = plan_request(SPEC, client.profile, prefix="", remaining_tokens=2000)
    stream = client.open(plan)
    got = []
    for event in stream:
        if isinstance(event, TextDelta):
            got.append(event)
            if len(got) == 10:
                stream.close()
    assert len(got) == 10
    deadline = time.monotonic() + 5
    while fake.journal()[-1]["outcome"] == "in_progress" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert fake.journal()[-1]["output_tokens_billed"] < 40


def test_usage_event_type() -> None:
    assert Usage().output_tokens is None


# -- output that is not text, and counts the stream carries ---------------------------------

REASONING_SPEC = parse_spec(
    {"prompt": "Think, then answer [fake:reasoning=40]", "provider": "p", "model": "m",
     "budget_tokens": 2000}
)  # fmt: skip


def events_of(client: ProviderClient, spec: JobSpec) -> tuple[list[Any], BaseException | None]:
    plan = plan_request(spec, client.profile, prefix="", remaining_tokens=spec.budget_tokens)
    events: list[Any] = []
    with client.open(plan) as stream:
        try:
            events.extend(stream)
        except StreamCut as exc:
            return events, exc
    return events, None


def test_openai_reasoning_is_output_counted_exactly_under_continuous_usage(
    fake: FakeProvider, http: httpx.Client
) -> None:
    fake.completion_tokens = 30
    client = make_client(profile(fake, counting="usage"), http)
    events, error = events_of(client, REASONING_SPEC)
    assert error is None
    reasoning = [e for e in events if isinstance(e, OutputDelta) and e.kind == "reasoning"]
    text = [e for e in events if isinstance(e, TextDelta)]
    assert len(reasoning) == 40 and all(e.exact and e.tokens == 1 for e in reasoning)
    assert sum(e.tokens for e in text) == 30
    final = [e for e in events if isinstance(e, Usage)][-1]
    assert final.output_tokens == 70 and final.reasoning_tokens == 40


def test_anthropic_thinking_is_output(fake: FakeProvider, http: httpx.Client) -> None:
    fake.completion_tokens = 30
    client = make_client(profile(fake, "anthropic"), http)
    events, error = events_of(client, REASONING_SPEC)
    assert error is None
    thinking = "".join(e.text for e in events if isinstance(e, OutputDelta))
    assert thinking == "".join(fake.canonical_reasoning([{"role": "user", "content":
                                                          REASONING_SPEC.prompt}]))  # fmt: skip
    assert [e for e in events if isinstance(e, Usage)][-1].output_tokens == 70


def chunk(content: str | None = None, usage: int | None = None, **delta: Any) -> dict[str, Any]:
    if content is not None:
        delta["content"] = content
    out: dict[str, Any] = {"choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
    if usage is not None:
        out["usage"] = {"prompt_tokens": 5, "completion_tokens": usage}
    return out


def scripted(*chunks: dict[str, Any]) -> ProviderClient:
    body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks)
    body += 'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})

    http = httpx.Client(transport=httpx.MockTransport(handler))
    p = ProviderProfile(kind="openai", base_url="http://engine.invalid/v1", counting="usage")
    return make_client(p, http)


def test_an_echo_chunk_without_tokens_keeps_continuous_usage_exact() -> None:
    """vLLM's ``echo`` sends the prefill as a chunk of its own with no completion token."""
    client = scripted(chunk("the prefix as sent", 0), chunk(" one", 1), chunk(" two", 2))
    events, _ = events_of(client, SPEC)
    deltas = [e for e in events if isinstance(e, TextDelta)]
    assert [(d.tokens, d.exact) for d in deltas] == [(0, True), (1, True), (1, True)]


def test_continuous_usage_that_stops_counting_is_no_longer_believed() -> None:
    client = scripted(chunk(" one", 1), chunk(" two", 1), chunk(" three", 1))
    events, _ = events_of(client, SPEC)
    deltas = [e for e in events if isinstance(e, TextDelta)]
    assert [(d.tokens, d.exact) for d in deltas] == [(1, True), (1, False), (1, False)]


def test_tokens_counted_in_a_chunk_without_content_are_output() -> None:
    """An end token counted in the finish chunk, or a tool call's tokens."""
    call = {"index": 0, "id": "x", "type": "function", "function": {"name": "f", "arguments": ""}}
    client = scripted(chunk(" one", 1), chunk(None, 2), chunk(None, 4, tool_calls=[call]))
    events, error = events_of(client, SPEC)
    assert error is None
    other = [e for e in events if isinstance(e, OutputDelta)]
    assert [(e.kind, e.tokens) for e in other] == [("other", 1)]
    calls = [e for e in events if isinstance(e, ToolCallDelta)]
    assert [(e.id, e.tokens, e.exact) for e in calls] == [("x", 2, True)]


# -- counting endpoints ------------------------------------------------------------------------


@pytest.mark.parametrize("tokenize", ["vllm", "llamacpp"])
def test_each_engines_counting_endpoint(
    fake: FakeProvider, http: httpx.Client, tokenize: str
) -> None:
    fake.configure_engine(tokenize=tokenize)  # type: ignore[arg-type]
    client = make_client(profile(fake, counting="tokenizer", tokenizer=tokenize), http)
    text = canonical(fake)[:300]
    assert client.count_text_tokens(text, model="m") == count_tokens(text)
    body = fake.journal()[-1]["body"]
    assert ("content" in body) is (tokenize == "llamacpp")


def test_vllms_body_at_llamacpp_gets_an_empty_list(fake: FakeProvider, http: httpx.Client) -> None:
    """What a real llama.cpp server did: the count came back 0, which counting refuses."""
    fake.configure_engine(tokenize="llamacpp")
    client = make_client(profile(fake, counting="tokenizer", tokenizer="vllm"), http)
    assert client.count_text_tokens("Some text that is not empty.", model="m") == 0


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (httpx.Response(200, json={"tokens": ["Hel", "lo"]}), "not token ids"),
        (httpx.Response(200, text="<html>oops</html>"), "non-JSON"),
        (httpx.Response(200, json=[1, 2, 3]), "JSON list"),
        (httpx.Response(200, json={"count": 2, "tokens": [1, 2, 3]}), "count 2 for 3"),
        (httpx.Response(200, json={"nothing": True}), "neither count nor tokens"),
        (httpx.Response(404, json={"error": {"message": "Not Found"}}), "HTTP 404"),
        (httpx.Response(503, text="busy"), "HTTP 503"),
    ],
)
def test_a_counting_answer_that_is_no_count_is_an_error(answer: httpx.Response, error: str) -> None:
    http = httpx.Client(transport=httpx.MockTransport(lambda request: answer))
    p = ProviderProfile(kind="openai", base_url="http://engine.invalid/v1", counting="tokenizer")
    with pytest.raises(ProviderError, match=error):
        make_client(p, http).count_text_tokens("Hello", model="m")


def test_a_list_of_token_objects_is_a_count() -> None:
    pieces = {"tokens": [{"id": 1, "piece": "Hel"}, {"id": 2, "piece": "lo"}]}
    http = httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(200, json=pieces)))
    p = ProviderProfile(kind="openai", base_url="http://e.invalid/v1", tokenizer="llamacpp")
    assert make_client(p, http).count_text_tokens("Hello", model="m") == 2


def test_a_tokenizer_must_fit_the_kind() -> None:
    with pytest.raises(ValueError, match="does not fit"):
        ProviderProfile(kind="anthropic", base_url="http://e.invalid", tokenizer="vllm")
    with pytest.raises(ValueError, match="does not fit"):
        ProviderProfile(kind="openai", base_url="http://e.invalid/v1", tokenizer="anthropic")
