"""A sweep's report, and how its steps run: a step that fails is logged as one line and
counted in the report, and the sweep goes on; only a Redis that cannot be reached ends it."""

from __future__ import annotations

import logging
import reprlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar, TypeVarTuple

from resumeq.core.errors import RedisUnavailable, ResumeqError
from resumeq.store import redis_errors

log = logging.getLogger(__name__)

R = TypeVar("R")
Ts = TypeVarTuple("Ts")


@dataclass
class SweepReport:
    reaped: list[str] = field(default_factory=list)
    requeued: list[str] = field(default_factory=list)
    #: Jobs whose outbox this sweep carried out.
    followed_up: list[str] = field(default_factory=list)
    #: Ended jobs whose events stream this sweep removed (their text kept compactly).
    trimmed: list[str] = field(default_factory=list)
    outcomes: dict[str, str] = field(default_factory=dict)
    errors: int = 0


class Steps:
    """How one janitor runs the steps of its sweeps, every piece of it alike: each failure
    in a line of the log that names the janitor, and counted in the report."""

    def __init__(self, name: str) -> None:
        self.name = name

    def safe(self, report: SweepReport, fn: Callable[[*Ts], R], *args: *Ts) -> R | None:
        """Run one step of a sweep: a failure is logged as one line (a traceback only for
        what resumeq does not expect) and the sweep goes on, except when Redis cannot be
        reached: that is raised, and ends the sweep (every further step would fail too)."""
        name = getattr(fn, "__name__", "sweep step")
        try:
            with redis_errors(name.lstrip("_")):
                return fn(*args)
        except RedisUnavailable:
            raise
        except (ResumeqError, ValueError, OSError) as exc:
            report.errors += 1
            log.warning("%s: %s%s failed: %s", self.name, name, reprlib.repr(args), exc)
        except Exception:
            report.errors += 1
            log.exception("%s: %s%s failed", self.name, name, reprlib.repr(args))
        return None

    def failed(self, report: SweepReport, step: str, job_id: str, exc: Exception) -> None:
        """One job's step failed, in a batch: logged as :meth:`safe` would, and the batch
        goes on."""
        report.errors += 1
        if isinstance(exc, ResumeqError | ValueError | OSError):
            log.warning("%s: %s('%s',) failed: %s", self.name, step, job_id, exc)
        else:
            log.error("%s: %s('%s',) failed", self.name, step, job_id, exc_info=exc)
