"""The fake provider's OpenAI Responses wire, read by the official ``openai`` SDK (which
parses every event into its own types) and by resumeq's own client."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from worker_support import attempt_runner, run_to_rest

from resumeq.core.continuation import ChatMessage, RequestPlan
from resumeq.core.errors import FatalProviderError, InBandError, MalformedChunk, Truncated
from resumeq.core.settings import ProviderProfile
from resumeq.core.spec import GenerationParams
from resumeq.fake import FakeProvider
from resumeq.providers import make_client
from resumeq.providers.base import OutputDelta, TextDelta, Usage
from resumeq.providers.openai_responses import ResponsesStream
from resumeq.store import Store
from resumeq.testing import RedisServer

PROMPT = "Describe a tide pool at dawn."


@pytest.fixture
def sdk(fake: FakeProvider) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=fake.openai_base_url, api_key="k", max_retries=0) as client:
        yield client


def canonical(fake: FakeProvider, prompt: str = PROMPT) -> str:
    return fake.canonical_text([{"role": "user", "content": prompt}])


def test_the_sdk_reads_a_streamed_response_event_by_event(
    fake: FakeProvider, sdk: openai.OpenAI
) -> None:
    events = list(sdk.responses.create(model="m", input=PROMPT, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    text = "".join(e.delta for e in deltas)
    assert text == canonical(fake)
    assert all(e.obfuscation for e in deltas)  # OpenAI's padding, on by default
    done = events[-1].response
    assert done.status == "completed" and done.output_text == text
    assert done.usage is not None and done.usage.output_tokens == len(deltas)
    assert done.usage.input_tokens > 0 and done.usage.input_tokens_details.cached_tokens == 0
    created = events[0].response
    assert created.id == done.id and created.id.startswith("resp_") and created.usage is None


def test_without_obfuscation_and_without_streaming(fake: FakeProvider, sdk: openai.OpenAI) -> None:
    events = list(
        sdk.responses.create(
            model="m", input=PROMPT, stream=True, stream_options={"include_obfuscation": False}
        )
    )
    assert all(
        getattr(e, "obfuscation", None) is None
        for e in events
        if e.type == "response.output_text.delta"
    )
    whole = sdk.responses.create(model="m", input=PROMPT)
    assert whole.status == "completed" and whole.output_text == canonical(fake)


def test_a_budget_that_runs_out_is_incomplete(fake: FakeProvider, sdk: openai.OpenAI) -> None:
    events = list(sdk.responses.create(model="m", input=PROMPT, stream=True, max_output_tokens=20))
    end = events[-1]
    assert end.type == "response.incomplete"
    assert end.response.incomplete_details.reason == "max_output_tokens"
    assert end.response.usage.output_tokens == 20
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert canonical(fake).startswith(text)


def test_reasoning_comes_first_as_its_own_item(fake: FakeProvider, sdk: openai.OpenAI) -> None:
    prompt = "Think first. [fake:reasoning=12]"
    events = list(sdk.responses.create(model="m", input=prompt, stream=True))
    reasoning = [e for e in events if e.type == "response.reasoning_text.delta"]
    assert len(reasoning) == 12 and all(e.output_index == 0 for e in reasoning)
    texts = [e for e in events if e.type == "response.output_text.delta"]
    assert texts and all(e.output_index == 1 for e in texts)
    usage = events[-1].response.usage
    assert usage.output_tokens_details.reasoning_tokens == 12
    assert usage.output_tokens == 12 + len(texts)


def test_a_final_assistant_message_in_progress_is_continued(
    fake: FakeProvider, sdk: openai.OpenAI
) -> None:
    whole = canonical(fake)
    prefix = whole[: len(whole) // 2]
    cut = prefix.rfind(" ")
    prefix = prefix[:cut]
    input_: Any = [
        {"role": "user", "content": PROMPT},
        {
            "type": "message",
            "role": "assistant",
            "status": "in_progress",
            "content": [{"type": "output_text", "text": prefix, "annotations": []}],
        },
    ]
    events = list(sdk.responses.create(model="m", input=input_, stream=True))
    rest = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert prefix + rest == whole


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m"}, "input"),
        ({"model": "m", "input": []}, "input"),
        ({"model": "m", "input": [{"role": "user", "content": [{"type": "image"}]}]}, "input.0"),
        (
            {"model": "m", "input": [
                {"role": "assistant", "content": "x", "status": "in_progress"},
                {"role": "user", "content": "y"},
            ]},
            "input.0",
        ),
        ({"model": "m", "input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"model": "m", "input": "x", "max_output_tokens": 15}, "max_output_tokens"),
    ],
)  # fmt: skip
def test_bad_requests_are_refused_naming_the_field(
    fake: FakeProvider, body: dict[str, Any], param: str
) -> None:
    response = httpx.post(f"{fake.openai_base_url}/responses", json=body, timeout=10)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == param


# -- resumeq's client ------------------------------------------------------------------------


def profile(fake: FakeProvider, **over: Any) -> ProviderProfile:
    return ProviderProfile(
        kind="openai-responses", base_url=fake.openai_base_url, stall_timeout_s=5, **over
    )


def plan(prompt: str = PROMPT, max_tokens: int = 1000) -> RequestPlan:
    return RequestPlan(
        kind="fresh",
        model="m",
        messages=(ChatMessage("user", prompt),),
        max_tokens=max_tokens,
    )


def read(stream: ResponsesStream) -> tuple[str, str, list[Usage]]:
    text, reasoning, usages = [], [], []
    for event in stream:
        if isinstance(event, TextDelta):
            text.append(event.text)
        elif isinstance(event, OutputDelta) and event.kind == "reasoning":
            reasoning.append(event.text)
        elif isinstance(event, Usage):
            usages.append(event)
    return "".join(text), "".join(reasoning), usages


def test_resumeq_reads_the_stream_with_its_usage_at_the_end(fake: FakeProvider) -> None:
    with httpx.Client() as http:
        client = make_client(profile(fake), http)
        with client.open(plan("Think first. [fake:reasoning=5]")) as stream:
            assert isinstance(stream, ResponsesStream)
            text, reasoning, usages = read(stream)
    whole = fake.canonical_text([{"role": "user", "content": "Think first. [fake:reasoning=5]"}])
    assert text == whole and len(reasoning) > 0
    assert stream.finish_reason == "stop" and len(usages) == 1
    assert usages[0].reasoning_tokens == 5 and usages[0].output_tokens is not None
    assert stream.response_id is not None and stream.response_id.startswith("resp_")
    body = fake.journal()[-1]["body"]
    assert body["max_output_tokens"] == 1000 and body["input"][0]["content"].startswith("Think")


def test_resumeq_names_each_cut(fake: FakeProvider) -> None:
    with httpx.Client() as http:
        client = make_client(profile(fake), http)
        fake.add_faults([{"kind": "error_event", "after_tokens": 5}])
        with pytest.raises(InBandError, match="overloaded"), client.open(plan()) as stream:
            read(stream)
        fake.add_faults([{"kind": "truncate", "after_tokens": 5}])
        with pytest.raises(Truncated), client.open(plan()) as stream:
            read(stream)
        fake.add_faults([{"kind": "malformed", "after_tokens": 5}])
        with pytest.raises(MalformedChunk), client.open(plan()) as stream:
            read(stream)
        with client.open(plan(max_tokens=16)) as stream:
            _, _, usages = read(stream)
        assert stream.finish_reason == "length" and usages[0].output_tokens == 16


@pytest.mark.parametrize("kind", ["sequence_skip", "sequence_repeat"])
def test_an_event_out_of_sequence_is_a_cut_before_its_text(fake: FakeProvider, kind: str) -> None:
    fake.add_faults([{"kind": kind, "after_tokens": 6}])
    got: list[str] = []
    with (
        httpx.Client() as http,
        make_client(profile(fake), http).open(plan()) as stream,
        pytest.raises(MalformedChunk, match="out of sequence"),
    ):
        for event in stream:
            if isinstance(event, TextDelta):
                got.append(event.text)
    # Exactly the six tokens before it: nothing repeated, nothing after the gap.
    assert "".join(got) == "".join(fake.canonical_tokens([{"role": "user", "content": PROMPT}])[:6])


@pytest.mark.parametrize("kind", ["sequence_skip", "sequence_repeat", "error_event", "disconnect"])
def test_a_job_cut_on_the_responses_wire_ends_canonical(
    fake: FakeProvider, redis_server: RedisServer, real_store: Store, kind: str
) -> None:
    """Through the worker's code path: cut, continued with an assistant message in
    progress, the text canonical byte for byte and never a token twice."""
    providers = {"r": {"kind": "openai-responses", "base_url": fake.openai_base_url,
                       "continue_mode": "continue_final_message", "counting": "usage+tokenizer",
                       "stall_timeout_s": 5}}  # fmt: skip
    prompt = f"Cut by {kind}: a table and some code, please [fake:mixed]"
    fake.add_faults([{"kind": kind, "after_tokens": 120, "match": prompt}])
    with attempt_runner(redis_server.url, providers) as runner:
        job_id = real_store.create(
            {"prompt": prompt, "provider": "r", "model": "m", "budget_tokens": 4000}
        ).id
        record = run_to_rest(runner, job_id)
    assert record.state.value == "done", (record.reason, record.error)
    assert real_store.text(job_id) == fake.canonical_text([{"role": "user", "content": prompt}])
    ledger = real_store.ledger(job_id)
    assert [a["kind"] for a in ledger] == ["fresh", "resume"] and record.counts_exact
    assert record.spent_output_tokens == sum(
        r["output_tokens_billed"] for r in fake.journal(settle_s=1) if prompt in str(r["body"])
    )


# -- background responses ------------------------------------------------------------------------


def configure(fake: FakeProvider, **body: Any) -> None:
    httpx.post(f"{fake.url}/_fake/config", json=body, timeout=10).raise_for_status()


def start_background(sdk: openai.OpenAI, prompt: str, events: int) -> tuple[str, int, str]:
    """Create a background response, read ``events`` of its events and hang up: its id, the
    last sequence number read, and the text read."""
    stream = sdk.responses.create(model="m", input=prompt, stream=True, background=True)
    response_id, last, text = "", -1, ""
    for n, event in enumerate(stream):
        if event.type == "response.created":
            response_id = event.response.id
            assert event.response.background is True and event.response.status == "queued"
        if event.type == "response.output_text.delta":
            text += event.delta
        last = event.sequence_number
        if n + 1 == events:
            break
    stream.close()
    return response_id, last, text


def test_a_background_response_goes_on_without_its_reader_and_is_read_again(
    fake: FakeProvider, sdk: openai.OpenAI
) -> None:
    fake.token_delay_ms = 5
    response_id, last, head = start_background(sdk, PROMPT, 12)
    # The rest, after the last number read: no event twice, none missing.
    rest = list(sdk.responses.retrieve(response_id, stream=True, starting_after=last))
    assert [e.sequence_number for e in rest] == list(range(last + 1, last + 1 + len(rest)))
    tail = "".join(e.delta for e in rest if e.type == "response.output_text.delta")
    assert head + tail == canonical(fake) and rest[-1].type == "response.completed"
    # The SDK's helper asks from the start and drops what it was told to skip.
    with sdk.responses.stream(response_id=response_id, starting_after=last) as helper:
        again = "".join(e.delta for e in helper if e.type == "response.output_text.delta")
    assert again == tail
    whole = sdk.responses.retrieve(response_id)
    assert whole.status == "completed" and whole.output_text == canonical(fake)
    # Billed once: the create has the input and every output token, the reads nothing.
    journal = fake.journal(settle_s=2)
    created = [e for e in journal if e["path"] == "/v1/responses"]
    reads = [e for e in journal if e["path"].startswith(f"/v1/responses/{response_id}")]
    assert len(created) == 1 and created[0]["output_tokens_billed"] == len(
        fake.canonical_tokens([{"role": "user", "content": PROMPT}])
    )
    assert len(reads) == 3 and all(
        e["output_tokens_billed"] == e["input_tokens_billed"] == 0 for e in reads
    )


def test_a_cancelled_background_response_stops_generating(
    fake: FakeProvider, sdk: openai.OpenAI
) -> None:
    fake.token_delay_ms = 20
    response_id, _, _ = start_background(sdk, PROMPT, 8)
    cancelled = sdk.responses.cancel(response_id)
    assert cancelled.status == "cancelled"
    assert cancelled.output_text  # what was made before, kept
    billed = fake.journal(settle_s=1)[0]["output_tokens_billed"]
    total = len(fake.canonical_tokens([{"role": "user", "content": PROMPT}]))
    assert 0 < billed < total  # it stopped: the rest was never made (nor billed)
    assert sdk.responses.cancel(response_id).status == "cancelled"  # again: the same
    with pytest.raises(openai.NotFoundError, match="not found"):
        sdk.responses.cancel("resp_unknown")
    with pytest.raises(openai.NotFoundError, match="Response with id 'resp_unknown'"):
        sdk.responses.retrieve("resp_unknown")


def test_past_the_window_a_stream_is_refused_as_openai_refuses_it(
    fake: FakeProvider, sdk: openai.OpenAI
) -> None:
    response_id, last, _ = start_background(sdk, PROMPT, 5)
    configure(fake, background_window_s=0)
    try:
        time.sleep(0.05)
        with pytest.raises(openai.BadRequestError, match="more than 1 minutes old"):
            list(sdk.responses.retrieve(response_id, stream=True, starting_after=last))
        assert sdk.responses.retrieve(response_id).id == response_id  # still there, whole
    finally:
        configure(fake, background_window_s=300)
    with pytest.raises(openai.BadRequestError, match="can no longer be streamed"):
        configure(fake, background_window_s=0)
        try:
            list(sdk.responses.retrieve(response_id, stream=True))
        finally:
            configure(fake, background_window_s=300)


def test_a_queued_response_is_polled_and_obfuscation_can_be_left_out(
    fake: FakeProvider, sdk: openai.OpenAI
) -> None:
    configure(fake, background_queued_s=1.0)
    try:
        queued = sdk.responses.create(model="m", input=PROMPT, background=True)
        assert queued.status == "queued" and queued.background is True
        assert sdk.responses.retrieve(queued.id).status == "queued"  # within its second
        deadline = time.monotonic() + 10
        while sdk.responses.retrieve(queued.id).status != "completed":
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        configure(fake, background_queued_s=0)
    plain = httpx.get(
        f"{fake.openai_base_url}/responses/{queued.id}",
        params={"stream": "true", "include_obfuscation": "false"},
        timeout=10,
    )
    assert plain.status_code == 200 and '"obfuscation"' not in plain.text
    assert "response.output_text.delta" in plain.text


def test_faults_cut_the_reader_or_fail_the_response(fake: FakeProvider, sdk: openai.OpenAI) -> None:
    # A dropped connection: the reader is cut, the response goes on to its end.
    fake.add_faults([{"kind": "disconnect", "after_tokens": 5}])
    with pytest.raises(openai.APIError):
        list(sdk.responses.create(model="m", input=PROMPT, stream=True, background=True))
    created = fake.journal()[0]["response"]["id"]
    deadline = time.monotonic() + 10
    while sdk.responses.retrieve(created).status != "completed":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    # An error: the response itself fails.
    fake.add_faults([{"kind": "error_event", "after_tokens": 5}])
    events = list(sdk.responses.create(model="m", input=PROMPT, stream=True, background=True))
    assert events[-1].type == "response.failed"
    assert events[-1].response.error.code == "server_error"
    failed = sdk.responses.retrieve(events[0].response.id)
    assert failed.status == "failed"
    # A pause: the reader hears nothing for a while, then the rest of the same response.
    fake.add_faults([{"kind": "pause", "after_tokens": 3, "seconds": 0.5}])
    started = time.monotonic()
    events = list(sdk.responses.create(model="m", input=PROMPT, stream=True, background=True))
    assert events[-1].type == "response.completed" and time.monotonic() - started >= 0.5
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == events[-1].response.output_text


def test_faults_inside_the_reasoning_and_past_the_end(
    fake: FakeProvider, sdk: openai.OpenAI
) -> None:
    prompt = "Think first. [fake:reasoning=12]"
    fake.add_faults([{"kind": "sequence_skip", "after_tokens": 3}])
    with (
        httpx.Client() as http,
        make_client(profile(fake), http).open(plan(prompt)) as stream,
        pytest.raises(MalformedChunk, match="out of sequence"),
    ):
        read(stream)
    # A fault past the end of a background response still fires (before its last token).
    fake.add_faults([{"kind": "disconnect", "after_tokens": 100_000}])
    with pytest.raises(openai.APIError):
        list(sdk.responses.create(model="m", input=PROMPT, stream=True, background=True))


def sse(*events: dict[str, Any]) -> bytes:
    return b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)


def stream_of(body: bytes, after: int | None = None) -> ResponsesStream:
    response = httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)
    return ResponsesStream(response, stall_timeout_s=5, after=after)


def delta(n: int | None, text: str) -> dict[str, Any]:
    event: dict[str, Any] = {"type": "response.output_text.delta", "delta": text,
                             "item_id": "m", "output_index": 0, "content_index": 0}  # fmt: skip
    return event if n is None else {**event, "sequence_number": n}


def end(n: int | None, kind: str, status: str, reason: str | None = None) -> dict[str, Any]:
    response = {"id": "resp_x", "status": status, "usage": {"input_tokens": 3, "output_tokens": 2},
                "incomplete_details": {"reason": reason} if reason else None}  # fmt: skip
    event: dict[str, Any] = {"type": kind, "response": response}
    return event if n is None else {**event, "sequence_number": n}


def test_servers_that_differ_from_openai_are_read_right() -> None:
    # vLLM: a response cut by its budget ends with response.completed, status incomplete.
    cut_short = end(2, "response.completed", "incomplete", "max_output_tokens")
    stream = stream_of(sse(delta(0, "a"), delta(1, "b"), cut_short))
    assert read(stream)[0] == "ab" and stream.finish_reason == "length"
    # llama.cpp: no sequence numbers at all.
    stream = stream_of(sse(delta(None, "a"), end(None, "response.completed", "completed")))
    assert read(stream)[0] == "a" and stream.finish_reason == "stop"
    # A reattach the server replays from 0 (starting_after ignored): what was read goes.
    replay = sse(delta(0, "a"), delta(1, "b"), delta(2, "c"), end(3, "response.completed",
                                                                  "completed"))  # fmt: skip
    stream = stream_of(replay, after=1)
    assert read(stream)[0] == "c" and stream.sequence == 3
    # Honoured: it starts after.
    stream = stream_of(sse(delta(2, "c"), end(3, "response.completed", "completed")), after=1)
    assert read(stream)[0] == "c"
    # A nested error keeps its message.
    nested = {"type": "error", "sequence_number": 1, "error": {"message": "boom", "code": "x"}}
    with pytest.raises(InBandError, match="boom"):
        read(stream_of(sse(delta(0, "a"), nested)))
    # The SDK refuses what the API refuses: stop sequences and seeds have nowhere to go.
    stopped = RequestPlan(kind="fresh", model="m", messages=(ChatMessage("user", "x"),),
                          max_tokens=10, params=GenerationParams(stop=("END",)))  # fmt: skip
    with httpx.Client() as http, pytest.raises(FatalProviderError, match="no stop"):
        make_client(ProviderProfile(kind="openai-responses", base_url="http://x"), http).body(
            stopped
        )


def test_less_than_the_provider_takes_left_is_the_jobs_exit_not_a_refused_request(
    fake: FakeProvider, redis_server: RedisServer, real_store: Store
) -> None:
    """OpenAI refuses max_output_tokens below 16: a job cut with less than that left (its
    own floor lower) takes its exit, as below its floor, instead of buying a 400."""
    below = httpx.post(f"{fake.openai_base_url}/responses", timeout=10,
                       json={"model": "m", "input": "x", "max_output_tokens": 15})  # fmt: skip
    assert below.status_code == 400 and "Expected a value >= 16" in below.text
    providers = {"r": {"kind": "openai-responses", "base_url": fake.openai_base_url,
                       "counting": "usage+tokenizer", "stall_timeout_s": 5}}  # fmt: skip
    prompt = "Nearly the whole budget, then a cut."
    fake.add_faults([{"kind": "disconnect", "after_tokens": 90, "match": prompt}])
    with attempt_runner(redis_server.url, providers) as runner:
        spec = {"prompt": prompt, "provider": "r", "model": "m", "budget_tokens": 100,
                "floor_tokens": 1, "exit": {"droppable": True}}  # fmt: skip
        job_id = real_store.create(spec).id
        record = run_to_rest(runner, job_id)
    assert record.state.value == "abandoned", (record.state, record.reason)
    assert "remaining budget 10 is below the floor 16" in (record.reason or "")
    asked = [r for r in fake.journal(settle_s=1) if prompt in str(r["body"])]
    assert len(asked) == 1  # no continuation the provider would refuse
