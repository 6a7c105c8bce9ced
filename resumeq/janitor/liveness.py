"""Between sweeps, the janitor looks at the workers' connections (one ``CLIENT LIST`` every
``[janitor] liveness_interval_ms``): a worker missing from two looks whose presence key is
gone too (:mod:`resumeq.core.liveness`) is dead, and the jobs it leased are reaped at once.
A Redis that refuses ``CLIENT LIST`` leaves dead workers to be found by their leases."""

from __future__ import annotations

import logging
import threading
import time

import redis

from resumeq.core.errors import ResumeqError
from resumeq.core.liveness import Liveness
from resumeq.janitor.reaper import Reaper
from resumeq.janitor.steps import Steps, SweepReport
from resumeq.queue.queueing import retire_workers
from resumeq.store import redis_errors
from resumeq.store.capabilities import Refusal, is_refusal, refusal, refused, warning
from resumeq.store.presence import present
from resumeq.worker.context import WorkerContext

log = logging.getLogger(__name__)

#: A suspect is looked at again this long after its presence key's TTL runs out.
PRESENCE_SLACK_S = 0.01


class LivenessWatch:
    """One janitor's looks at the workers' connections, and the dead workers' jobs reaped
    by its reaper."""

    def __init__(self, ctx: WorkerContext, steps: Steps, reaper: Reaper) -> None:
        self.ctx = ctx
        self.store = ctx.store
        self.steps = steps
        self.reaper = reaper
        self.name = steps.name
        self._liveness = Liveness(ctx.settings.file.janitor.liveness_interval_ms / 1000.0)
        self._last_look = float("-inf")
        #: When a suspect's presence key expires: the next look is then.
        self._look_again_at = float("inf")
        #: False once Redis refused ``CLIENT LIST``: dead workers are found by their leases.
        self.looks = ctx.settings.file.janitor.liveness_interval_ms > 0

    def check(self) -> SweepReport:
        """One look at the workers' connections (one ``CLIENT LIST``); a worker missing
        from two looks whose presence key is gone too (:mod:`resumeq.core.liveness`) is dead:
        the jobs it leased are reaped at once, and its RQ registration is retired
        (``rq info`` and rq-dashboard stop listing it, and its executions are settled)."""
        report = SweepReport()
        with redis_errors("client list"):
            clients = self.ctx.redis.client_list(_type="normal")
        names = [_text(c.get("name", "")) for c in clients]
        suspects = self._liveness.observe(names, time.monotonic())
        if not suspects:
            return report
        with redis_errors("presence"):
            alive = present(self.ctx.redis, suspects)
        if left := [ms for ms in alive.values() if ms >= 0]:
            # Looked at again as soon as the first of those keys expires, not a look later.
            self._look_again_at = time.monotonic() + min(left) / 1000 + PRESENCE_SLACK_S
        dead = [w for w in suspects if w not in alive]
        if not dead:
            return report
        for worker in dead:
            self._liveness.dead(worker)
        held = self.store.leases_held_by(set(dead))
        if held:
            self.reaper.reap_batch(report, list(held), dead_tokens=held)
        retired = self.steps.safe(report, retire_workers, self.ctx.redis, dead) or []
        log.info(
            "%s: worker(s) %s gone (every connection closed, no presence): reaped %d job(s) "
            "at once%s",
            self.name,
            ", ".join(dead),
            len(report.reaped),
            f", retired {len(retired)} RQ registration(s)" if retired else "",
        )
        return report

    def wait(self, stop: threading.Event, seconds: float) -> None:
        """Wait ``seconds`` before the next sweep (less once ``stop`` is set), looking at
        the workers' connections every ``liveness_interval_ms`` meanwhile (0: only wait)."""
        every_s = self.ctx.settings.file.janitor.liveness_interval_ms / 1000.0
        if not self.looks:
            stop.wait(seconds)
            return
        until = time.monotonic() + seconds
        while not stop.is_set():
            if not self.looks:  # refused meanwhile
                stop.wait(max(0.0, until - time.monotonic()))
                return
            now = time.monotonic()
            if now - self._last_look >= every_s or now >= self._look_again_at:
                self._last_look, self._look_again_at = now, float("inf")
                try:
                    self.check()
                except ResumeqError as exc:
                    if isinstance(exc.__cause__, Exception) and is_refusal(exc.__cause__):
                        self._without_client_list([refusal("list", exc.__cause__)])
                    else:  # Redis unreachable: the next sweep says it
                        log.debug("%s: liveness check failed: %s", self.name, exc)
                    self._liveness.forget()
            now = time.monotonic()
            left = until - now
            if left <= 0:
                return
            upcoming = min(self._last_look + every_s, self._look_again_at)
            stop.wait(min(max(0.0, upcoming - now), left))

    def ask_for_client_list(self) -> None:
        """Whether Redis allows ``CLIENT LIST`` (asked once at start; a Redis that cannot
        be reached now is asked by the first look)."""
        try:
            refusals = refused(self.ctx.settings.redis_url, ["list"])
        except redis.RedisError:
            return
        if refusals:
            self._without_client_list(refusals)

    def _without_client_list(self, refusals: list[Refusal]) -> None:
        """No more looks: said once, at WARNING, with what would restore them."""
        self.looks = False
        lease_s = self.ctx.settings.file.worker.lease_ttl_ms / 1000
        log.warning(
            warning(
                "janitor",
                refusals,
                "dead workers are found by their leases alone: their jobs go on once the "
                f"leases expire ({lease_s:g} s, [worker] lease_ttl_ms), not within a second",
            )
        )


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
