"""Background responses on the Responses wire (``background = true``): after a cut the next
attempt reads the rest of the same response from the provider (``reattach``), billed once,
and falls back to a continuation only when the provider cannot give it. Through the
worker's code path, a real redis-server and the fake provider over HTTP."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from e2e_support import background_exchanges
from worker_support import attempt_runner, run_to_rest

from resumeq.core.continuation import plan_reattach
from resumeq.core.errors import MalformedChunk, ReattachRefused, ResponseQueued
from resumeq.core.settings import ProviderProfile
from resumeq.core.spec import JobSpec
from resumeq.fake import FakeProvider
from resumeq.providers import make_client
from resumeq.providers.openai_responses import ResponsesStream
from resumeq.store import Store
from resumeq.testing import RedisServer

pytestmark = pytest.mark.timeout(60)

SPEC = JobSpec.model_validate({"prompt": "p", "provider": "r", "model": "m", "budget_tokens": 100})
#: Code, a table, repeats and odd Unicode, past 2,000 characters.
PROMPT = "Write the module with its tests, and a table of results [fake:mixed]"


def providers(fake: FakeProvider, **over: Any) -> dict[str, dict[str, Any]]:
    profile = {
        "kind": "openai-responses",
        "base_url": fake.openai_base_url,
        "continue_mode": "continue_final_message",
        "counting": "usage",
        "background": True,
        "stall_timeout_s": 5,
    }
    return {"r": {**profile, **over}}


def canonical(fake: FakeProvider, prompt: str = PROMPT) -> str:
    return fake.canonical_text([{"role": "user", "content": prompt}])


def create(store: Store, prompt: str = PROMPT, **over: Any) -> str:
    spec = {"prompt": prompt, "provider": "r", "model": "m", "budget_tokens": 4000, **over}
    return store.create(spec).id


def exchanges(fake: FakeProvider, prompt: str = PROMPT) -> dict[str, list[dict[str, Any]]]:
    return background_exchanges(fake, prompt)


def configure(fake: FakeProvider, **body: Any) -> None:
    httpx.post(f"{fake.url}/_fake/config", json=body, timeout=10).raise_for_status()


@pytest.mark.parametrize("kind", ["disconnect", "truncate", "stall", "malformed"])
def test_a_cut_reads_the_rest_of_the_same_response_billed_once(
    fake: FakeProvider, redis_server: RedisServer, real_store: Store, kind: str
) -> None:
    fake.token_delay_ms = 2
    fake.add_faults([{"kind": kind, "after_tokens": 150, "match": PROMPT, "seconds": 3}])
    with attempt_runner(redis_server.url, providers(fake, stall_timeout_s=1)) as runner:
        job_id = create(real_store)
        record = run_to_rest(runner, job_id)
    text = real_store.text(job_id)
    assert record.state.value == "done", (record.reason, record.error)
    assert text == canonical(fake)
    ledger = real_store.ledger(job_id)
    assert [a["kind"] for a in ledger] == ["fresh", "reattach"]
    assert ledger[1]["prefix_chars_sent"] == 0 and ledger[1]["outcome"] == "done"
    seen = exchanges(fake)
    assert len(seen["created"]) == 1 and len(seen["status"]) == 1 and len(seen["streamed"]) == 1
    assert (
        seen["streamed"][0]["outcome"] == "replayed"
        and "starting_after=" in (seen["streamed"][0]["path"])
    )
    # Billed once: the one response's input and output, and the reads bill nothing.
    created = seen["created"][0]
    needed = len(fake.canonical_tokens([{"role": "user", "content": PROMPT}]))
    assert created["output_tokens_billed"] == needed
    assert all(e["output_tokens_billed"] == e["input_tokens_billed"] == 0 for e in seen["status"])
    # resumeq's own count agrees with the bill: the reattach took the response's total
    # and counted only what the cut attempt had not.
    assert record.spent_output_tokens == needed
    assert sum(a["input_tokens"] or 0 for a in ledger) == created["input_tokens_billed"]
    assert record.response_id is not None and record.response_seq is not None


def test_a_server_that_ignores_starting_after_never_duplicates_text(
    fake: FakeProvider, redis_server: RedisServer, real_store: Store
) -> None:
    """It streams the response again from its first event: what was stored is skipped."""
    fake.add_faults([{"kind": "disconnect", "after_tokens": 150, "match": PROMPT}])
    configure(fake, background_ignores_starting_after=True)
    with attempt_runner(redis_server.url, providers(fake)) as runner:
        job_id = create(real_store)
        record = run_to_rest(runner, job_id)
    assert record.state.value == "done" and real_store.text(job_id) == canonical(fake)
    assert [a["kind"] for a in real_store.ledger(job_id)] == ["fresh", "reattach"]
    needed = len(fake.canonical_tokens([{"role": "user", "content": PROMPT}]))
    assert record.spent_output_tokens == needed


def test_a_response_too_old_to_stream_falls_back_to_a_continuation(
    fake: FakeProvider, redis_server: RedisServer, real_store: Store
) -> None:
    fake.add_faults([{"kind": "disconnect", "after_tokens": 150, "match": PROMPT}])
    configure(fake, background_window_s=0)  # every stream of it is refused as too old
    with attempt_runner(redis_server.url, providers(fake)) as runner:
        job_id = create(real_store)
        record = run_to_rest(runner, job_id)
    assert record.state.value == "done", (record.reason, record.error)
    assert real_store.text(job_id) == canonical(fake)
    ledger = real_store.ledger(job_id)
    # One attempt: it asked, was refused, and continued from the stored prefix.
    assert [a["kind"] for a in ledger] == ["fresh", "resume"]
    assert "can no longer be streamed" in ledger[1]["reattach_refused"]
    seen = exchanges(fake)
    assert len(seen["created"]) == 2 and seen["created"][1]["body"]["input"][-1]["status"] == (
        "in_progress"
    )
    # The refused response made all its tokens, billed though never read: the continuation
    # counted them first (the provider's figure), so the cursor is what was billed.
    billed = sum(e["output_tokens_billed"] for e in seen["created"])
    assert ledger[1]["carried_output_tokens"] > 0
    assert record.spent_output_tokens == billed


def test_a_cut_while_the_seam_is_open_is_continued_never_read_on(
    fake: FakeProvider, redis_server: RedisServer, real_store: Store
) -> None:
    """A continuation cut before its seam was settled: the stored text ends at no event of
    its response, so the next attempt continues again instead of reading on (which would
    place the rest of a restated passage after the prefix)."""
    fake.add_faults(
        [
            {"kind": "disconnect", "after_tokens": 150, "match": PROMPT},
            {"kind": "disconnect", "after_tokens": 2, "match": PROMPT},
        ]
    )
    configure(fake, background_window_s=0)  # the first response is never read on
    with attempt_runner(
        redis_server.url, providers(fake, continue_mode="instruction", counting="usage+tokenizer")
    ) as runner:
        job_id = create(real_store)
        runner.run(job_id)  # cut at 150
        runner.run(job_id)  # refused, continued, cut 2 tokens in: the seam still open
        record = real_store.get(job_id)
        assert record.response_id is not None and record.response_seq is None
        assert record.attempt_kind == "resume"
        record = run_to_rest(runner, job_id)
    assert record.state.value == "done" and real_store.text(job_id) == canonical(fake)
    kinds = [a["kind"] for a in real_store.ledger(job_id)]
    assert kinds == ["fresh", "resume", "resume"], kinds


def test_a_failed_response_is_continued_from_the_prefix(
    fake: FakeProvider, redis_server: RedisServer, real_store: Store
) -> None:
    # The response itself fails (an error event): its rest will never come.
    fake.add_faults([{"kind": "error_event", "after_tokens": 100, "match": PROMPT}])
    with attempt_runner(redis_server.url, providers(fake)) as runner:
        job_id = create(real_store)
        record = run_to_rest(runner, job_id)
    assert record.state.value == "done" and real_store.text(job_id) == canonical(fake)
    ledger = real_store.ledger(job_id)
    assert [a["kind"] for a in ledger] == ["fresh", "resume"]
    assert ledger[1]["reattach_refused"].endswith("is failed")


def test_a_job_moved_to_another_provider_never_reads_the_first_ones_response(
    fake: FakeProvider, redis_server: RedisServer, real_store: Store
) -> None:
    """Spilled after its cut, then requeued by an operator to another profile: the response
    was made for the first, so it is not read on; it is cancelled, what it made (it went on
    generating after the cut) is counted first, and the job continues from its prefix."""
    fake.add_faults([{"kind": "disconnect", "after_tokens": 80, "match": PROMPT}])
    both = {**providers(fake), "r2": providers(fake)["r"]}
    with attempt_runner(redis_server.url, both) as runner:
        job_id = create(real_store, exit={"on_cut": "spill"})
        runner.run(job_id)
        record = real_store.get(job_id)
        # Spilled: nobody reads the response on; it was cancelled and what it made counted.
        assert record.state.value == "spilled" and record.response_id is None
        real_store.requeue(job_id, provider="r2")
        record = run_to_rest(runner, job_id)
    assert record.state.value == "done" and real_store.text(job_id) == canonical(fake)
    ledger = real_store.ledger(job_id)
    assert [a["kind"] for a in ledger] == ["fresh", "resume"]
    seen = exchanges(fake)
    assert not seen["streamed"]  # never read on: asked only what it made, once cancelled
    assert len(seen["status"]) == 1 and len(seen["cancelled"]) == 1  # once, at the spill
    billed = sum(e["output_tokens_billed"] for e in seen["created"])
    assert ledger[0]["carried_output_tokens"] > 0  # it went on after the cut
    assert record.spent_output_tokens == billed  # every token the provider billed, counted
    assert record.response_for == "r2 m"  # the continuation's own response


def test_a_queued_response_is_polled_not_made_again(
    fake: FakeProvider, redis_server: RedisServer, real_store: Store
) -> None:
    """The provider queues the response longer than the stall timeout: the first attempt
    is cut with nothing, and the next one polls the same response until it starts."""
    configure(fake, background_queued_s=4.0)
    with attempt_runner(redis_server.url, providers(fake, stall_timeout_s=0.8)) as runner:
        job_id = create(real_store, prompt="A short answer, please.")
        record = run_to_rest(runner, job_id)
    assert record.state.value == "done", (record.reason, record.error)
    assert real_store.text(job_id) == canonical(fake, "A short answer, please.")
    ledger = real_store.ledger(job_id)
    assert [(a["kind"], a["cut"]) for a in ledger] == [("fresh", "stall"), ("reattach", "finished")]
    seen = exchanges(fake, "A short answer, please.")
    assert len(seen["created"]) == 1 and len(seen["status"]) >= 2  # polled, then read
    assert len(seen["streamed"]) == 1


def status_transport(answer: dict[str, Any] | None, status: int = 200) -> httpx.MockTransport:
    """A provider whose ``GET /responses/{id}`` answers ``answer`` (and whose stream, if it
    is asked for, is empty)."""

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.params.get("stream") == "true":
            return httpx.Response(200, headers={"content-type": "text/event-stream"}, text="")
        if answer is None:
            return httpx.Response(status, json={"error": {"message": "No response found"}})
        return httpx.Response(200, json=answer)

    return httpx.MockTransport(handle)


@pytest.mark.parametrize(
    ("answer", "status", "refusal"),
    [
        (None, 404, "No response found"),
        (None, 400, "No response found"),
        ({"id": "resp_1", "status": "completed", "background": False, "model": "m"}, 200,
         "not a background response"),
        ({"id": "resp_1", "status": "completed", "background": True, "model": "other"}, 200,
         "made by 'other'"),
        ({"id": "resp_2", "status": "completed", "background": True, "model": "m"}, 200,
         "got 'resp_2'"),
        ({"id": "resp_1", "status": "cancelled", "background": True, "model": "m"}, 200,
         "is cancelled"),
        ({"id": "resp_1", "status": "failed", "background": True, "model": "m"}, 200,
         "is failed"),
    ],
)  # fmt: skip
def test_what_cannot_be_read_on_is_refused_by_name(
    answer: dict[str, Any] | None, status: int, refusal: str
) -> None:
    profile = ProviderProfile.model_validate(
        {"kind": "openai-responses", "base_url": "http://provider.test/v1", "background": True}
    )
    with httpx.Client(transport=status_transport(answer, status)) as http:
        client = make_client(profile, http)
        with pytest.raises(ReattachRefused, match=refusal):
            client.open(plan_reattach(SPEC, response_id="resp_1", after=7, remaining_tokens=100))


def test_a_queued_or_dated_model_response_is_not_refused() -> None:
    profile = ProviderProfile.model_validate(
        {"kind": "openai-responses", "base_url": "http://provider.test/v1", "background": True}
    )
    queued = {"id": "resp_1", "status": "queued", "background": True, "model": "m"}
    plan = plan_reattach(SPEC, response_id="resp_1", after=7, remaining_tokens=100)
    with httpx.Client(transport=status_transport(queued)) as http, pytest.raises(ResponseQueued):
        make_client(profile, http).open(plan)
    # OpenAI names the dated snapshot of the model that was asked for.
    dated = {"id": "resp_1", "status": "in_progress", "background": True, "model": "m-2025-01-01"}
    with httpx.Client(transport=status_transport(dated)) as http:
        stream = make_client(profile, http).open(plan)
        assert stream.response_id == "resp_1" and stream.sequence == 7
        stream.close()


def test_a_background_profile_needs_the_responses_wire() -> None:
    with pytest.raises(ValueError, match='background = true needs kind "openai-responses"'):
        ProviderProfile.model_validate(
            {"kind": "openai", "base_url": "http://provider.test/v1", "background": True}
        )


def test_a_read_on_stream_refuses_another_responses_events() -> None:
    """A server that answers a reattach with another response's events: a named cut before
    any of its text is kept."""
    events = [
        {"type": "response.output_text.delta", "sequence_number": 8, "delta": "ok",
         "item_id": "m", "output_index": 0, "content_index": 0},
        {"type": "response.completed", "sequence_number": 9,
         "response": {"id": "resp_other", "status": "completed"}},
    ]  # fmt: skip
    body = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events)
    response = httpx.Response(
        200, headers={"content-type": "text/event-stream"}, content=body.encode()
    )
    stream = ResponsesStream(response, stall_timeout_s=5, after=7, response_id="resp_1")
    with pytest.raises(MalformedChunk, match="an event of resp_other"):
        list(stream)


def test_a_byte_exact_job_survives_a_cut_by_reading_on(
    fake: FakeProvider, redis_server: RedisServer, real_store: Store
) -> None:
    """A byte-exact job cannot be continued (a continuation is a new draw), but the rest
    of the same response is the same draw: it is read on, and only if it cannot be does
    the job take its exit."""
    fake.add_faults([{"kind": "disconnect", "after_tokens": 150, "match": PROMPT}])
    with attempt_runner(redis_server.url, providers(fake)) as runner:
        job_id = create(real_store, byte_exact=True, exit={"on_cut": "resume"})
        record = run_to_rest(runner, job_id)
        assert record.state.value == "done" and real_store.text(job_id) == canonical(fake)
        assert [a["kind"] for a in real_store.ledger(job_id)] == ["fresh", "reattach"]

        fake.add_faults([{"kind": "disconnect", "after_tokens": 150, "match": PROMPT}])
        configure(fake, background_window_s=0)
        # Too old to read on: the exit it chose for a cut that cannot go on (to a person).
        job_id = create(real_store, byte_exact=True, exit={"droppable": False})
        record = run_to_rest(runner, job_id)
    assert record.state.value == "spilled", record
    ledger = real_store.ledger(job_id)
    assert [(a["kind"], a["outcome"]) for a in ledger] == [
        ("fresh", "resume"),
        ("reattach", "spill"),
    ]
    assert "can no longer be streamed" in ledger[1]["reattach_refused"]
    assert "byte_exact" in (record.reason or "")
