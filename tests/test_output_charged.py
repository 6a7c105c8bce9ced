"""Every output token is charged: reasoning cut before any text counts against the budget,
and an estimate errs high, so ``budget - spent`` never buys past the budget. Through the
worker, with a real redis-server and the fake provider over HTTP."""

from __future__ import annotations

import time
from typing import Any

import pytest
from worker_support import attempt_runner, run_to_rest

from resumeq.core.settings import ConfigFile, Settings
from resumeq.fake import FakeProvider, count_tokens
from resumeq.janitor.sweep import Janitor
from resumeq.store import Store
from resumeq.testing import RedisServer
from resumeq.worker.context import build_context

pytestmark = pytest.mark.timeout(60)


def journal_for(fake: FakeProvider, prompt: str) -> list[dict[str, Any]]:
    return [e for e in fake.journal(settle_s=1) if prompt in str(e["body"])]


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_reasoning_cut_before_any_text_is_charged(
    kind: str, fake: FakeProvider, redis_server: RedisServer, real_store: Store
) -> None:
    """The defect: a vLLM profile cut while the model was thinking kept its cursor at 0,
    and every attempt asked for the whole budget again."""
    fake.completion_tokens = 120
    prompt = f"Think first, then answer ({kind}) [fake:reasoning=300]"
    fake.add_faults([{"kind": "disconnect", "after_tokens": 200, "match": prompt, "times": 1}])
    base = fake.anthropic_base_url if kind == "anthropic" else fake.openai_base_url
    counting = "usage" if kind == "openai" else "usage+tokenizer"
    profile = {"kind": kind, "base_url": base, "counting": counting, "stall_timeout_s": 5}
    spec = {"prompt": prompt, "provider": "p", "model": "m", "budget_tokens": 1_000}
    job_id = real_store.create(spec).id
    with attempt_runner(redis_server.url, {"p": profile}) as runner:
        runner.run(job_id)
        after_cut = real_store.get(job_id)
        record = run_to_rest(runner, job_id)
    requests = journal_for(fake, prompt)
    assert requests[0]["output_tokens_billed"] == 200 and requests[0]["text"] == ""
    assert after_cut.spent_output_tokens >= 200  # the reasoning was billed: it is charged
    assert requests[1]["body"]["max_tokens"] <= 1_000 - 200
    first, second = real_store.ledger(job_id)
    assert first["kind"] == "fresh" and first["outcome"] == "retry"
    assert first["reasoning_tokens"] >= 200
    assert second["reasoning_tokens"] >= 300  # the retry thought again, then answered
    assert record.state.value == "done"
    assert real_store.text(job_id) == fake.canonical_text([{"role": "user", "content": prompt}])
    billed = sum(e["output_tokens_billed"] for e in requests)
    assert billed <= 1_000
    if kind == "openai":  # continuous usage: exact to the token
        assert after_cut.spent_output_tokens == 200 and after_cut.counts_exact
        assert record.spent_output_tokens == billed and record.counts_exact


def test_an_anthropic_cut_without_usage_never_buys_past_the_budget(
    fake: FakeProvider, redis_server: RedisServer, real_store: Store
) -> None:
    """The defect: one token per delta, though Claude's deltas carry several; a cut with ~50
    tokens generated counted 10 and the continuation asked for 50 more on a budget of 60."""
    fake.completion_tokens = 400
    budget = 120
    prompt = "A short answer, several tokens a delta"
    fake.add_faults([{"kind": "disconnect", "after_tokens": 60, "match": prompt}])
    profile = {"kind": "anthropic", "base_url": fake.anthropic_base_url, "counting": "usage"}
    spec = {"prompt": prompt, "provider": "p", "model": "m", "budget_tokens": budget}
    job_id = real_store.create(spec).id
    with attempt_runner(redis_server.url, {"p": profile}) as runner:
        runner.run(job_id)
        after_cut = real_store.get(job_id)
        run_to_rest(runner, job_id)
    requests = journal_for(fake, prompt)
    assert requests[0]["output_tokens_billed"] == 60
    assert after_cut.spent_output_tokens >= 60 and not after_cut.counts_exact
    assert sum(e["output_tokens_billed"] for e in requests) <= budget
    if len(requests) > 1:
        assert requests[1]["body"]["max_tokens"] <= budget - 60


def test_a_dead_workers_chunk_count_is_raised_to_an_estimate(
    fake: FakeProvider, redis_server: RedisServer, real_store: Store
) -> None:
    """A worker that died left a chunk count (a lower bound): the janitor raises it to an
    estimate of the text it stored before the continuation is priced."""
    text = "lorem ipsum dolor " * 10  # 180 bytes in 10 Anthropic deltas
    profile = {"kind": "anthropic", "base_url": fake.anthropic_base_url}
    spec = {"prompt": "p", "provider": "p", "model": "m", "budget_tokens": 500}
    job_id = real_store.create(spec).id
    got = real_store.acquire(job_id, worker="doomed", ttl_ms=400)
    real_store.flush(got.lease, expected_revision=got.record.revision, delta=text, tokens=10,
                     exact=False)  # fmt: skip
    settings = Settings(
        redis_url=redis_server.url,
        file=ConfigFile.model_validate(
            {"providers": {"p": profile}, "worker": {"lease_ttl_ms": 100}}
        ),
    )
    ctx = build_context(settings)
    try:
        time.sleep(0.5)  # the 400 ms lease (long enough for the flush) has lapsed
        assert Janitor(ctx).sweep().outcomes == {job_id: "queued"}
    finally:
        ctx.close()
    record = real_store.get(job_id)
    assert record.spent_output_tokens == 90 and not record.counts_exact  # 180 bytes / 2
    (entry,) = real_store.ledger(job_id)
    assert entry["output_tokens_persisted"] == 90 and entry["count_source"] == "estimate"
    assert count_tokens(real_store.text(job_id)) > 0
