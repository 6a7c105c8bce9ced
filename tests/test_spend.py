"""Spend accounting: every attempt that reached the provider is in the ledger (a cancelled
one too), totals are kept by the scripts that write the ledger (``stats`` is O(1)), and
what is not final says so. A real redis-server, the fake provider over HTTP, attempts on
the worker's code path."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from worker_support import attempt_runner, run_to_rest

from resumeq import ops
from resumeq.fake import FakeProvider
from resumeq.ledger import AttemptRecord, summary
from resumeq.store import Store
from resumeq.testing import RedisServer
from resumeq.testing.processes import wait_for

pytestmark = pytest.mark.timeout(60)


def profile(fake: FakeProvider) -> dict[str, Any]:
    return {"kind": "openai", "base_url": fake.openai_base_url, "counting": "usage",
            "stall_timeout_s": 5}  # fmt: skip


def test_a_cancelled_attempt_records_what_it_was_billed(
    fake: FakeProvider, redis_server: RedisServer, real_store: Store
) -> None:
    """Before: a job cancelled mid-stream showed no attempts and 0 tokens billed while the
    provider's journal billed 97."""
    fake.completion_tokens = 400
    fake.token_delay_ms = 5
    spec = {
        "prompt": "A long answer to cancel",
        "provider": "p",
        "model": "m",
        "budget_tokens": 800,
    }
    job_id = real_store.create(spec).id

    def cancel_soon() -> None:
        wait_for(lambda: real_store.get(job_id).spent_output_tokens >= 40, timeout_s=20)
        real_store.cancel(job_id, reason="the user left")

    canceller = threading.Thread(target=cancel_soon)
    canceller.start()
    with attempt_runner(redis_server.url, {"p": profile(fake)}) as runner:
        assert runner.run(job_id) == "cancelled"
    canceller.join()
    billed = sum(e["output_tokens_billed"] for e in fake.journal(settle_s=2))
    (attempt,) = real_store.ledger(job_id)
    assert attempt["outcome"] == "cancelled" and attempt["billed_lower_bound"]
    assert attempt["output_tokens_persisted"] >= 40
    assert 40 <= summary([attempt])["output_tokens_billed"] <= billed
    info = ops.stats(real_store)
    assert info["states"]["cancelled"] == 1 and info["attempts"] == 1
    assert info["output_tokens_billed"] == summary([attempt])["output_tokens_billed"]
    assert not info["counts_complete"]  # a bill known only as a lower bound


def test_stats_are_the_totals_the_ledgers_add_up_to(
    fake: FakeProvider,
    redis_server: RedisServer,
    real_store: Store,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake.completion_tokens = 120
    ids = []
    with attempt_runner(redis_server.url, {"p": profile(fake)}) as runner:
        for n in range(5):
            prompt = f"Job {n} of a small batch"
            if n % 2:
                fake.add_faults([{"kind": "disconnect", "after_tokens": 30, "match": prompt}])
            spec = {"prompt": prompt, "provider": "p", "model": "m", "budget_tokens": 500}
            ids.append(real_store.create(spec).id)
            run_to_rest(runner, ids[-1])
    ledgers = [real_store.ledger(i) for i in ids]
    sums = [summary(ledger) for ledger in ledgers]
    # O(1): no scan of the keyspace, no job read.
    monkeypatch.setattr(real_store.redis, "scan_iter", lambda *a, **k: pytest.fail("scanned"))
    monkeypatch.setattr(real_store, "get", lambda *a, **k: pytest.fail("read a job"))
    info = ops.stats(real_store)
    assert info["jobs"] == 5 and info["states"]["done"] == 5 and info["counts_complete"]
    assert info["attempts"] == sum(s["attempts"] for s in sums) == 7
    assert info["output_tokens_billed"] == sum(s["output_tokens_billed"] for s in sums)
    assert info["output_tokens_persisted"] == sum(s["output_tokens_persisted"] for s in sums)
    assert info["input_tokens_billed"] == sum(s["input_tokens_billed"] for s in sums)
    assert info["naive_output_tokens_billed"] == sum(
        ops.naive_output_tokens(ledger) for ledger in ledgers
    )
    assert info["output_tokens_billed"] <= info["naive_output_tokens_billed"]
    assert ops.stats(real_store, "p")["attempts"] == 7  # per provider profile too


def test_an_attempt_in_flight_makes_the_counts_incomplete(real_store: Store) -> None:
    job_id = real_store.create(
        {"prompt": "p", "provider": "p", "model": "m", "budget_tokens": 99}
    ).id
    got = real_store.acquire(job_id, worker="w1", ttl_ms=60_000)
    real_store.flush(got.lease, expected_revision=got.record.revision, delta="abc", tokens=3)
    info = ops.stats(real_store)
    assert info["states"]["running"] == 1 and info["attempts_in_flight"] == 1
    assert not info["counts_complete"]
    # In flight, an attempt is in neither total: persisted never runs ahead of billed.
    assert info["output_tokens_persisted"] == info["output_tokens_billed"] == 0
    summary = ops.status_dict(real_store, job_id)["summary"]
    assert summary["attempt_in_flight"] and not summary["counts_complete"]
    real_store.finish(got.lease, state="done", finish_reason="stop", ledger=AttemptRecord(
        attempt=1, kind="fresh", worker="w1", outcome="done", output_tokens=3,
        output_tokens_persisted=3, counts_exact=True, count_source="usage",
    ).to_json_dict())  # fmt: skip
    summary = ops.status_dict(real_store, job_id)["summary"]
    assert not summary["attempt_in_flight"] and summary["counts_complete"]
    assert ops.stats(real_store)["counts_complete"]
