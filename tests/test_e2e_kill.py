"""End to end: worker processes killed and frozen mid-stream (SPEC §8, §9)."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from e2e_support import World, make_world, tokens
from rq.job import Job, JobStatus
from rq.registry import FailedJobRegistry, StartedJobRegistry
from rq.serializers import JSONSerializer

from resumeq.fake import FakeProvider
from resumeq.queue.queueing import attempt_rq_id
from resumeq.store import Store
from resumeq.testing import RedisServer
from resumeq.testing.processes import wait_for

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def world(
    tmp_path: Path, real_store: Store, fake: FakeProvider, redis_server: RedisServer
) -> Iterator[World]:
    yield from make_world(tmp_path, real_store, fake, redis_server.url)


def test_sigkill_mid_stream_resumes_on_another_worker(world: World) -> None:
    # Slow enough that the worker reads every token as it comes, even on a busy machine:
    # what the provider bills beyond the text is then what the last flush interval held.
    world.fake.completion_tokens = 160
    world.fake.token_delay_ms = 20
    a = world.cluster.worker()
    prompt = "Explain tides to a child."
    job_id = world.enqueue(prompt)
    world.wait_spent(job_id, 60)
    a.kill()
    killed_at = world.store.get(job_id).spent_output_tokens

    world.cluster.worker()
    world.cluster.janitor()
    record = world.wait_state(job_id, {"done", "failed", "spilled", "abandoned"})

    text = world.store.text(job_id)
    assert record.state.value == "done", record
    assert text == world.canonical(prompt)
    ledger = world.store.ledger(job_id)
    assert [a["kind"] for a in ledger] == ["fresh", "resume"]
    assert ledger[0]["cut"] == "worker_died" and ledger[0]["outcome"] == "resume"
    assert ledger[0]["output_tokens_persisted"] == killed_at
    # Billed by the provider (its own journal) against what the text needs.
    billed = sum(r["output_tokens_billed"] for r in world.requests_for(prompt))
    assert tokens(text) <= billed <= tokens(text) + 8  # at most one flush interval lost
    resumed = world.requests_for(prompt)[-1]
    assert resumed["is_continuation"] and resumed["body"]["max_tokens"] == 2000 - killed_at
    # RQ's own view agrees: the dead attempt was handed on — canceled, not failed (the job
    # needs nobody) — and nothing is left "started".
    connection = world.store.redis
    dead = Job.fetch(attempt_rq_id(job_id, 1), connection=connection, serializer=JSONSerializer)
    assert dead.get_status() == JobStatus.CANCELED
    assert FailedJobRegistry("resumeq", connection=connection).get_job_ids() == []
    # RQ records its job finished after the function returned, a moment after the job's
    # own end was committed (seen beside two CPU burners: still "started" at this line).
    finished = Job.fetch(attempt_rq_id(job_id, 2), connection=connection, serializer=JSONSerializer)
    wait_for(lambda: finished.get_status(refresh=True) == JobStatus.FINISHED, timeout_s=10,
             what="RQ to record the second attempt finished")  # fmt: skip
    assert StartedJobRegistry("resumeq", connection=connection).get_job_ids() == []


def test_a_pause_is_checkpointed_and_a_kill_in_it_buys_nothing_twice(
    tmp_path: Path, real_store: Store, fake: FakeProvider, redis_server: RedisServer
) -> None:
    """A burst, then the provider pauses (no byte for far longer than ``flush_ms``): what
    came is durable within about ``flush_ms`` — the worker's idle flusher writes it — not at
    the next token or at the stall's cut. A worker killed in the pause left nothing
    unflushed, so the continuation asks for exactly the rest and nothing is bought twice."""
    prompt = "Tabulate the printing press's spread across Europe, 1450-1500."
    with contextmanager(make_world)(
        tmp_path, real_store, fake, redis_server.url, flush_tokens=32
    ) as world:
        world.fake.completion_tokens = 300
        # 45 tokens at once (32 by count, 13 that no delta follows), then 20 s of nothing;
        # the stall timeout (3 s) would cut it.
        world.fake.add_faults(
            [{"kind": "stall", "after_tokens": 45, "seconds": 20, "match": prompt}]
        )
        a = world.cluster.worker()
        job_id = world.enqueue(prompt)

        def sent() -> int:
            return max((r["tokens_emitted"] for r in world.requests_for(prompt)), default=0)

        wait_for(lambda: sent() >= 45, timeout_s=30, what="the burst sent")
        world.wait_spent(job_id, 45, timeout_s=10)
        record = world.store.get(job_id)
        # Still in the pause: the first attempt has not ended (no stall cut, no ledger).
        assert record.state.value == "running" and world.store.ledger(job_id) == [], record
        assert record.spent_output_tokens == sent() == 45
        a.kill()

        world.cluster.worker()
        world.cluster.janitor()
        record = world.wait_state(job_id, {"done", "failed", "spilled", "abandoned"})
        text = world.store.text(job_id)
        assert record.state.value == "done", record
        assert text == world.canonical(prompt)
        ledger = world.store.ledger(job_id)
        assert [e["kind"] for e in ledger] == ["fresh", "resume"], ledger
        assert ledger[0]["cut"] == "worker_died" and ledger[0]["output_tokens_persisted"] == 45
        requests = world.requests_for(prompt)
        assert requests[-1]["is_continuation"] and requests[-1]["body"]["max_tokens"] == 2000 - 45
        billed = sum(r["output_tokens_billed"] for r in requests)
        assert billed == tokens(text), requests


def test_sigkill_on_an_engine_that_echoes_the_prefill(world: World) -> None:
    """llama.cpp: the continuation starts by repeating the 2,000+ characters it was sent;
    the dead attempt was counted chunk by chunk, so the janitor prices the continuation
    with an estimate that errs high."""
    world.fake.configure_engine("llamacpp")
    world.fake.completion_tokens = 1_200
    world.fake.token_delay_ms = 4
    a = world.cluster.worker()
    prompt = "Write the whole module, with tests [fake:mixed]"
    job_id = world.enqueue(prompt, provider="llamacpp", budget_tokens=3000)
    world.wait_spent(job_id, 800)
    a.kill()
    killed = world.store.get(job_id)
    stored = world.store.text(job_id)
    assert len(stored) > 2000
    world.cluster.worker()
    world.cluster.janitor()
    record = world.wait_state(job_id, {"done", "failed", "spilled", "abandoned"})
    text = world.store.text(job_id)
    assert record.state.value == "done", record
    assert text == world.canonical(prompt)
    ledger = world.store.ledger(job_id)
    assert ledger[0]["cut"] == "worker_died" and ledger[0]["count_source"] == "estimate"
    assert ledger[0]["output_tokens_persisted"] >= killed.spent_output_tokens
    assert ledger[1]["echo_chars"] == len(stored)  # exactly the repeat was dropped
    resumed = world.requests_for(prompt)[-1]
    assert resumed["echo_chars"] > 2000  # the engine did repeat the prefix
    assert resumed["body"]["max_tokens"] == 3000 - ledger[0]["output_tokens_persisted"]
    assert not record.counts_exact  # the dead attempt's count is an estimate, and says so


def test_sigstop_past_the_lease_then_sigcont_is_fenced(world: World) -> None:
    world.fake.completion_tokens = 300
    world.fake.token_delay_ms = 8
    a = world.cluster.worker()
    prompt = "Describe a frozen lake."
    job_id = world.enqueue(prompt)
    world.wait_spent(job_id, 40)
    a.signal_group(signal.SIGSTOP)
    world.cluster.worker()
    world.cluster.janitor()
    record = world.wait_state(job_id, {"done", "failed", "spilled", "abandoned"})
    assert record.state.value == "done"
    before = (world.store.text(job_id), record.revision)

    a.signal_group(signal.SIGCONT)
    deadline = time.monotonic() + 10
    while "no longer holds the lease" not in a.output() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "no longer holds the lease" in a.output(), a.output()[-2000:]
    after = world.store.get(job_id)
    assert (world.store.text(job_id), after.revision) == before
    assert before[0] == world.canonical(prompt)
