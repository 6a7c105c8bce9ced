"""The worker: one attempt (:mod:`~resumeq.worker.attempt`), the checkpointer, the lease
keeper, the exits, the concurrent RQ worker and the process's context.

``resumeq.worker.run_attempt`` is the function every attempt's RQ job names: jobs already
queued, and producers of another version, keep finding it here.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from resumeq.worker.attempt import run_attempt

__all__ = ["run_attempt"]


def __getattr__(name: str) -> Any:
    if name == "run_attempt":
        return importlib.import_module("resumeq.worker.attempt").run_attempt
    raise AttributeError(f"module 'resumeq.worker' has no attribute {name!r}")
