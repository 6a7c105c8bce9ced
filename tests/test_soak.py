"""A short chaos soak in the suite (the long one, with a Redis restart, is ``make soak``;
Redis restarts are tested on their own in ``test_e2e_redis_faults.py``)."""

from __future__ import annotations

import pytest

from resumeq.testing.soak import SoakConfig, run_soak


@pytest.mark.timeout(180)
@pytest.mark.xdist_group("cpu-heavy")
def test_short_chaos_soak_loses_nothing() -> None:
    result = run_soak(
        SoakConfig(
            jobs=24,
            workers=3,
            duration_s=8,
            kill_every_s=3,
            freeze_every_s=8,
            handoff_every_s=4,
            redis_restarts=0,
            # Streams of about a second, so that a deploy's SIGTERM finds some in flight:
            # at 2 ms a token they last 0.3 s, and since continuations go to the front of
            # the queue and start at once, a handoff sometimes found none (a run with no
            # attempt handed off, the check of handoffs then moot).
            token_delay_ms=6.0,
            # Short: some 35 exits and 25 outbox entries carried out by workers, each worker
            # arming one of the two failpoints; a chance high enough that every run sees
            # workers die at them (each death ends every stream of that process).
            failpoint_probability=0.3,
            settle_timeout_s=120,
        )
    )
    assert result["terminal"] == result["jobs"] == 24, result
    assert result["lost"] == result["gap"] == result["duplicated_text"] == 0, result
    assert result["inconsistent_events"] == 0, result
    assert result["canonical"] == result["done"] == 24, result
    assert result["over_billed_without_worker_death"] == 0, result
    # Every hook's effect applied once (a rerun, after its worker died, changes nothing).
    assert result["hooked_done"] == 16, result
    assert result["hook_runs"] == 16 + result["hook_reruns"], result
    assert result["hooks_missing"] == result["hooks_rerun_differed"] == 0, result
    assert result["hooks_stale_text"] == result["hooks_unexpected"] == 0, result
    assert result["worker_kills"] >= 2 and result["worker_freezes"] >= 1, result
    # deploys: every worker sent a SIGTERM handed its streams on and exited 0 in time
    assert result["worker_handoffs"] >= 1 and result["handoffs_unclean"] == 0, result
    assert result["handed_off_attempts"] >= 1, result
    assert result["commit_kills"] >= 1, result
    assert result["faults_injected"] >= 1, result
