"""Faults, the journal, caching, counting endpoints and the server's lifecycle, with raw httpx."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, get_args

import httpx
import pytest

from resumeq.fake import FakeProvider, Fault, FaultKind, count_tokens

pytestmark = pytest.mark.timeout(20)

MESSAGES = [
    {"role": "system", "content": "You answer in prose."},
    {"role": "user", "content": "What is a tide?"},
]
OPENAI_BODY = {"model": "m", "messages": MESSAGES, "stream": True}
ANTHROPIC_BODY = {
    "model": "m",
    "max_tokens": 4096,
    "system": MESSAGES[0]["content"],
    "messages": MESSAGES[1:],
    "stream": True,
}
WIRES = {
    "openai": ("/v1/chat/completions", OPENAI_BODY),
    "anthropic": ("/v1/messages", ANTHROPIC_BODY),
}


@pytest.fixture(scope="module")
def server() -> Iterator[FakeProvider]:
    with FakeProvider(completion_tokens=200) as fake:
        yield fake


@pytest.fixture
def fake(server: FakeProvider) -> FakeProvider:
    server.reset()
    server.token_delay_ms = 0
    return server


@pytest.fixture
def http(fake: FakeProvider) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=fake.url, timeout=10) as client:
        yield client


@dataclass
class Received:
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    events: list[tuple[str | None, str]] = field(default_factory=list)  # (event, data)
    error: Exception | None = None
    arrivals: list[float] = field(default_factory=list)

    def datas(self) -> list[str]:
        return [data for _, data in self.events]

    def text(self) -> str:
        """The streamed text of either wire."""
        parts = []
        for _, data in self.events:
            try:
                chunk = json.loads(data)
            except ValueError:
                continue
            if isinstance(chunk, dict) and chunk.get("choices"):
                parts.append(chunk["choices"][0]["delta"].get("content") or "")
            elif isinstance(chunk, dict) and chunk.get("type") == "content_block_delta":
                parts.append(chunk["delta"]["text"])
        return "".join(parts)


def receive(http: httpx.Client, path: str, body: dict[str, Any], **kwargs: Any) -> Received:
    """Read an SSE response event by event, keeping whatever error ends it."""
    result = Received()
    event: str | None = None
    data: list[str] = []
    try:
        with http.stream("POST", path, json=body, **kwargs) as response:
            result.status, result.headers = response.status_code, dict(response.headers)
            for line in response.iter_lines():
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: "):
                    data.append(line[6:])
                elif not line and data:
                    result.events.append((event, "\n".join(data)))
                    result.arrivals.append(time.monotonic())
                    event, data = None, []
    except httpx.HTTPError as exc:
        result.error = exc
    return result


def last_entry(fake: FakeProvider) -> dict[str, Any]:
    return fake.journal(settle_s=5)[-1]


# -- stream faults ---------------------------------------------------------------------------


@pytest.mark.parametrize("wire", WIRES)
def test_disconnect_cuts_the_socket_and_bills_what_was_sent(
    fake: FakeProvider, http: httpx.Client, wire: str
) -> None:
    path, body = WIRES[wire]
    fake.add_faults([{"kind": "disconnect", "after_tokens": 4}])
    got = receive(http, path, body)
    assert isinstance(got.error, httpx.RemoteProtocolError)
    tokens = fake.canonical_tokens(MESSAGES)
    assert got.text() == "".join(tokens[:4])
    assert "[DONE]" not in got.datas()
    entry = last_entry(fake)
    assert entry["outcome"] == "disconnect" and entry["fault"]["kind"] == "disconnect"
    assert entry["tokens_emitted"] == entry["output_tokens_billed"] == 4
    assert entry["text"] == "".join(tokens[:4])


@pytest.mark.parametrize("wire", WIRES)
def test_truncate_ends_cleanly_without_a_finish(
    fake: FakeProvider, http: httpx.Client, wire: str
) -> None:
    path, body = WIRES[wire]
    fake.add_faults([{"kind": "truncate", "after_tokens": 6}])
    got = receive(http, path, body)
    assert got.error is None and got.status == 200
    assert got.text() == "".join(fake.canonical_tokens(MESSAGES)[:6])
    assert "[DONE]" not in got.datas()
    assert all('"finish_reason":null' in d for d in got.datas() if "finish_reason" in d)
    assert [e for e, _ in got.events if e in ("message_delta", "message_stop")] == []
    assert last_entry(fake)["finish_reason"] is None
    assert last_entry(fake)["output_tokens_billed"] == 6


@pytest.mark.parametrize("wire", WIRES)
def test_malformed_sends_one_event_that_is_not_json(
    fake: FakeProvider, http: httpx.Client, wire: str
) -> None:
    path, body = WIRES[wire]
    fake.add_faults([{"kind": "malformed", "after_tokens": 3}])
    got = receive(http, path, body)
    assert got.error is None
    assert got.text() == "".join(fake.canonical_tokens(MESSAGES)[:3])
    with pytest.raises(ValueError):
        json.loads(got.datas()[-1])
    for data in got.datas()[:-1]:
        json.loads(data)
    assert last_entry(fake)["outcome"] == "malformed"


@pytest.mark.parametrize("wire", WIRES)
def test_stall_sends_no_bytes_for_the_given_seconds_then_closes(
    fake: FakeProvider, http: httpx.Client, wire: str
) -> None:
    path, body = WIRES[wire]
    fake.add_faults([{"kind": "stall", "after_tokens": 2, "seconds": 1.0}])
    got = receive(http, path, body)
    stalled_for = time.monotonic() - got.arrivals[-1]
    assert isinstance(got.error, httpx.RemoteProtocolError)
    assert 0.9 <= stalled_for < 5
    assert got.text() == "".join(fake.canonical_tokens(MESSAGES)[:2])
    assert last_entry(fake)["outcome"] == "stall"


@pytest.mark.parametrize("wire", WIRES)
def test_a_pause_sends_only_keep_alives_then_the_rest_of_the_answer(
    fake: FakeProvider, http: httpx.Client, wire: str
) -> None:
    path, body = WIRES[wire]
    fake.add_faults([{"kind": "pause", "after_tokens": 3, "seconds": 1.0, "keepalive_s": 0.3}])
    got = receive(http, path, body)
    assert got.error is None
    assert got.text() == fake.canonical_text(MESSAGES)  # nothing lost, nothing twice
    gaps = [b - a for a, b in zip(got.arrivals, got.arrivals[1:], strict=False)]
    assert 0.9 <= max(gaps) < 5  # one quiet second mid-answer (keep-alives are no events)
    entry = last_entry(fake)
    assert entry["outcome"] == "finished" and entry["fault"]["kind"] == "pause"


def test_a_paused_answer_that_is_not_streamed_comes_whole_and_late(
    fake: FakeProvider, http: httpx.Client
) -> None:
    fake.add_faults([{"kind": "pause", "seconds": 0.5}])
    started = time.monotonic()
    reply = http.post("/v1/chat/completions", json={**OPENAI_BODY, "stream": False})
    assert reply.status_code == 200 and time.monotonic() - started >= 0.5
    content = reply.json()["choices"][0]["message"]["content"]
    assert content == fake.canonical_text(MESSAGES)


def test_a_stall_trips_a_read_timeout(fake: FakeProvider, http: httpx.Client) -> None:
    fake.add_faults([{"kind": "stall", "after_tokens": 1, "seconds": 1.0}])
    got = receive(http, *WIRES["openai"], timeout=httpx.Timeout(5, read=0.3))
    assert isinstance(got.error, httpx.ReadTimeout)


def test_openai_error_event_is_a_vllm_error_chunk(fake: FakeProvider, http: httpx.Client) -> None:
    fake.add_faults([{"kind": "error_event", "after_tokens": 5}])
    got = receive(http, *WIRES["openai"])
    assert got.datas()[-1] == "[DONE]"
    error = json.loads(got.datas()[-2])["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert got.text() == "".join(fake.canonical_tokens(MESSAGES)[:5])
    assert last_entry(fake)["outcome"] == "error_event"


def test_anthropic_error_event_is_overloaded(fake: FakeProvider, http: httpx.Client) -> None:
    fake.add_faults([{"kind": "error_event", "after_tokens": 5}])
    got = receive(http, *WIRES["anthropic"])
    name, data = got.events[-1]
    assert name == "error"
    assert json.loads(data) == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "Overloaded"},
    }
    assert "message_stop" not in [e for e, _ in got.events]
    assert last_entry(fake)["output_tokens_billed"] == 5


def test_a_fault_past_the_end_fires_before_the_finish(
    fake: FakeProvider, http: httpx.Client
) -> None:
    fake.add_faults([{"kind": "truncate", "after_tokens": 10_000}])
    got = receive(http, *WIRES["openai"])
    assert got.text() == fake.canonical_text(MESSAGES)
    assert "[DONE]" not in got.datas()
    assert last_entry(fake)["finish_reason"] is None


# -- status faults, order, times -------------------------------------------------------------


def test_status_429_with_retry_after_honours_times(fake: FakeProvider, http: httpx.Client) -> None:
    fake.add_faults([{"kind": "status", "status": 429, "retry_after": 1.0, "times": 2}])
    for _ in range(2):
        response = http.post("/v1/chat/completions", json=OPENAI_BODY)
        assert response.status_code == 429
        assert response.headers["retry-after"] == "1"
        assert response.headers["retry-after-ms"] == "1000"
        assert response.json()["error"]["code"] == "rate_limit_exceeded"
    assert receive(http, *WIRES["openai"]).text() == fake.canonical_text(MESSAGES)
    outcomes = [entry["outcome"] for entry in fake.journal(settle_s=5)]
    assert outcomes == ["status", "status", "finished"]
    assert [e["output_tokens_billed"] for e in fake.journal()] == [0, 0, 200]


@pytest.mark.parametrize(
    ("status", "kind"),
    [(529, "overloaded_error"), (400, "invalid_request_error"), (500, "api_error")],
)
def test_anthropic_status_bodies(
    fake: FakeProvider, http: httpx.Client, status: int, kind: str
) -> None:
    fake.add_faults([{"kind": "status", "status": status}])
    response = http.post("/v1/messages", json=ANTHROPIC_BODY)
    assert response.status_code == status
    assert response.json()["type"] == "error"
    assert response.json()["error"]["type"] == kind
    assert "retry-after" not in response.headers


def test_faults_apply_in_order_and_skip_counting_requests(
    fake: FakeProvider, http: httpx.Client
) -> None:
    fake.add_faults(
        [{"kind": "truncate", "after_tokens": 1}, {"kind": "disconnect", "after_tokens": 2}]
    )
    assert http.post("/tokenize", json={"model": "m", "prompt": "a b"}).status_code == 200
    count = http.post("/v1/messages/count_tokens", json={"model": "m", "messages": MESSAGES[1:]})
    assert count.status_code == 200
    assert receive(http, *WIRES["anthropic"]).error is None
    assert isinstance(receive(http, *WIRES["openai"]).error, httpx.RemoteProtocolError)
    assert receive(http, *WIRES["openai"]).text() == fake.canonical_text(MESSAGES)
    outcomes = [entry["outcome"] for entry in fake.journal(settle_s=5)]
    assert outcomes == ["finished", "finished", "truncate", "disconnect", "finished"]


def test_non_streaming_faults(fake: FakeProvider, http: httpx.Client) -> None:
    plain = {**OPENAI_BODY, "stream": False}
    fake.add_faults(
        [
            {"kind": "disconnect", "after_tokens": 7},
            {"kind": "truncate", "after_tokens": 7},
            {"kind": "malformed"},
            {"kind": "error_event"},
        ]
    )
    with pytest.raises(httpx.RemoteProtocolError):
        http.post("/v1/chat/completions", json=plain)
    with pytest.raises(httpx.RemoteProtocolError):
        http.post("/v1/chat/completions", json=plain)
    with pytest.raises(ValueError):
        http.post("/v1/chat/completions", json=plain).json()
    assert http.post("/v1/chat/completions", json=plain).status_code == 503
    billed = [entry["output_tokens_billed"] for entry in fake.journal(settle_s=5)]
    assert billed == [7, 7, 0, 0]


def test_bad_faults_are_refused_and_nothing_is_queued(http: httpx.Client) -> None:
    bad = [{"kind": "truncate"}, {"kind": "explode"}]
    assert http.post("/_fake/faults", json=bad).status_code == 422
    assert http.get("/_fake/faults").json() == []
    queued = http.post("/_fake/faults", json=[{"kind": "stall", "times": 3}]).json()
    assert queued["queued"] == 1 and queued["pending"][0]["uses_left"] == 3


def test_a_refused_fault_is_named_by_its_place_and_field(http: httpx.Client) -> None:
    refused = http.post("/_fake/faults", json=[{"kind": "truncate"}, {"kind": "explode"}])
    message = refused.json()["error"]["message"]
    assert message.startswith("faults[1].kind: Input should be 'disconnect'"), message
    refused = http.post("/_fake/faults", json={"faults": [{"kind": "stall", "secs": 3}]})
    assert refused.json()["error"]["message"] == "faults[0].secs: Extra inputs are not permitted"
    refused = http.post("/_fake/faults", json={"kind": "stall"})
    assert (
        refused.status_code == 422 and "/_fake/faults/schema" in refused.json()["error"]["message"]
    )
    refused = http.post("/_fake/config", json={"chaos": {"probability": 2}})
    assert refused.json()["error"]["message"].startswith("chaos.probability: ")
    assert http.get("/_fake/faults").json() == []


def test_faults_are_listed_with_ids_taken_out_one_by_one_and_cleared(
    fake: FakeProvider, http: httpx.Client
) -> None:
    posted = http.post(
        "/_fake/faults",
        json=[
            {"kind": "truncate", "after_tokens": 3},
            {"kind": "disconnect", "after_tokens": 4, "times": 2},
            {"kind": "status", "status": 529},
        ],
    ).json()
    first, second, third = posted["ids"]
    assert second == first + 1 and third == first + 2
    listed = http.get("/_fake/faults").json()
    assert listed == posted["pending"] == fake.pending_faults()
    assert [(f["id"], f["kind"], f["uses_left"]) for f in listed] == [
        (first, "truncate", 1),
        (second, "disconnect", 2),
        (third, "status", 1),
    ]
    assert listed[0] == {
        **Fault(kind="truncate", after_tokens=3).model_dump(),
        "id": first,
        "uses_left": 1,
    }

    removed = http.delete(f"/_fake/faults/{first}")
    assert removed.status_code == 200 and removed.json()["removed"] == listed[0]
    assert [f["id"] for f in removed.json()["pending"]] == [second, third]
    gone = http.delete(f"/_fake/faults/{first}")
    assert gone.status_code == 404
    assert (
        gone.json()["error"]["message"] == f"no queued fault '{first}' (queued: {second}, {third})"
    )
    assert http.delete("/_fake/faults/seven").status_code == 404

    # The truncate is gone: the next request takes the disconnect, and one use of it is left.
    assert isinstance(receive(http, *WIRES["openai"]).error, httpx.RemoteProtocolError)
    assert last_entry(fake)["fault"]["kind"] == "disconnect"
    assert [(f["id"], f["uses_left"]) for f in http.get("/_fake/faults").json()] == [
        (second, 1),
        (third, 1),
    ]

    cleared = http.delete("/_fake/faults")
    assert cleared.status_code == 200 and cleared.json() == {"cleared": 2, "pending": []}
    assert http.get("/_fake/faults").json() == []
    assert receive(http, *WIRES["openai"]).text() == fake.canonical_text(MESSAGES)
    assert http.delete("/_fake/faults").json()["cleared"] == 0
    later = http.post("/_fake/faults", json=[{"kind": "truncate"}]).json()
    assert later["ids"] == [third + 1]  # ids are never reused
    assert fake.clear_faults() == 1 and fake.pending_faults() == []
    assert http.delete("/_fake/nothing").status_code == 404  # not the server's 501 page


def test_the_fault_schema_is_served_and_describes_every_kind(http: httpx.Client) -> None:
    schema = http.get("/_fake/faults/schema").json()
    assert schema == Fault.model_json_schema()
    assert schema["properties"]["kind"]["enum"] == list(get_args(FaultKind))
    assert schema["required"] == ["kind"] and schema["additionalProperties"] is False
    # Each kind, with the schema's defaults, is a fault the provider queues.
    faults = [{"kind": kind} for kind in schema["properties"]["kind"]["enum"]]
    posted = http.post("/_fake/faults", json=faults)
    assert posted.status_code == 200 and posted.json()["queued"] == len(faults)
    for name, prop in schema["properties"].items():
        if name != "kind":
            assert posted.json()["pending"][0][name] == prop.get("default"), name


# -- journal, reset, caching, counting -------------------------------------------------------


def test_journal_over_http_and_reset(fake: FakeProvider, http: httpx.Client) -> None:
    receive(http, *WIRES["openai"])
    over_http = http.get("/_fake/requests").json()
    assert over_http == fake.journal()
    entry = over_http[0]
    assert entry["path"] == "/v1/chat/completions" and entry["body"] == OPENAI_BODY
    assert entry["status"] == 200 and entry["stream"] and not entry["is_continuation"]
    assert entry["input_tokens_billed"] == count_tokens("You answer in prose.What is a tide?") + 5
    fake.add_faults([{"kind": "truncate"}])
    assert http.post("/_fake/reset").json() == {"ok": True}
    assert fake.journal() == [] and http.get("/_fake/faults").json() == []


def test_openai_caches_a_repeated_long_prompt(fake: FakeProvider, http: httpx.Client) -> None:
    long = [{"role": "user", "content": " ".join(["tide"] * 1400)}]
    body = {**OPENAI_BODY, "messages": long, "stream_options": {"include_usage": True}}

    def cached() -> int:
        usage = json.loads(receive(http, "/v1/chat/completions", body).datas()[-2])["usage"]
        assert usage["prompt_tokens"] == 1403
        return int(usage["prompt_tokens_details"]["cached_tokens"])

    assert cached() == 0
    assert cached() == 1024 + 2 * 128
    assert last_entry(fake)["cached_input_tokens"] == 1280
    fake.reset()
    assert cached() == 0


def test_anthropic_caches_up_to_the_last_breakpoint(fake: FakeProvider, http: httpx.Client) -> None:
    system = [{"type": "text", "text": "Rules. " * 40, "cache_control": {"type": "ephemeral"}}]
    body = {**ANTHROPIC_BODY, "system": system, "stream": False, "max_tokens": 5}
    first = http.post("/v1/messages", json=body).json()["usage"]
    second = http.post("/v1/messages", json=body).json()["usage"]
    marked = 1 + count_tokens("Rules. " * 40)
    total = marked + 1 + count_tokens("What is a tide?") + 3
    assert first["cache_creation_input_tokens"] == marked and first["cache_read_input_tokens"] == 0
    assert second["cache_read_input_tokens"] == marked
    assert second["cache_creation_input_tokens"] == 0
    assert first["input_tokens"] == second["input_tokens"] == total - marked
    assert last_entry(fake)["input_tokens_billed"] == total
    plain = http.post("/v1/messages", json={**body, "system": "Rules."}).json()["usage"]
    assert (plain["cache_read_input_tokens"], plain["cache_creation_input_tokens"]) == (0, 0)


def test_vllm_tokenize_counts_exactly(fake: FakeProvider, http: httpx.Client) -> None:
    tokens = fake.canonical_tokens(MESSAGES)
    prefix = "".join(tokens[:77])
    answer = http.post("/tokenize", json={"model": "m", "prompt": prefix}).json()
    assert answer["count"] == len(answer["tokens"]) == 77
    assert answer["max_model_len"] > 0
    chat = http.post("/tokenize", json={"model": "m", "messages": MESSAGES}).json()
    assert chat["count"] == count_tokens("You answer in prose.What is a tide?") + 5


# -- pacing, throughput, lifecycle -----------------------------------------------------------


def test_token_delay_paces_the_stream(fake: FakeProvider, http: httpx.Client) -> None:
    fake.token_delay_ms = 40
    started = time.monotonic()
    got = receive(http, "/v1/chat/completions", {**OPENAI_BODY, "max_tokens": 6})
    assert time.monotonic() - started >= 0.19
    assert got.text() == "".join(fake.canonical_tokens(MESSAGES)[:6])


def test_streams_twenty_thousand_tokens(http: httpx.Client, fake: FakeProvider) -> None:
    """A long stream arrives whole. Its speed is measured where speeds belong, in
    benchmarks/overhead.py (``off_tokens_per_s``, ``bare_tokens_per_s``)."""
    fake.completion_tokens = 20_000
    try:
        with http.stream("POST", "/v1/chat/completions", json=OPENAI_BODY) as response:
            size = sum(len(chunk) for chunk in response.iter_raw())
    finally:
        fake.completion_tokens = 200
    assert size > 20_000 * 100
    assert last_entry(fake)["tokens_emitted"] == 20_000


def test_stop_ends_a_stall_at_once() -> None:
    fake = FakeProvider().start()
    fake.add_faults([{"kind": "stall", "after_tokens": 1, "seconds": 30}])
    with httpx.Client(base_url=fake.url, timeout=10) as http:
        with http.stream("POST", "/v1/chat/completions", json=OPENAI_BODY) as response:
            lines = response.iter_lines()
            assert next(lines).startswith("data: ")
            started = time.monotonic()
            fake.stop()
            with pytest.raises(httpx.RemoteProtocolError):
                for _ in lines:
                    pass
        assert time.monotonic() - started < 3


def test_serve_runs_until_sigterm() -> None:
    code = "from resumeq.fake import serve; serve('127.0.0.1', 0, 50, 0)"
    process = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        url = line.split(" on ", 1)[1].split(" ", 1)[0]
        assert httpx.get(f"{url}/_fake/health").json() == {"ok": True}
        body = {"model": "m", "messages": MESSAGES[1:]}
        answer = httpx.post(f"{url}/v1/chat/completions", json=body).json()
        assert answer["usage"]["completion_tokens"] == 50
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()


# -- usage modes and admin extras ------------------------------------------------------------


def test_continuous_usage_stats_need_include_usage_as_in_vllm(http: httpx.Client) -> None:
    options = {"include_usage": True, "continuous_usage_stats": True}
    got = receive(http, "/v1/chat/completions", {**OPENAI_BODY, "stream_options": options})
    chunks = [json.loads(data) for data in got.datas()[:-1]]
    content = [c for c in chunks if c["choices"] and "content" in c["choices"][0]["delta"]]
    completion = [c["usage"]["completion_tokens"] for c in content]
    assert completion == list(range(len(content)))  # the role chunk (0), then 1, 2, ...
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 200
    alone = {"continuous_usage_stats": True}
    got = receive(http, "/v1/chat/completions", {**OPENAI_BODY, "stream_options": alone})
    assert all("usage" not in json.loads(data) for data in got.datas()[:-1])


def test_stream_options_without_stream_is_refused(http: httpx.Client) -> None:
    body = {**OPENAI_BODY, "stream": False, "stream_options": {"include_usage": True}}
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "stream_options"


def test_admin_config_canonical_and_unknown_routes(fake: FakeProvider, http: httpx.Client) -> None:
    assert http.post("/_fake/config", json={"completion_tokens": 12}).json() == {
        "completion_tokens": 12,
        "token_delay_ms": 0.0,
        "engine": "vllm",
        "prefill_echo": False,
        "continuous_usage": True,
        "tokenize": "vllm",
    }
    try:
        canonical = http.post("/_fake/canonical", json={"messages": MESSAGES}).json()
        assert canonical["count"] == 12 and canonical["text"] == fake.canonical_text(MESSAGES)
        assert "".join(canonical["tokens"]) == canonical["text"]
    finally:
        http.post("/_fake/config", json={"completion_tokens": 200})
    assert http.post("/v2/nothing", json={}).status_code == 404
    assert http.get("/nothing").status_code == 404
    assert http.post("/v1/messages", content=b"{not json").status_code == 400
