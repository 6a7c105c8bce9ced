"""Entry point for a resumeq worker process (the Procfile's ``worker:`` line).

Starts a concurrent resumeq worker — up to ``[worker] concurrency`` attempts at once in
this one process, with RQ's scheduler on a thread — for the configured queues; Redis comes
from ``RESUMEQ_REDIS_URL`` and the profiles from the file ``RESUMEQ_CONFIG`` names. Extra
arguments are queue names. SIGTERM hands every stream in flight on and exits. ``resumeq
worker`` does the same.
"""

from __future__ import annotations

import sys

from resumeq.core.errors import ResumeqError
from resumeq.core.settings import load_settings
from resumeq.worker import heap
from resumeq.worker.rq_worker import exit_now, run_worker


def main(argv: list[str]) -> int:
    heap.reexec_without_thread_caches()  # this process again, glibc's thread caches off
    try:
        return run_worker(load_settings(), argv)
    except (ResumeqError, ValueError) as exc:
        print(f"resumeq worker: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    heap.mark_entry_point()
    exit_now(main(sys.argv[1:]))  # at once: no interpreter teardown after a handoff
