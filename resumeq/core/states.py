"""A job's states, in a module of their own: what a command line needs to name them
(``jobs --state``) without loading the pydantic models of :mod:`resumeq.core.models`."""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    #: The owner's lease expired and a janitor took the job over to apply the gate.
    STALLED = "stalled"
    SPILLED = "spilled"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    ABANDONED = "abandoned"
    DROPPED = "dropped"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES = frozenset(
    {JobState.DONE, JobState.FAILED, JobState.CANCELLED, JobState.ABANDONED, JobState.DROPPED}
)

#: The states that are not terminal, each with an index of its own (``jobs --state``).
LIVE_STATES = ("queued", "running", "stalled", "spilled")

#: The most entries of the index of every job one listing of ended jobs reads by default.
ENDED_SCAN_MAX = 1_000
