"""Every token counted, whatever happens to the attempts (SPEC §22): over random sequences
of attempt outcomes — finished, cut, cancelled mid-stream, handed off, a background
response read on, a reattach refused (too old), a job moved to another profile — the
ledger's sums, the running totals, ``stats`` and ``/metrics`` agree, and none is below what
the fake provider's journal says it billed.

In process (the worker's own attempt code, a real redis-server, the fake over HTTP on
loopback); a dropped connection stands for a kill. About 30 examples.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

import httpx
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from worker_support import attempt_runner

from resumeq.core.errors import InvalidTransition
from resumeq.core.ledger import AttemptRecord
from resumeq.fake import FakeProvider
from resumeq.janitor.sweep import Janitor
from resumeq.producer import ops
from resumeq.store import Store, metrics
from resumeq.testing import RedisServer
from resumeq.worker.attempt import AttemptRunner

pytestmark = pytest.mark.timeout(240)

ENDED = {"done", "failed", "abandoned", "cancelled", "dropped"}
CHAT = {"kind": "openai", "continue_mode": "continue_final_message", "counting": "usage",
        "stall_timeout_s": 5}  # fmt: skip
BACKGROUND = {"kind": "openai-responses", "continue_mode": "continue_final_message",
              "counting": "usage", "background": True, "stall_timeout_s": 5}  # fmt: skip

#: What can happen to one attempt before the job's last, unfaulted one.
Step = tuple[str, int]  # (what, after how many tokens)
steps = st.lists(
    st.tuples(
        st.sampled_from(["cut", "cut", "cancel", "handoff", "refused", "moved"]),
        st.integers(5, 150),
    ),
    min_size=0,
    max_size=3,
)


def profiles(fake: FakeProvider) -> dict[str, dict[str, Any]]:
    return {
        "chat": {**CHAT, "base_url": fake.openai_base_url},
        "bg": {**BACKGROUND, "base_url": fake.openai_base_url},
        "bg2": {**BACKGROUND, "base_url": fake.openai_base_url},
    }


def configure(fake: FakeProvider, **body: Any) -> None:
    httpx.post(f"{fake.url}/_fake/config", json=body, timeout=10).raise_for_status()


def _when_streamed(store: Store, job_id: str, n: int, act: Any) -> None:
    """Call ``act`` once this attempt has checkpointed ``n`` tokens: the provider then
    pauses (a ``pause`` fault), so it comes while the stream is open and quiet."""
    base = store.get(job_id).spent_output_tokens
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if store.get(job_id).spent_output_tokens >= base + n:
            act()
            return
        time.sleep(0.01)


def _cancel(store: Store, job_id: str) -> None:
    with contextlib.suppress(InvalidTransition):  # it ended first (a reattach takes no fault)
        store.cancel(job_id, reason="cancelled mid-stream")


def _handoff(runner: AttemptRunner) -> None:
    runner.ctx.handoff.begin()
    runner.ctx.handoff.interrupt()


def _go_on(store: Store, job_id: str) -> bool:
    """Whether the job goes on (a spilled one is moved to the other background profile,
    as an operator would); False once it ended."""
    record = store.get(job_id)
    if record.state.value in ENDED:
        return False
    if record.state.value == "spilled":
        store.requeue(job_id, provider="bg2" if record.spec.provider == "bg" else "bg")
    return True


def _fault(runner: AttemptRunner, fake: FakeProvider, job_id: str, prompt: str, step: Step) -> Any:
    """The provider's fault for one step, and the helper thread that acts in its pause."""
    what, n = step
    if what not in ("cancel", "handoff"):
        fake.add_faults([{"kind": "disconnect", "after_tokens": n, "match": prompt}])
        return None
    fake.add_faults([{"kind": "pause", "after_tokens": n, "seconds": 1, "match": prompt}])
    store = runner.store
    act = (lambda: _cancel(store, job_id)) if what == "cancel" else (lambda: _handoff(runner))
    helper = threading.Thread(target=_when_streamed, args=(store, job_id, n, act))
    helper.start()
    return helper


def play(runner: AttemptRunner, fake: FakeProvider, provider: str, plan: list[Step]) -> str:
    """Run one job through ``plan``, then to its end; answers its id."""
    store = runner.store
    prompt = f"Accounting case {time.monotonic_ns()} [fake:mixed]"
    moved = any(what == "moved" for what, _ in plan)
    exit_policy = {"on_cut": "spill"} if moved else {"max_attempts": 10}
    job_id = store.create({"prompt": prompt, "provider": provider, "model": "m",
                           "budget_tokens": 4000, "exit": exit_policy}).id  # fmt: skip
    configure(fake, background_window_s=300)
    for step in plan:
        if not _go_on(store, job_id):
            break
        helper = _fault(runner, fake, job_id, prompt, step)
        try:
            runner.run(job_id)
        finally:
            if helper is not None:
                helper.join(timeout=15)
            runner.ctx.handoff = type(runner.ctx.handoff)()  # a new process, as it were
        if step[0] == "refused":
            configure(fake, background_window_s=0)  # the next reattach is refused: too old
    for _ in range(8):
        if not _go_on(store, job_id):
            break
        runner.run(job_id)
    assert store.get(job_id).state.value in ENDED
    return job_id


def scrape(store: Store) -> dict[str, float]:
    """The sums of the metrics' families over every series."""
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics.render(store)):
        for sample in family.samples:
            name = sample.name
            if name == "resumeq_tokens_billed_total":
                name = f"{name}:{sample.labels['type']}"
            sums[name] = sums.get(name, 0.0) + sample.value
    return sums


@pytest.fixture(scope="module")
def provider() -> Any:
    with FakeProvider(completion_tokens=300) as fake:
        yield fake


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(plan=steps, background=st.booleans())
def test_the_ledger_the_totals_stats_and_metrics_agree_and_cover_the_bill(
    provider: FakeProvider,
    redis_server: RedisServer,
    plan: list[Step],
    background: bool,
) -> None:
    fake = provider
    fake.reset()
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    if not background:  # refused reattaches and moves are the Responses wire's
        plan = [(w if w in ("cut", "cancel", "handoff") else "cut", n) for w, n in plan]
    with attempt_runner(redis_server.url, profiles(fake)) as runner:
        store = runner.store
        job_id = play(runner, fake, "bg" if background else "chat", plan)
        # A janitor's sweep: it stops (and counts) what a cancel left generating.
        assert Janitor(runner.ctx).sweep().errors == 0
        ledger = [AttemptRecord.model_validate(a) for a in store.ledger(job_id)]
        journal = fake.journal(settle_s=3)
        totals = store.totals()
        stats = ops.stats(store)
        scraped = scrape(store)
        by_provider = sum(store.totals(p).get("output_tokens_billed", 0) for p in store.providers())
        record = store.get(job_id)
    billed = sum(a.billed_output for a in ledger)
    # One account, four views of it.
    assert totals.get("output_tokens_billed", 0) == stats["output_tokens_billed"] == billed
    assert scraped.get("resumeq_tokens_billed_total:output", 0) == billed
    assert stats["attempts"] == len(ledger) == scraped.get("resumeq_attempts_total", 0)
    assert by_provider == billed
    # None below what the provider billed (a response let go counted too, a cancelled
    # one as well). A handoff closes the stream as a kill does, and a stream of a job
    # cancelled mid-pause is read no further: the provider may have sent more than the
    # worker read (into the socket's buffers) — what it billed for a background response is
    # asked, and counted, once it is cancelled.
    stopped = {what for what, _ in plan} & ({"handoff"} if background else {"handoff", "cancel"})
    if stopped:
        return
    provider_billed = sum(
        e["output_tokens_billed"]
        for e in journal
        if e["path"] in ("/v1/chat/completions", "/v1/responses")
    )
    assert billed >= provider_billed, (plan, [(a.kind, a.outcome, a.billed_output) for a in ledger],
                                       provider_billed)  # fmt: skip
    if record.state.value == "done":
        assert record.spent_output_tokens >= provider_billed
