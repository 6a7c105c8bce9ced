"""What a worker process shares between its attempts: one HTTP client per provider profile,
bounded, and the handoff every attempt watches (SPEC §16)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from worker_support import attempt_runner

from resumeq.core.settings import ProviderProfile
from resumeq.fake import FakeProvider, count_tokens
from resumeq.producer.enqueue import enqueue_job
from resumeq.store import Store
from resumeq.testing import RedisServer
from resumeq.testing.processes import wait_for
from resumeq.worker.attempt import AttemptRunner
from resumeq.worker.context import Handoff, HttpClients, redis_pool_size


def profile(**over: object) -> ProviderProfile:
    return ProviderProfile.model_validate(
        {"kind": "openai", "base_url": "http://127.0.0.1:9/v1", **over}
    )


def pool_limit(client: httpx.Client) -> int:
    return client._transport._pool._max_connections  # type: ignore[attr-defined]


def test_one_client_per_profile_sized_from_the_concurrency_or_the_profile() -> None:
    clients = HttpClients(concurrency=40)
    try:
        a = clients.get("a", profile())
        assert clients.get("a", profile()) is a  # one per profile, shared by every attempt
        capped = clients.get("capped", profile(max_connections=5))
        assert capped is not a
        assert pool_limit(a) == 40 and pool_limit(capped) == 5
    finally:
        clients.close()
    assert a.is_closed and capped.is_closed


def test_clients_made_from_many_threads_at_once_are_one() -> None:
    clients = HttpClients(concurrency=8)
    got: list[httpx.Client] = []
    start = threading.Barrier(16)

    def take() -> None:
        start.wait()
        got.append(clients.get("p", profile()))

    threads = [threading.Thread(target=take) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    clients.close()
    assert len(got) == 16 and len({id(c) for c in got}) == 1


def test_handoff_begins_then_interrupts_only_the_attempts_still_watching() -> None:
    handoff = Handoff()
    stopped: list[str] = []
    first = handoff.watch(lambda: stopped.append("first"))
    handoff.watch(lambda: stopped.append("second"))
    assert not handoff.is_set()
    assert handoff.begin() == 2
    assert handoff.is_set() and stopped == []  # each stream stops after the event it reads
    handoff.unwatch(first)  # the first stopped by itself meanwhile
    assert handoff.interrupt() == 1
    assert stopped == ["second"]


def test_the_redis_pool_is_bounded_whatever_the_concurrency() -> None:
    assert redis_pool_size(1) == 9
    assert redis_pool_size(50) == 58
    assert redis_pool_size(500) == 508
    assert redis_pool_size(1000) == redis_pool_size(512) == 520


@contextlib.contextmanager
def streaming_attempt(
    redis_url: str, store: Store, fake: FakeProvider, prompt: str, sent: int, **worker: Any
) -> Iterator[tuple[AttemptRunner, threading.Thread, str]]:
    """A job's attempt running on a thread of its own, once the fake has sent ``sent``
    tokens of its answer; the runner is closed afterwards."""
    spec = {"prompt": prompt, "provider": "fake", "model": "m", "budget_tokens": 1000}
    job_id = enqueue_job(store, store.redis, spec, queue="resumeq").id
    providers = {"fake": {"kind": "openai", "base_url": fake.openai_base_url}}
    with attempt_runner(redis_url, providers, **worker) as runner:
        attempt = threading.Thread(target=runner.run, args=(job_id,))
        attempt.start()
        wait_for(
            lambda: fake.journal() and fake.journal()[-1]["tokens_emitted"] >= sent,
            timeout_s=20,
            what=f"{sent} tokens sent",
        )
        yield runner, attempt, job_id


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "pacing",
    [(0, False), (300, False), (1000, True)],
    ids=["unpaced", "paced", "paced-interrupted"],
)
def test_a_handoff_keeps_every_token_received_and_hands_the_job_on_at_once(
    redis_server: RedisServer,
    real_store: Store,
    fake: FakeProvider,
    pacing: tuple[int, bool],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    read_pause_ms, interrupt = pacing
    # 50 ms a token, a checkpoint only every 32: at the handoff up to 31 tokens were
    # received and not yet durable. Each is kept; what the provider sent and nobody kept
    # is at most the token it wrote as the connection closed. Paced by 300 ms (whole from
    # one stream on), the tokens come some six per read: those of the read the handoff
    # interrupts, and those already waiting on the socket, are kept too (drained).
    monkeypatch.setattr("resumeq.worker.context.FULL_AT", 1)
    fake.completion_tokens = 400
    fake.token_delay_ms = 50
    prompt = "A long answer handed off mid-stream."
    worker = {"flush_tokens": 32, "flush_ms": 60_000, "read_pause_ms": read_pause_ms}
    with streaming_attempt(redis_server.url, real_store, fake, prompt, 45, **worker) as (
        runner,
        attempt,
        job_id,
    ):
        runner.ctx.handoff.begin()
        if interrupt:
            # The worker's deadline for quiet streams (INTERRUPT_AFTER_S), come while this
            # one sleeps in its pause with tokens waiting on its socket: they were paid
            # for, so they are read, not thrown away with the connection.
            runner.ctx.handoff.interrupt()
        attempt.join(timeout=10)
        assert not attempt.is_alive()
    record = real_store.get(job_id)
    assert record.state.value == "queued" and record.attempt == 1
    (entry,) = real_store.ledger(job_id)
    assert (entry["outcome"], entry["cut"]) == ("handoff", "handoff")
    sent = fake.journal(settle_s=0.2)[-1]
    durable = real_store.text(job_id)
    assert sent["text"].startswith(durable)
    # Kept: every token past the last checkpoint (32) that reached the worker; lost: at
    # most the token the provider wrote as the connection closed. (The record's spent
    # count is an estimate here: a cut stream reports no usage.)
    kept = count_tokens(durable)
    assert kept >= 45
    assert sent["tokens_emitted"] - kept <= 1, (sent["tokens_emitted"], kept)
    assert record.spent_output_tokens >= kept


@pytest.mark.timeout(60)
@pytest.mark.parametrize("read_pause_ms", [0, 300])
def test_a_handoff_interrupt_wakes_a_stream_whose_provider_sends_nothing(
    redis_server: RedisServer,
    real_store: Store,
    fake: FakeProvider,
    read_pause_ms: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Nothing waits on its socket, so the handoff's deadline closes the connection: the
    reader, blocked on a provider that went quiet for 30 s, is woken at once."""
    monkeypatch.setattr("resumeq.worker.context.FULL_AT", 1)
    prompt = "A provider that goes quiet."
    fake.add_faults([{"kind": "stall", "after_tokens": 10, "seconds": 30, "match": prompt}])
    worker = {"flush_tokens": 4, "flush_ms": 60_000, "read_pause_ms": read_pause_ms}
    with streaming_attempt(redis_server.url, real_store, fake, prompt, 10, **worker) as (
        runner,
        attempt,
        job_id,
    ):
        time.sleep(0.5)  # the provider is quiet now; the reader waits on it
        runner.ctx.handoff.begin()
        began = time.monotonic()
        runner.ctx.handoff.interrupt()
        attempt.join(timeout=10)
        assert not attempt.is_alive()
        assert time.monotonic() - began < 2.0  # not the 30 s stall
    (entry,) = real_store.ledger(job_id)
    assert (entry["outcome"], entry["cut"]) == ("handoff", "handoff")
    assert count_tokens(real_store.text(job_id)) == 10  # every token that came, kept
