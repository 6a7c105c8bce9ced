"""Spend accounting: every attempt that reached the provider is in the ledger (a cancelled
one too), totals are kept by the scripts that write the ledger (``stats`` is O(1)), and
what is not final says so. A real redis-server, the fake provider over HTTP, attempts on
the worker's code path."""

from __future__ import annotations

import threading
from typing import Any, get_args

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from worker_support import attempt_runner, run_to_rest

from resumeq.core.ledger import AttemptRecord, CountSource, summary
from resumeq.core.settings import Prices
from resumeq.fake import FakeProvider
from resumeq.producer import ops
from resumeq.store import Store
from resumeq.testing import RedisServer
from resumeq.testing.processes import wait_for

pytestmark = pytest.mark.timeout(60)


def profile(fake: FakeProvider) -> dict[str, Any]:
    return {
        "kind": "openai",
        "base_url": fake.openai_base_url,
        "counting": "usage",
        "stall_timeout_s": 5,
    }


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
    real_store.finish(
        got.lease,
        state="done",
        finish_reason="stop",
        ledger=AttemptRecord(
            attempt=1,
            kind="fresh",
            worker="w1",
            outcome="done",
            output_tokens=3,
            output_tokens_persisted=3,
            counts_exact=True,
            count_source="usage",
        ).to_json_dict(),
    )
    summary = ops.status_dict(real_store, job_id)["summary"]
    assert not summary["attempt_in_flight"] and summary["counts_complete"]
    assert ops.stats(real_store)["counts_complete"]


counts = st.none() | st.integers(0, 10_000)
records = st.builds(
    AttemptRecord,
    attempt=st.integers(1, 9),
    kind=st.sampled_from(["fresh", "retry", "resume", "reattach"]),
    worker=st.just("w"),
    outcome=st.sampled_from(["finished", "cut", "cancelled"]),
    input_tokens=counts,
    cached_input_tokens=counts,
    output_tokens=counts,
    output_tokens_persisted=st.integers(0, 10_000),
    carried_output_tokens=st.integers(0, 500),
    unread_output_tokens=st.integers(0, 500),
    prefix_tokens=st.integers(0, 5_000),
    count_source=st.sampled_from(get_args(CountSource)),
    billed_lower_bound=st.booleans(),
)


def by_the_model(
    ledger: list[dict[str, Any]], original: int | None, prices: Prices | None
) -> dict[str, Any]:
    """The ledger's totals read through the records' model (as summary read them before
    it read stored records as they are)."""
    rs = [AttemptRecord.model_validate(a) for a in ledger]
    billed_in = sum(r.input_tokens or 0 for r in rs)
    cached_in = sum(r.cached_input_tokens or 0 for r in rs)
    resume_in = sum(r.input_tokens or 0 for r in rs if r.kind == "resume")
    base = original or next((r.input_tokens for r in rs if r.input_tokens), None)
    out: dict[str, Any] = {
        "attempts": len(rs),
        "resumes": sum(r.kind == "resume" for r in rs),
        "retries": sum(r.kind == "retry" for r in rs),
        "reattaches": sum(r.kind == "reattach" for r in rs),
        "output_tokens_billed": sum(r.billed_output for r in rs),
        "output_tokens_persisted": sum(r.output_tokens_persisted for r in rs),
        "regenerated_tokens": sum(r.regenerated_tokens for r in rs),
        "input_tokens_billed": billed_in,
        "cached_input_tokens": cached_in,
        "output_counts_complete": all(r.output_tokens is not None for r in rs),
        "counts_complete": not any(r.billed_lower_bound for r in rs),
        "input_replay_ratio": None,
    }
    if base and resume_in:
        ceiling = sum(base + r.prefix_tokens for r in rs if r.kind == "resume")
        out["input_replay_ratio"] = round(resume_in / ceiling, 4)
    if prices is not None:
        cached = prices.cached_input if prices.cached_input is not None else prices.input
        out["cost"] = round(
            ((billed_in - cached_in) * prices.input + cached_in * cached) / 1e6
            + out["output_tokens_billed"] * prices.output / 1e6,
            6,
        )
    return out


@settings(max_examples=200, deadline=None)
@given(
    ledger=st.lists(records, max_size=5),
    older=st.lists(
        st.sampled_from(
            [
                "carried_output_tokens",
                "unread_output_tokens",
                "billed_lower_bound",
                "prefix_tokens",
                "cached_input_tokens",
            ]
        ),
        max_size=3,
    ),
    original=st.none() | st.integers(1, 1000),
    priced=st.booleans(),
)
def test_the_summary_of_stored_records_is_the_models(
    ledger: list[AttemptRecord], older: list[str], original: int | None, priced: bool
) -> None:
    """Stored records summed as they are, fields a record of an earlier version lacks
    counted as the model's defaults."""
    stored = [{k: v for k, v in r.to_json_dict().items() if k not in older} for r in ledger]
    prices = Prices(input=3.0, cached_input=0.3, output=15.0) if priced else None
    assert summary(stored, original_input_tokens=original, prices=prices) == by_the_model(
        stored, original, prices
    )
