"""The review demonstrations whose scripts no longer run against the packages (their imports
name modules that moved in issue 32), copied here and adapted: d1 and d11 of the first
review (the splice), r02 and r04 of the second (counting background responses let go).
Each asserts what the script's ``RESULT fixed`` meant."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from resumeq.core.settings import ConfigFile, Settings
from resumeq.core.splice import splice
from resumeq.fake import FakeProvider
from resumeq.store import Store
from resumeq.testing import RedisServer
from resumeq.worker.attempt import AttemptRunner
from resumeq.worker.context import build_context

pytestmark = pytest.mark.timeout(120)

PROMPT = "Write the module with its tests, and a table of results [fake:mixed]"
ENDED = ("done", "failed", "abandoned", "spilled", "cancelled")


@pytest.mark.parametrize(
    ("prefix", "continuation"),
    [
        ("He laughed: ha ha ha ha ha ha", " ha ha ha ha ha ha ha. Then he stopped."),
        (
            "def f(xs):\n    total = total + xs[0]\n",
            "    total = total + xs[0]\n    return total\n",
        ),
        ("| id | name  |\n|----|-------|\n| 1  | alice |\n", "| 1  | alice |\n| 2  | bob   |\n"),
        ("alpha bravo charlie alpha bravo charlie", " alpha bravo charlie delta"),
        ("ab" * 1500, "ab" * 1000 + "END"),
    ],
)
def test_d1_a_prefill_that_repeats_the_prefix_end_is_kept_whole(
    prefix: str, continuation: str
) -> None:
    out, _ = splice(prefix, continuation, mode="prefill")  # the engine continues exactly
    assert out == continuation


@pytest.mark.parametrize(
    ("prefix", "trimmed", "continuation"),
    [("Header\r\n", "\r\n", "\nBody"), ("line one  \n", "  \n", "\nline two"),
     ("Title\n\n", "\n\n", " \n\nText")],
)  # fmt: skip
def test_d11_a_seam_keeps_the_line_breaks_meant(
    prefix: str, trimmed: str, continuation: str
) -> None:
    out, _ = splice(prefix, continuation, trimmed=trimmed, mode="prefill")
    text = prefix + out
    body = continuation.lstrip()
    lead = continuation[: len(continuation) - len(body)]
    want = max(trimmed.count("\n"), lead.count("\n"))
    assert text.endswith(body)
    seam = text[len(prefix.rstrip()) : len(text) - len(body)]
    assert not seam.strip() and seam.count("\n") == want


def _runner(redis_url: str, fake: FakeProvider, *names: str) -> tuple[Any, AttemptRunner]:
    profile = {
        "kind": "openai-responses", "base_url": fake.openai_base_url,
        "continue_mode": "continue_final_message", "counting": "usage",
        "background": True, "stall_timeout_s": 5,
    }  # fmt: skip
    settings = Settings(
        redis_url=redis_url,
        file=ConfigFile.model_validate(
            {"providers": dict.fromkeys(names, profile), "worker": {"flush_tokens": 8}}
        ),
    )
    ctx = build_context(settings)
    return ctx, AttemptRunner(ctx)


def _billed(fake: FakeProvider) -> int:
    created = [
        e
        for e in fake.journal(settle_s=2)
        if e["path"] == "/v1/responses" and PROMPT in str(e["body"])
    ]
    return sum(e["output_tokens_billed"] for e in created)


def test_r02_a_carried_response_then_a_second_one_cut_are_both_counted(
    redis_server: RedisServer, fake: FakeProvider
) -> None:
    fake.add_faults([
        {"kind": "disconnect", "after_tokens": 150, "match": PROMPT},
        {"kind": "disconnect", "after_tokens": 60, "match": PROMPT},
    ])  # fmt: skip
    httpx.post(f"{fake.url}/_fake/config", json={"background_window_s": 0}, timeout=10)
    ctx, runner = _runner(redis_server.url, fake, "r")
    try:
        store: Store = runner.store
        job = store.create({"prompt": PROMPT, "provider": "r", "model": "m",
                            "budget_tokens": 4000}).id  # fmt: skip
        for _ in range(6):
            runner.run(job)
            if store.get(job).state.value in ENDED:
                break
    finally:
        ctx.close()
    record = store.get(job)
    assert record.state.value == "done"
    assert store.text(job) == fake.canonical_text([{"role": "user", "content": PROMPT}])
    assert record.spent_output_tokens >= _billed(fake)


def test_r04_a_job_moved_to_another_profile_counts_its_first_response(
    redis_server: RedisServer, fake: FakeProvider
) -> None:
    fake.add_faults([{"kind": "disconnect", "after_tokens": 80, "match": PROMPT}])
    ctx, runner = _runner(redis_server.url, fake, "r", "r2")
    try:
        store: Store = runner.store
        job = store.create({"prompt": PROMPT, "provider": "r", "model": "m",
                            "budget_tokens": 4000, "exit": {"on_cut": "spill"}}).id  # fmt: skip
        runner.run(job)
        assert store.get(job).state.value == "spilled"
        store.requeue(job, provider="r2")  # the operator moves it
        for _ in range(5):
            runner.run(job)
            if store.get(job).state.value in ENDED:
                break
    finally:
        ctx.close()
    record = store.get(job)
    assert record.state.value == "done"
    assert record.spent_output_tokens >= _billed(fake)
