"""End to end, with worker processes: a background response outlives the worker that was
reading it, and the next attempt reads the rest of it (``reattach``) — one create, billed
once. After the provider's window it continues instead; a cancel stops the provider."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2e_support import World, background_exchanges, make_world

from resumeq.core.ledger import AttemptRecord
from resumeq.fake import FakeProvider
from resumeq.store import Store
from resumeq.testing import RedisServer
from resumeq.testing.processes import wait_for

pytestmark = pytest.mark.timeout(90)

PROMPT = "Write a long answer: code, a table, and the same chorus twice [fake:mixed]"


@pytest.fixture
def world(
    tmp_path: Path, real_store: Store, fake: FakeProvider, redis_server: RedisServer
) -> Iterator[World]:
    yield from make_world(tmp_path, real_store, fake, redis_server.url)


def enqueue(world: World, prompt: str = PROMPT) -> str:
    return world.enqueue(prompt, provider="fake-responses", model="m", budget_tokens=4000)


def journal_of(world: World, prompt: str = PROMPT) -> dict[str, list[dict[str, Any]]]:
    return background_exchanges(world.fake, prompt)


def canonical(world: World, prompt: str = PROMPT) -> str:
    return world.fake.canonical_text([{"role": "user", "content": prompt}])


def test_sigkill_mid_stream_reads_the_rest_of_the_same_response(world: World) -> None:
    world.fake.completion_tokens = 250
    world.fake.token_delay_ms = 10
    a = world.cluster.worker()
    job_id = enqueue(world)
    world.wait_spent(job_id, 80)
    a.kill()

    world.cluster.worker()
    world.cluster.janitor()
    record = world.wait_state(job_id, {"done", "failed", "spilled", "abandoned"})
    assert record.state.value == "done", record
    assert world.store.text(job_id) == canonical(world)
    ledger = world.store.ledger(job_id)
    assert [a["kind"] for a in ledger] == ["fresh", "reattach"], ledger
    assert ledger[0]["cut"] == "worker_died" and not ledger[1].get("reattach_refused")
    # The provider's journal: one create, one status read, one stream read after the
    # stored event number; input billed once, output billed once.
    seen = journal_of(world)
    assert [len(seen[k]) for k in ("created", "status", "streamed")] == [1, 1, 1], seen
    # Read on from the event where the dead attempt's last checkpoint ended.
    after = int(seen["streamed"][0]["path"].partition("starting_after=")[2].partition("&")[0])
    assert after > ledger[0]["output_tokens_persisted"] >= 80
    created = seen["created"][0]
    assert created["output_tokens_billed"] == 250 and created["outcome"] == "finished"
    assert all(e["input_tokens_billed"] == e["output_tokens_billed"] == 0 for e in seen["streamed"])
    assert sum(a["input_tokens"] or 0 for a in ledger) == created["input_tokens_billed"]
    # The cursor is the response's billed total: the dead attempt's count was left as
    # counted (no guess on top), and the reattach took the rest from the provider's usage.
    assert record.spent_output_tokens == 250
    assert sum(a["output_tokens"] or a["output_tokens_persisted"] for a in ledger) == 250


def test_a_dead_attempts_response_is_counted_when_the_janitor_spills_its_job(
    world: World,
) -> None:
    """The worker dies; its job's exit is a spill, so nobody will read the background
    response on: the janitor cancels it, counts what it made (it went on generating after
    the kill) into the cursor and the totals, and the cursor is what the provider billed."""
    world.fake.completion_tokens = 250
    world.fake.token_delay_ms = 10
    a = world.cluster.worker()
    job_id = world.enqueue(
        PROMPT, provider="fake-responses", model="m", budget_tokens=4000,
        exit={"on_cut": "spill"},
    )  # fmt: skip
    world.wait_spent(job_id, 80)
    a.kill()
    world.cluster.janitor()
    record = world.wait_state(job_id, {"done", "failed", "spilled", "abandoned"})
    assert record.state.value == "spilled", record
    seen = journal_of(world)
    billed = seen["created"][0]["output_tokens_billed"]
    assert billed > 80  # it went on after the kill, until the janitor cancelled it
    ledger = world.store.ledger(job_id)
    assert ledger[0]["cut"] == "worker_died" and ledger[0]["carried_output_tokens"] > 0
    # The provider's figure where its cancelled response gives one, else an estimate from
    # its output that errs high.
    assert billed <= record.spent_output_tokens <= 2 * billed
    persisted = world.store.totals("fake-responses")["output_tokens_persisted"]
    assert persisted == record.spent_output_tokens


def test_past_the_window_the_job_continues_and_ends_canonical(world: World) -> None:
    world.fake.completion_tokens = 250
    world.fake.token_delay_ms = 10
    a = world.cluster.worker()
    job_id = enqueue(world)
    world.wait_spent(job_id, 80)
    a.kill()
    # The provider no longer streams it (as OpenAI refuses after 5 minutes).
    httpx.post(f"{world.fake.url}/_fake/config", json={"background_window_s": 0}, timeout=10)

    world.cluster.worker()
    world.cluster.janitor()
    record = world.wait_state(job_id, {"done", "failed", "spilled", "abandoned"})
    assert record.state.value == "done", record
    assert world.store.text(job_id) == canonical(world)
    ledger = world.store.ledger(job_id)
    assert [a["kind"] for a in ledger] == ["fresh", "resume"], ledger
    assert "can no longer be streamed" in ledger[1]["reattach_refused"]
    seen = journal_of(world)
    assert len(seen["created"]) == 2 and len(seen["streamed"]) == 1
    assert seen["streamed"][0]["outcome"] == "too_old"


def test_cancel_stops_the_generation_at_the_provider(world: World) -> None:
    world.fake.completion_tokens = 4_000
    world.fake.token_delay_ms = 10
    a = world.cluster.worker()
    job_id = enqueue(world)
    world.wait_spent(job_id, 40)
    # The worker dies; the response goes on generating for nobody until the cancel.
    a.kill()
    cancel = world.cluster.command("cancel", job_id)
    assert cancel.wait(timeout=30) == 0, cancel.output()
    assert "stopped its background response resp_" in cancel.output()
    assert world.store.get(job_id).state.value == "cancelled"
    seen = journal_of(world)
    assert len(seen["cancelled"]) == 1 and seen["cancelled"][0]["outcome"] == "cancelled"
    billed = wait_for(
        lambda: (
            journal_of(world)["created"][0]["outcome"] == "cancelled"
            and journal_of(world)["created"][0]["output_tokens_billed"]
        ),
        timeout_s=10,
        what="the response to stop",
    )
    time.sleep(0.3)
    # Stopped: no token after the cancel, and the rest was never made (nor billed).
    assert journal_of(world)["created"][0]["output_tokens_billed"] == billed < 4_000


def test_a_producers_cancel_is_carried_to_the_provider_by_the_janitor(world: World) -> None:
    """A producer's process knows no provider keys: the job's cancel names the response
    for the janitor, which stops it — here while no worker holds the job."""
    world.fake.completion_tokens = 4_000
    world.fake.token_delay_ms = 10
    a = world.cluster.worker()
    job_id = enqueue(world)
    world.wait_spent(job_id, 40)
    a.kill()
    world.store.cancel(job_id, reason="the user closed the tab")
    assert not journal_of(world)["cancelled"]
    world.cluster.janitor()
    wait_for(
        lambda: journal_of(world)["created"][0]["outcome"] == "cancelled",
        timeout_s=15,
        what="the janitor to cancel the response",
    )
    wait_for(lambda: not world.store.responses_to_stop(), timeout_s=5, what="the set to empty")
    assert len(journal_of(world)["cancelled"]) == 1  # once


def test_a_worker_that_sees_its_job_cancelled_stops_the_provider(world: World) -> None:
    world.fake.completion_tokens = 2_000
    world.fake.token_delay_ms = 10
    world.cluster.worker()
    job_id = enqueue(world)
    world.wait_spent(job_id, 40)
    world.store.cancel(job_id, reason="test")  # as a producer's Client does
    seen = wait_for(
        lambda: (s := journal_of(world))["cancelled"] and s,
        timeout_s=15,
        what="the worker to cancel the response",
    )
    assert seen["cancelled"][0]["outcome"] == "cancelled"
    wait_for(
        lambda: journal_of(world)["created"][0]["outcome"] == "cancelled",
        timeout_s=10,
        what="the response to stop",
    )
    billed = journal_of(world)["created"][0]["output_tokens_billed"]
    assert billed < 1_000
    # What the response made until it stopped is in the ledger and the totals, though the
    # cancelled job's cursor takes no more writes.
    ledger = wait_for(lambda: world.store.ledger(job_id), timeout_s=10, what="the record")
    assert ledger[0]["outcome"] == "cancelled"
    assert AttemptRecord.model_validate(ledger[0]).billed_output >= billed
    assert world.store.totals("fake-responses")["output_tokens_billed"] >= billed


def test_a_handoff_on_shutdown_is_read_on_by_the_next_worker(world: World) -> None:
    world.fake.completion_tokens = 250
    world.fake.token_delay_ms = 10
    a = world.cluster.worker()
    job_id = enqueue(world)
    world.wait_spent(job_id, 60)
    a.stop()  # SIGTERM: the worker hands its job back at once
    world.cluster.worker()
    record = world.wait_state(job_id, {"done", "failed", "spilled", "abandoned"})
    assert record.state.value == "done", record
    assert world.store.text(job_id) == canonical(world)
    ledger = world.store.ledger(job_id)
    assert [(a["kind"], a["outcome"]) for a in ledger] == [
        ("fresh", "handoff"),
        ("reattach", "done"),
    ], ledger
    seen = journal_of(world)
    assert len(seen["created"]) == 1 and seen["created"][0]["output_tokens_billed"] == 250
    assert record.spent_output_tokens == 250
