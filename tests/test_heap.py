"""The worker's heap (resumeq.worker.heap): glibc's thread caches off by a re-exec under the same
PID, freed arena pages handed back, and when the concurrent worker hands them back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from resumeq.worker import heap
from resumeq.worker.concurrent import TRIM_EVERY_S, TRIM_MIN_GAP_S, TRIM_QUIET_S, trim_due

glibc_only = pytest.mark.skipif(
    not hasattr(os, "confstr") or os.confstr("CS_GNU_LIBC_VERSION") is None,
    reason="glibc's allocator only",
)

REEXEC = textwrap.dedent(
    """
    import json, os, sys
    from resumeq.worker import heap
    if sys.argv[1] == "entry":
        heap.mark_entry_point()
    first = os.environ.get("RESUMEQ_HEAP_REEXEC") is None
    if first:
        print(json.dumps({"first_pid": os.getpid()}), flush=True)
    heap.reexec_without_thread_caches()
    print(json.dumps({
        "pid": os.getpid(),
        "tunables": os.environ.get("GLIBC_TUNABLES"),
        "argv": sys.argv[1:],
    }), flush=True)
    """
)


def run_reexec(*args: str, tunables: str | None = None) -> list[dict[str, object]]:
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", heap._MARK)}
    if tunables is not None:
        env["GLIBC_TUNABLES"] = tunables
    out = subprocess.run(
        [sys.executable, "-c", REEXEC, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return [json.loads(line) for line in out.stdout.splitlines()]


@glibc_only
def test_an_entry_point_starts_again_under_its_pid_with_thread_caches_off() -> None:
    first, again = run_reexec("entry", "--concurrency", "50")
    assert again["pid"] == first["first_pid"]  # execve keeps the PID a supervisor knows
    assert again["tunables"] == heap.TCACHE_OFF
    assert again["argv"] == ["entry", "--concurrency", "50"]  # the same command line


@glibc_only
def test_other_tunables_are_kept_beside_it() -> None:
    _, again = run_reexec("entry", tunables="glibc.malloc.arena_max=4")
    assert again["tunables"] == f"glibc.malloc.arena_max=4:{heap.TCACHE_OFF}"


def test_a_users_own_tcache_setting_is_left_alone() -> None:
    first, same = run_reexec("entry", tunables="glibc.malloc.tcache_count=3")
    assert same["pid"] == first["first_pid"] and same["tunables"] == "glibc.malloc.tcache_count=3"


def test_code_that_is_not_an_entry_point_is_never_replaced() -> None:
    """resumeq inside someone else's program (a test's CLI runner) runs as it is."""
    first, same = run_reexec("library")
    assert same["pid"] == first["first_pid"] and same["tunables"] is None


@glibc_only
def test_free_pages_inside_the_arenas_are_handed_back() -> None:
    """Threads allocate 1 KB chunks and free all but one in a hundred: the survivors pin
    the heaps' tops, so free() alone gives nothing back; the trim does."""
    script = textwrap.dedent(
        """
        import json, threading
        from resumeq.worker import heap
        def rss_mb():
            for line in open("/proc/self/status"):
                if line.startswith("VmRSS"):
                    return int(line.split()[1]) / 1024
        kept = []
        def churn():
            chunks = [bytes(1000) + bytes([i % 256]) for i in range(40_000)]
            kept.extend(chunks[::100])
        threads = [threading.Thread(target=churn) for _ in range(4)]
        for t in threads: t.start()
        for t in threads: t.join()
        before = rss_mb()
        released = heap.release_free_memory()
        print(json.dumps({"before": before, "after": rss_mb(), "released": released}))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    r = json.loads(out.stdout)
    assert r["released"] is True
    assert r["before"] - r["after"] > 60, r  # of some 160 MB allocated, 1.6 MB kept


def test_the_worker_trims_after_a_burst_of_starts_or_at_most_every_few_seconds() -> None:
    assert not trim_due(0, 60.0, 60.0)  # nothing came or went: nothing to hand back
    assert trim_due(3, TRIM_MIN_GAP_S, TRIM_QUIET_S)  # a burst of starts is over
    assert not trim_due(3, TRIM_MIN_GAP_S - 0.1, 60.0)  # never twice within the gap
    assert not trim_due(3, TRIM_EVERY_S - 0.1, TRIM_QUIET_S / 2)  # starts keep coming...
    assert trim_due(3, TRIM_EVERY_S, TRIM_QUIET_S / 2)  # ...but not for ever
