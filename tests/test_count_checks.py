"""Bad answers from counting endpoints and engines that echo oddly, through the worker: named
in the log, never a duplicated text, never a cursor that goes backwards, never an exact
label on a guess. A real redis-server; the fake provider over HTTP, with the counting
endpoint (or the whole provider) answered by hand where a real engine misbehaves."""

from __future__ import annotations

import json
import logging
import time
import unicodedata
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from worker_support import attempt_runner, run_to_rest

from resumeq.fake import FakeProvider, count_tokens
from resumeq.store import Store
from resumeq.testing import RedisServer

pytestmark = pytest.mark.timeout(60)

Handler = Callable[[httpx.Request], httpx.Response]


class Routed(httpx.BaseTransport):
    """``/tokenize`` answered by ``handler``; everything else over real HTTP."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.real = httpx.HTTPTransport()
        self.counted = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/tokenize"):
            self.counted += 1
            return self.handler(request)
        return self.real.handle_request(request)

    def close(self) -> None:
        self.real.close()


BAD_ANSWERS: dict[str, Handler] = {
    "404": lambda r: httpx.Response(404, json={"error": {"message": "Not Found"}}),
    "500": lambda r: httpx.Response(500, text="internal error"),
    "html": lambda r: httpx.Response(
        200, text="<html><body>Bad Gateway</body></html>", headers={"content-type": "text/html"}
    ),
    "empty list": lambda r: httpx.Response(200, json={"tokens": []}),
    "list of strings": lambda r: httpx.Response(200, json={"tokens": ["Hel", "lo"]}),
    "count of zero": lambda r: httpx.Response(200, json={"count": 0, "tokens": []}),
    "more tokens than bytes": lambda r: httpx.Response(200, json={"tokens": list(range(99_999))}),
}

CUT = 150
BUDGET = 400


def llamacpp_profile(fake: FakeProvider, **over: Any) -> dict[str, Any]:
    return {
        "kind": "openai",
        "base_url": fake.openai_base_url,
        "continue_mode": "prefill",
        "counting": "tokenizer",
        "tokenizer": "llamacpp",
        "stall_timeout_s": 5,
        **over,
    }


@pytest.fixture
def llamacpp(fake: FakeProvider) -> Iterator[FakeProvider]:
    fake.configure_engine("llamacpp")
    fake.completion_tokens = 300
    yield fake


def cut_job(store: Store, fake: FakeProvider, prompt: str, budget: int = BUDGET) -> tuple[str, str]:
    fake.add_faults([{"kind": "disconnect", "after_tokens": CUT, "match": prompt}])
    spec = {"prompt": prompt, "provider": "p", "model": "m", "budget_tokens": budget}
    return store.create(spec).id, fake.canonical_text([{"role": "user", "content": prompt}])


@pytest.mark.parametrize("answer", sorted(BAD_ANSWERS))
def test_a_count_that_cannot_be_right_is_refused_and_the_estimate_kept(
    answer: str,
    llamacpp: FakeProvider,
    redis_server: RedisServer,
    real_store: Store,
    caplog: pytest.LogCaptureFixture,
) -> None:
    transport = Routed(BAD_ANSWERS[answer])
    prompt = f"Tell me a story ({answer})"
    job_id, want = cut_job(real_store, llamacpp, prompt)
    providers = {"p": llamacpp_profile(llamacpp)}
    caplog.set_level(logging.INFO)
    with attempt_runner(redis_server.url, providers, http=httpx.Client(transport=transport)) as r:
        r.run(job_id)
        after_cut = real_store.get(job_id)
        record = run_to_rest(r, job_id)
    assert transport.counted >= 1
    # The cut attempt's 150 tokens: the cursor holds at least that many, labelled a guess.
    assert after_cut.spent_output_tokens >= CUT and not after_cut.counts_exact
    cut_attempt = real_store.ledger(job_id)[0]
    assert cut_attempt["count_source"] == "estimate" and not cut_attempt["counts_exact"]
    assert cut_attempt["count_refused"]
    assert "not believed" in caplog.text or "counting endpoint failed" in caplog.text
    # The text is exact, once; nothing was bought past the budget.
    assert record.state.value == "done" and real_store.text(job_id).startswith(want[:200])
    assert want.startswith(real_store.text(job_id))
    requests = [e for e in llamacpp.journal(settle_s=1) if prompt in str(e["body"])]
    assert sum(e["output_tokens_billed"] for e in requests) <= BUDGET
    assert requests[1]["body"]["max_tokens"] <= BUDGET - CUT
    assert not record.counts_exact


def test_vllms_tokenize_body_at_llamacpp_is_never_taken_for_zero(
    llamacpp: FakeProvider, redis_server: RedisServer, real_store: Store
) -> None:
    """The defect found on a real llama.cpp server: vLLM's body got ``{"tokens": []}``, the
    cursor went from 150 to 0 and the job bought 550 tokens on a budget of 400."""
    prompt = "Tell me a story (vLLM body at llama.cpp)"
    job_id, want = cut_job(real_store, llamacpp, prompt)
    with attempt_runner(redis_server.url, {"p": llamacpp_profile(llamacpp, tokenizer="vllm")}) as r:
        r.run(job_id)
        after_cut = real_store.get(job_id)
        record = run_to_rest(r, job_id)
    assert after_cut.spent_output_tokens >= CUT and not after_cut.counts_exact
    requests = [e for e in llamacpp.journal(settle_s=1) if prompt in str(e["body"])]
    assert requests[1]["body"]["max_tokens"] <= BUDGET - CUT
    assert sum(e["output_tokens_billed"] for e in requests) <= BUDGET
    assert want.startswith(real_store.text(job_id)) and not record.counts_exact


def test_the_right_body_counts_exactly(
    llamacpp: FakeProvider, redis_server: RedisServer, real_store: Store
) -> None:
    prompt = "Tell me a story (llama.cpp body)"
    job_id, want = cut_job(real_store, llamacpp, prompt)
    with attempt_runner(redis_server.url, {"p": llamacpp_profile(llamacpp)}) as r:
        record = run_to_rest(r, job_id)
    assert real_store.text(job_id) == want
    assert record.counts_exact and record.spent_output_tokens == count_tokens(want)


def test_usage_only_in_the_last_chunk_is_recounted_where_the_engine_can(
    llamacpp: FakeProvider, redis_server: RedisServer, real_store: Store
) -> None:
    """llama.cpp ignores continuous_usage_stats: usage alone leaves a cut attempt estimated,
    usage+tokenizer makes it exact."""
    for counting, exact in (("usage", False), ("usage+tokenizer", True)):
        prompt = f"Tell me a story ({counting})"
        job_id, want = cut_job(real_store, llamacpp, prompt, budget=1_000)  # room for a guess
        profile = llamacpp_profile(llamacpp, counting=counting)
        with attempt_runner(redis_server.url, {"p": profile}) as r:
            record = run_to_rest(r, job_id)
        assert real_store.text(job_id) == want
        assert record.counts_exact is exact
        assert real_store.ledger(job_id)[0]["counts_exact"] is exact
        if exact:
            assert record.spent_output_tokens == count_tokens(want)
        else:
            assert record.spent_output_tokens >= count_tokens(want)


def test_a_count_slower_than_the_lease_is_cut_short_and_the_text_kept(
    llamacpp: FakeProvider, redis_server: RedisServer, real_store: Store
) -> None:
    """The counting request may not outlive the lease: the text is flushed before it and
    the heartbeat runs through it."""

    def slow(request: httpx.Request) -> httpx.Response:
        time.sleep(3.0)
        return httpx.Response(200, json={"tokens": [1] * CUT})

    prompt = "Tell me a story (slow count)"
    job_id, _ = cut_job(real_store, llamacpp, prompt)
    transport = Routed(slow)
    profile = llamacpp_profile(llamacpp)
    with attempt_runner(
        redis_server.url, {"p": profile}, http=httpx.Client(transport=transport), lease_ttl_ms=1500
    ) as r:
        outcome = r.run(job_id)
    record = real_store.get(job_id)
    assert outcome == "queued" and record.state.value == "queued"
    assert count_tokens(real_store.text(job_id)) == CUT
    assert real_store.ledger(job_id)[0]["outcome"] == "resume"


# -- engines that echo oddly ---------------------------------------------------------------


def sse(*chunks: dict[str, Any]) -> bytes:
    return b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"


def delta(text: str) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}


STOP = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
PREFIX = "Café au lait,  twice.\nThen the café closed, and we walked home along the river."


@pytest.mark.parametrize(
    ("echo", "setting"),
    [
        (lambda p: p, "auto"),
        (lambda p: unicodedata.normalize("NFD", p), "auto"),
        (lambda p: p.replace("  ", " ").replace("\n", "\r\n"), "auto"),
        (lambda p: p[:40], "yes"),
    ],
    ids=["exact", "nfd", "other-white-space", "partial"],
)
def test_an_odd_echo_is_dropped_and_named(
    echo: Callable[[str], str],
    setting: str,
    redis_server: RedisServer,
    real_store: Store,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def provider(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        last = body["messages"][-1]
        if last["role"] != "assistant":
            chunks = [delta(PREFIX[i : i + 10]) for i in range(0, len(PREFIX), 10)]
            out = b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks)
            return httpx.Response(200, content=out, headers={"content-type": "text/event-stream"})
        first = echo(last["content"]) + " It was late."
        return httpx.Response(
            200,
            content=sse(delta(first), delta(" The end."), STOP),
            headers={"content-type": "text/event-stream"},
        )

    profile = {
        "kind": "openai",
        "base_url": "http://engine.invalid/v1",
        "continue_mode": "prefill",
        "prefill_echo": setting,
        "stall_timeout_s": 5,
    }
    spec = {"prompt": "p", "provider": "p", "model": "m", "budget_tokens": 500}
    job_id = real_store.create(spec).id
    caplog.set_level(logging.INFO)
    http = httpx.Client(transport=httpx.MockTransport(provider))
    with attempt_runner(redis_server.url, {"p": profile}, http=http) as r:
        record = run_to_rest(r, job_id)
    assert record.state.value == "done"
    assert real_store.text(job_id) == PREFIX + " It was late. The end."
    assert "repeat" in caplog.text or "echo" in caplog.text
    resumed = real_store.ledger(job_id)[1]
    assert resumed["echo_chars"] >= 40
