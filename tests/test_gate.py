"""The gate: named cases and properties over every job and cut."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from resumeq.core.gate import (
    BACKOFF_CAP_S,
    MIN_ATTEMPT_GAP_S,
    RETRY_AFTER_CAP_S,
    Cut,
    JobView,
    backoff_s,
    decide,
)
from resumeq.core.spec import ExitPolicy


def job(**over: Any) -> JobView:
    base: dict[str, Any] = {
        "budget_tokens": 1000,
        "floor_tokens": 32,
        "spent_output_tokens": 300,
        "prefix_chars": 1200,
        "attempts": 1,
        "spill_count": 0,
    }
    base.update(over)
    return JobView.model_validate(base)


CUT = Cut(kind="stream_cut")
EXIT_ABANDON = ExitPolicy(droppable=True)


@pytest.mark.parametrize(
    ("view", "cut", "action", "reason"),
    [
        (job(), CUT, "resume", "stream_cut after 300"),
        (job(), Cut(kind="worker_died"), "resume", "worker_died"),
        (job(), Cut(kind="finished", finish_reason="stop"), "done", "stop"),
        (job(spent_output_tokens=1000), CUT, "done", "budget exhausted"),
        (job(prefix_chars=0, spent_output_tokens=0), CUT, "retry", "before any output"),
        (job(), Cut(kind="fatal", detail="HTTP 400"), "failed", "HTTP 400"),
        (job(), Cut(kind="conflict"), "failed", "prompt hash conflict"),
        (job(spent_output_tokens=980), CUT, "spill", "below the floor"),
        (job(spent_output_tokens=980, exit=EXIT_ABANDON), CUT, "abandon", "below the floor"),
        (job(spent_output_tokens=980, spill_count=1), CUT, "failed", "after a spill"),
        (job(attempts=5), CUT, "spill", "attempts exhausted"),
        (job(counts_exact=False, require_exact_counts=True), CUT, "spill", "estimate"),
        (job(counts_exact=False), CUT, "resume", ""),
        (job(byte_exact=True, exit=EXIT_ABANDON), CUT, "abandon", "byte_exact"),
        (job(exit=ExitPolicy(on_cut="abandon", droppable=True)), CUT, "abandon", "on_cut"),
        (job(exit=ExitPolicy(on_cut="abandon")), CUT, "spill", "on_cut is abandon"),
        (job(exit=ExitPolicy(on_cut="spill", droppable=True)), CUT, "spill", "on_cut is spill"),
        # on_cut is for cuts that leave output behind: one that left nothing is retried,
        # paced by time, whatever the exit (SPEC §22)...
        (
            job(
                prefix_chars=0,
                spent_output_tokens=0,
                progressed=False,
                exit=ExitPolicy(on_cut="abandon", droppable=True),
            ),
            CUT,
            "retry",
            "before any output",
        ),
        (
            job(
                prefix_chars=0,
                spent_output_tokens=0,
                progressed=False,
                exit=ExitPolicy(on_cut="spill"),
            ),
            Cut(kind="retryable", retry_after_s=2.0),
            "retry",
            "retryable before any output",
        ),
        # ...and takes the exit once such a run outlasts the window, naming it.
        (
            job(
                prefix_chars=0,
                spent_output_tokens=0,
                progressed=False,
                failing_for_s=400,
                exit=ExitPolicy(on_cut="spill"),
            ),
            Cut(kind="retryable"),
            "spill",
            "(retry window 300 s)",
        ),
        # Reasoning billed and cut before any text: left output behind.
        (
            job(prefix_chars=0, spent_output_tokens=40, exit=ExitPolicy(on_cut="spill")),
            CUT,
            "spill",
            "on_cut is spill",
        ),
        (
            job(prefix_chars=0, spent_output_tokens=0, progressed=False, failing_for_s=301),
            CUT,
            "spill",
            "no output for 301 s",
        ),
        # Attempts that deliver nothing are paced by time, not counted out.
        (
            job(prefix_chars=0, spent_output_tokens=0, attempts=9, progressed=False),
            Cut(kind="retryable"),
            "retry",
            "before any output",
        ),
        (job(attempts=9, progressed=False, failing_for_s=10), CUT, "resume", ""),
        (job(attempts=9, progressed=False, failing_for_s=300), CUT, "spill", "no output"),
        (job(), Cut(kind="stream_cut", in_non_text_block=True), "spill", "tool-use"),
    ],
)
def test_named_cases(view: JobView, cut: Cut, action: str, reason: str) -> None:
    decision = decide(view, cut)
    assert decision.action == action, decision
    assert reason in decision.reason


def test_resume_asks_only_for_the_rest() -> None:
    d = decide(job(spent_output_tokens=300), CUT)
    assert d.max_tokens == 700


def test_retry_after_is_honoured_and_backoff_otherwise() -> None:
    empty = job(prefix_chars=0, spent_output_tokens=0)
    assert decide(empty, Cut(kind="retryable", retry_after_s=2.0)).delay_s == 2.0
    failing = empty.model_copy(update={"progressed": False, "failures": 2})
    assert decide(failing, Cut(kind="retryable"), jitter=0.0).delay_s == backoff_s(3, 0.0)
    assert decide(job(), Cut(kind="worker_died")).delay_s == 0.0


def test_backoff_grows_and_is_capped() -> None:
    assert backoff_s(1, 0.0) < backoff_s(3, 0.0) < backoff_s(5, 0.0)
    assert backoff_s(50, 0.999) <= BACKOFF_CAP_S
    with pytest.raises(ValueError):
        backoff_s(1, 1.0)


views = st.builds(
    JobView,
    budget_tokens=st.integers(1, 5000),
    floor_tokens=st.integers(1, 200),
    spent_output_tokens=st.integers(0, 6000),
    prefix_chars=st.integers(0, 3) | st.integers(0, 50_000),
    attempts=st.integers(0, 8),
    spill_count=st.integers(0, 2),
    progressed=st.booleans(),
    failures=st.integers(0, 12),
    failing_for_s=st.floats(0, 1_000),
    retry_window_s=st.sampled_from([30.0, 300.0]),
    attempt_s=st.none() | st.floats(0, 0.2) | st.floats(0, 600),
    counts_exact=st.booleans(),
    require_exact_counts=st.booleans(),
    byte_exact=st.booleans(),
    exit=st.builds(
        ExitPolicy,
        on_cut=st.sampled_from(["resume", "abandon", "spill"]),
        droppable=st.booleans(),
        max_attempts=st.integers(1, 6),
    ),
)
cuts = st.builds(
    Cut,
    kind=st.sampled_from(
        [
            "finished",
            "worker_died",
            "handoff",
            "retryable",
            "stream_cut",
            "stall",
            "fatal",
            "conflict",
        ]
    ),
    finish_reason=st.sampled_from([None, "stop", "length"]),
    retry_after_s=st.none() | st.floats(0, 10_000),
    in_non_text_block=st.booleans(),
)


@given(view=views, cut=cuts, jitter=st.floats(0, 0.999))
def test_a_cut_that_left_nothing_is_retried_whatever_the_exit(
    view: JobView, cut: Cut, jitter: float
) -> None:
    """Until the retry window ends (SPEC §22)."""
    d = decide(view, cut, jitter=jitter)
    nothing_left = view.prefix_chars == 0 and view.spent_output_tokens == 0
    if (
        nothing_left
        and not view.progressed
        and view.failing_for_s < view.retry_window_s
        and cut.kind not in ("finished", "fatal", "conflict")
        and view.budget_tokens >= view.floor_tokens
    ):
        assert d.action == "retry", (view, cut, d)


@given(view=views, cut=cuts, jitter=st.floats(0, 0.999))
def test_properties(view: JobView, cut: Cut, jitter: float) -> None:
    d = decide(view, cut, jitter=jitter)
    remaining = view.budget_tokens - view.spent_output_tokens
    # Never the original request again once a prefix exists.
    if view.prefix_chars > 0:
        assert d.action != "retry"
    # Spill happens at most once.
    if d.action == "spill":
        assert view.spill_count == 0
        assert view.exit.on_cut == "spill" or not view.exit.droppable
    if d.action == "abandon":
        assert view.exit.droppable and view.exit.on_cut != "spill"
    if d.action == "resume":
        assert view.prefix_chars > 0 and remaining >= view.floor_tokens
        assert view.exit.on_cut == "resume" and not view.byte_exact
        assert view.counts_exact or not view.require_exact_counts
        assert not cut.in_non_text_block
    if d.action in ("resume", "retry"):
        assert d.max_tokens == remaining > 0 and 0 <= d.delay_s <= RETRY_AFTER_CAP_S
        # Counted out only when making progress; timed out only when not.
        assert not view.progressed or view.attempts < view.exit.max_attempts
        assert view.progressed or view.failing_for_s < view.retry_window_s
        # Never a hot loop: attempts of one job start at least the minimum gap apart.
        gap = 0.0 if view.attempt_s is None else max(0.0, MIN_ATTEMPT_GAP_S - view.attempt_s)
        gap = 0.0 if cut.kind in ("worker_died", "handoff") else gap
        assert d.delay_s >= gap
        # A provider's Retry-After is never cut short (up to its cap).
        if cut.retry_after_s is not None:
            assert d.delay_s >= min(cut.retry_after_s, RETRY_AFTER_CAP_S)
        # Progress continues at once (past the gap); only failures back off.
        elif view.progressed or cut.kind in ("worker_died", "handoff"):
            assert d.delay_s == gap
        else:
            ceiling = min(BACKOFF_CAP_S, 2.0 ** max(0, view.failures))
            assert max(gap, ceiling / 2) <= d.delay_s <= max(gap, ceiling)
    if cut.kind in ("fatal", "conflict"):
        assert d.action == "failed"
    if d.action == "done":
        assert cut.kind == "finished" or remaining <= 0
    assert d.reason


def test_a_cut_after_progress_resumes_at_once_every_time() -> None:
    """Before: five attempts 3 s apart, then a spill, during a 20-second outage."""
    for attempts in (1, 2, 4):
        assert decide(job(attempts=attempts), CUT).delay_s == 0.0
        assert decide(job(attempts=attempts), Cut(kind="stall")).delay_s == 0.0
    stuck = job(attempts=4, progressed=False, failures=3, failing_for_s=20)
    assert decide(stuck, CUT, jitter=0.0).delay_s == backoff_s(4, 0.0) > 0
    assert decide(stuck, CUT).action == "resume"  # 20 s is inside the window
    empty = job(prefix_chars=0, spent_output_tokens=0, progressed=False)
    assert decide(empty, CUT, jitter=0.0).delay_s == backoff_s(1, 0.0) > 0


def test_a_job_cut_five_times_after_progress_is_continued_five_times_at_once() -> None:
    view = job(attempts=0, spent_output_tokens=0, prefix_chars=0, exit=ExitPolicy(max_attempts=6))
    delays = []
    for _ in range(5):
        # Each attempt ran 0.4 s and delivered 40 tokens before its cut.
        view = view.model_copy(
            update={
                "attempts": view.attempts + 1,
                "spent_output_tokens": view.spent_output_tokens + 40,
                "prefix_chars": view.prefix_chars + 160,
                "progressed": True,
                "attempt_s": 0.4,
            }
        )
        d = decide(view, CUT, jitter=0.9)
        assert d.action == "resume"
        delays.append(d.delay_s)
    assert delays == [0.0] * 5


def test_attempts_that_deliver_nothing_back_off_exponentially() -> None:
    delays = [
        decide(
            job(prefix_chars=0, spent_output_tokens=0, progressed=False, failures=n, attempt_s=0.2),
            Cut(kind="retryable"),
            jitter=0.0,
        ).delay_s
        for n in range(7)
    ]
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0]  # half of 1, 2, 4 … 60 s (jitter 0)
    capped = job(prefix_chars=0, spent_output_tokens=0, progressed=False, failures=40)
    assert decide(capped, Cut(kind="retryable"), jitter=0.999).delay_s <= BACKOFF_CAP_S


def test_retry_after_wins_over_backoff_and_over_progress() -> None:
    failing = job(prefix_chars=0, spent_output_tokens=0, progressed=False, failures=5)
    assert decide(failing, Cut(kind="retryable", retry_after_s=0.3)).delay_s == 0.3
    assert decide(job(), Cut(kind="stream_cut", retry_after_s=2.0)).delay_s == 2.0
    assert decide(job(), Cut(kind="retryable", retry_after_s=9e9)).delay_s == RETRY_AFTER_CAP_S


def test_a_fast_cut_waits_out_the_minimum_gap_and_no_more() -> None:
    assert decide(job(attempt_s=0.01), CUT).delay_s == pytest.approx(MIN_ATTEMPT_GAP_S - 0.01)
    assert decide(job(attempt_s=MIN_ATTEMPT_GAP_S), CUT).delay_s == 0.0
    assert decide(job(attempt_s=None), CUT).delay_s == 0.0  # not known: a janitor's reap
    # A worker going away hands on at once: it says nothing about the provider.
    assert decide(job(attempt_s=0.01), Cut(kind="handoff")).delay_s == 0.0


@pytest.mark.parametrize(
    "over",
    [
        {"byte_exact": True},
        {"require_exact_counts": True, "counts_exact": False},
        {"spent_output_tokens": 990, "floor_tokens": 32},
    ],
)
def test_reading_on_a_background_response_is_no_new_draw(over: dict[str, Any]) -> None:
    """What stops a continuation does not stop reading on the same response; the job's own
    choices (on_cut, attempts, the retry window) still do."""
    cut = Cut(kind="stream_cut", in_non_text_block="spent_output_tokens" in over)
    assert decide(job(**over), cut).action != "resume"
    read_on = decide(job(**over, reads_on=True), cut)
    assert read_on.action == "resume" and "read on from the provider" in read_on.reason
    assert decide(job(**over, reads_on=True, exit=ExitPolicy(on_cut="spill")), cut).action == (
        "spill"
    )
    assert decide(job(**over, reads_on=True, attempts=6), cut).action != "resume"
