"""``rq worker -w resumeq.rq_worker.ForkingWorker`` keeps working: the worker classes are in
:mod:`resumeq.worker.rq_worker`."""

from __future__ import annotations

from resumeq.worker.rq_worker import ForkingWorker, ResumeqWorker, exit_now, run_worker

__all__ = ["ForkingWorker", "ResumeqWorker", "exit_now", "run_worker"]
