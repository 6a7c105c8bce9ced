"""The stall rule (SPEC §8) against a provider that keeps an idle stream open with
keep-alive comments: bytes, but no content. The cut comes within ``stall_timeout_s`` plus a
second, not up to twice it (each keep-alive restarts the socket's read timeout, never the
reader's patience)."""

from __future__ import annotations

import time

import pytest
from worker_support import attempt_runner

from resumeq.fake import FakeProvider
from resumeq.store import Store
from resumeq.testing import RedisServer

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("keepalive_s", [None, 0.5, 1.9])
def test_a_stall_is_cut_within_its_timeout_and_a_second(
    fake: FakeProvider, redis_server: RedisServer, real_store: Store, keepalive_s: float | None
) -> None:
    prompt = f"Keep-alives every {keepalive_s} s"
    fake.add_faults(
        [{"kind": "stall", "after_tokens": 20, "seconds": 8, "keepalive_s": keepalive_s,
          "match": prompt}]
    )  # fmt: skip
    providers = {"p": {"kind": "openai", "base_url": fake.openai_base_url, "stall_timeout_s": 2.0}}
    with attempt_runner(redis_server.url, providers) as runner:
        job_id = real_store.create(
            {"prompt": prompt, "provider": "p", "model": "m", "budget_tokens": 500}
        ).id
        started = time.monotonic()
        runner.run(job_id)
        took = time.monotonic() - started
    (attempt,) = real_store.ledger(job_id)
    assert attempt["cut"] == "stall", attempt
    assert "no content for 2 s" in attempt["detail"] or "no bytes" in attempt["detail"]
    # Twenty tokens come at once; then at most the timeout and a second (a keep-alive
    # every 1.9 s used to stretch it to 3.8 s).
    assert took < 2.0 + 1.0, took
