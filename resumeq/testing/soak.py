"""The chaos soak: many jobs, workers killed, frozen and sent SIGTERM (a deploy: they hand
their streams on), processes killed between a commit and what must follow it, provider
faults, a Redis restart — then a check that nothing was lost, nothing spliced twice, no
replay was paid for, and every done job's hook ran once.

Real parts throughout: a redis-server with AOF (``appendfsync always``), concurrent worker
and janitor processes, the fake provider over HTTP with seeded random faults. With
``failovers``, Redis is a Sentinel deployment instead (a primary, its replica, three
sentinels; :mod:`resumeq.testing.sentinel`) and each outage is a failover: the primary
SIGKILLed with its last writes not on the replica, the replica promoted.
``benchmarks/chaos.py`` runs the long version; the test suite runs a short one.

The workers run with a failpoint armed (:mod:`resumeq.core.failpoints`): each worker process
arms one of the two, in turn (``ARMING_ORDER``), so that a worker that exits with 137 is
known to have died at that point, with every stream it ran — right after an exit's commit
(``after_commit``) or after carrying out an outbox entry but before marking it done
(``after_follow_up``); those exits are what ``commit_kills`` counts (and, for a forking
worker, the lines its parent logs for a work horse that died so). Two jobs in three name a
hook (:mod:`resumeq.testing.soak_hooks`) that records each of its runs in Redis.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rq.exceptions import NoSuchJobError
from rq.job import Job
from rq.serializers import JSONSerializer

from resumeq.core import failpoints
from resumeq.core.models import holder_pid
from resumeq.fake import FakeProvider, count_tokens
from resumeq.producer.client import Client
from resumeq.queue.queueing import hook_rq_id, rq_queue
from resumeq.store import Store, decode, keys
from resumeq.testing.processes import Cluster, Proc, write_config
from resumeq.testing.redis_server import RedisServer
from resumeq.testing.sentinel import SentinelDeployment
from resumeq.testing.soak_hooks import HOOK, HOOK_EFFECTS, HOOK_RUNS
from resumeq.worker.hooks import idempotency_key

TERMINAL = {"done", "failed", "cancelled", "abandoned", "dropped"}
FAULT_KINDS = ("disconnect", "truncate", "malformed", "error_event", "stall", "status")
#: How long after the last job became terminal its hooks may take to run: the janitor
#: carries out a dead committer's outbox after ``outbox.JANITOR_GRACE_MS``.
HOOK_SETTLE_S = 30.0
#: A worker sent a SIGTERM must have handed its streams on and exited within this long.
HANDOFF_GRACE_S = 5.0
#: Jobs held back from the enqueue until a deploy has handed an attempt on. A short run
#: whose every deploy met its streams ending (drained to their finish, or the worker dead
#: at its failpoint before its first handoff) goes on past its duration, for up to the
#: duration again: each round lets one of them go and a deploy follows it at once.
DEPLOY_RESERVE = 3
#: A round of that overtime; its deploy comes this long after the job it let go.
OVERTIME_ROUND_S = 2.0
DEPLOY_AFTER_S = 0.5
#: How often the totals are read for a handed-on attempt while none is seen.
DEPLOY_LOOK_S = 0.5
#: The failpoint each new worker process arms, in turn. ``after_follow_up`` is hit only where
#: a worker carried out an outbox entry, ``after_commit`` at every exit: of an odd number of
#: workers, the first gets one more.
ARMING_ORDER = ("after_follow_up", "after_commit")
#: What RQ's worker process logs when its work horse ended without finishing its RQ job.
_HORSE_DIED = re.compile(
    r"job (\S+) failed \(Work-horse terminated unexpectedly; waitpid returned (\d+)"
)


@dataclass
class SoakConfig:
    jobs: int = 300
    workers: int = 4
    duration_s: float = 300.0
    fault_probability: float = 0.2
    kill_every_s: float = 4.0
    freeze_every_s: float = 25.0
    #: A SIGTERM (a deploy) to a worker this often: it hands its streams on and exits.
    handoff_every_s: float = 6.0
    redis_restarts: int = 1
    #: Failovers of a Sentinel deployment instead of restarts (0: one redis-server).
    failovers: int = 0
    #: How long the replica is cut off before each failover's kill (what it misses).
    failover_lag_s: float = 0.3
    #: ``[store] durability``.
    durability: str = "primary"
    completion_tokens: int = 160
    token_delay_ms: float = 2.0
    flush_tokens: int = 16
    lease_ttl_ms: int = 2000
    #: The workers' ``[worker] read_pause_ms`` (0: reads unpaced, the default).
    read_pause_ms: int = 0
    #: Per hit, for the one failpoint each worker process arms (0: none armed).
    failpoint_probability: float = 0.05
    seed: int = 7
    settle_timeout_s: float = 240.0


@dataclass
class _Due:
    """When the soak next kills, freezes, deploys, and (in overtime) lets a job go."""

    kill: float
    freeze: float
    handoff: float
    round: float


@dataclass
class Chaos:
    """What the soak did to the system."""

    worker_kills: int = 0
    worker_freezes: int = 0
    worker_handoffs: int = 0
    #: Handed-off workers that did not exit 0 within the grace period (and were killed).
    handoffs_unclean: int = 0
    #: Their PIDs.
    unclean_pids: set[int] = field(default_factory=set)
    #: Worker processes that ended without being killed by the soak.
    worker_exits: int = 0
    redis_restarts: int = 0
    failovers: int = 0
    #: Seconds from each failover's kill to the replica's promotion.
    failover_s: list[float] = field(default_factory=list)
    events: list[str] = field(default_factory=list)


def _prompt(n: int) -> str:
    return f"Soak job {n}: describe a coastline, its birds and its weather."


def _hooked(n: int) -> bool:
    """Two jobs in three name the soak's hook; the others must never see it run."""
    return n % 3 != 0


class Soak:
    def __init__(self, config: SoakConfig, directory: Path) -> None:
        self.config = config
        self.directory = directory
        self.rng = random.Random(config.seed)
        self.chaos = Chaos()
        self.workers: list[Proc] = []
        #: Every worker process started, with the failpoint it armed.
        self.spawned: list[tuple[Proc, str | None]] = []
        self.killed: set[int] = set()
        #: Workers sent a SIGTERM, with the time by which they must have exited.
        self.handed_off: dict[int, float] = {}
        self._handed_on = False
        self._handoff_looked = 0.0
        #: Jobs not enqueued yet for a deploy to meet (``DEPLOY_RESERVE``).
        self._reserve = 0
        self.frozen: list[tuple[Proc, float]] = []
        self._excess: dict[str, int] = {}

    def run(self) -> dict[str, Any]:
        c = self.config
        with contextlib.ExitStack() as stack:
            if c.failovers:
                deployment = stack.enter_context(SentinelDeployment())
                url, outage = deployment.url, self._failover(deployment)
            else:
                server = stack.enter_context(
                    RedisServer(appendonly=True, directory=self.directory / "redis")
                )
                url, outage = server.url, self._restart(server)
            fake = stack.enter_context(
                FakeProvider(completion_tokens=c.completion_tokens, token_delay_ms=c.token_delay_ms)
            )
            fake.chaos(
                probability=c.fault_probability,
                kinds=list(FAULT_KINDS),
                seed=c.seed,
                status=503,
                seconds=3.0,
            )
            config = self._config(fake)
            cluster = Cluster(self.directory, redis_url=url, config=config)
            cluster.env.pop("RESUMEQ_FAILPOINTS", None)  # the janitors never arm one
            store = Store.from_url(url)
            try:
                self.workers = [self._worker(cluster) for _ in range(c.workers)]
                cluster.janitor(interval_s=0.5)
                cluster.janitor(interval_s=0.7)
                ids = self._drive(cluster, outage, store)
                self._settle(cluster, store, ids)
                self._settle_hooks(cluster, store, ids)
                logs = cluster.logs(tail=None)
            finally:
                cluster.stop()
            return self._verify(store, fake, ids, logs)

    def _restart(self, server: RedisServer) -> Callable[[], str]:
        def restart() -> str:
            server.restart()
            self.chaos.redis_restarts += 1
            return "redis restarted"

        return restart

    def _failover(self, deployment: SentinelDeployment) -> Callable[[], str]:
        def failover() -> str:
            took = deployment.failover(lag_s=self.config.failover_lag_s)
            self.chaos.failovers += 1
            self.chaos.failover_s.append(round(took, 2))
            return f"redis failed over (replica promoted {took:.1f} s after the kill)"

        return failover

    def _config(self, fake: FakeProvider) -> Path:
        c = self.config
        return write_config(
            self.directory / "resumeq.toml",
            {
                "providers": {
                    "soak": {
                        "kind": "openai",
                        "base_url": fake.openai_base_url,
                        "continue_mode": "instruction",
                        "counting": "usage",
                        "stall_timeout_s": 1.5,
                    }
                },
                "worker": {
                    "flush_tokens": c.flush_tokens,
                    "flush_ms": 250,
                    "lease_ttl_ms": c.lease_ttl_ms,
                    "read_pause_ms": c.read_pause_ms,
                    "hook_modules": ["resumeq.testing.soak_hooks"],
                },
                "janitor": {"interval_s": 0.5},
                # The checks read every job's events stream, which the janitor removes a
                # grace after the job ends (60 s by default): a run longer than that lost
                # the early jobs' streams and counted each as inconsistent. Kept past the
                # whole run and its settling.
                "store": {
                    "events_grace_s": c.duration_s + c.settle_timeout_s + 600,
                    "durability": c.durability,
                },
            },
        )

    def _drive(self, cluster: Cluster, outage: Callable[[], str], store: Store) -> list[str]:
        """Enqueue the jobs over the first part of the run while breaking things;
        ``outage()`` restarts Redis, or fails it over."""
        c = self.config
        client = Client(store.redis)
        start = time.monotonic()
        outages = c.failovers or c.redis_restarts
        restarts_at = [c.duration_s * (i + 1) / (outages + 1) for i in range(outages)]
        due = _Due(
            kill=start + c.kill_every_s,
            freeze=start + c.freeze_every_s / 2,
            handoff=start + c.handoff_every_s / 2,
            round=start + c.duration_s,
        )
        self._reserve = min(DEPLOY_RESERVE, c.jobs // 4)
        ids: list[str] = []
        while True:
            now = time.monotonic()
            elapsed = now - start
            handed_on = self._deploys_seen(store)
            if handed_on:
                self._reserve = 0
            elif now >= due.round and elapsed < 2 * c.duration_s:
                # overtime: one held-back job now, and a deploy to meet it
                self._reserve = max(0, self._reserve - 1)
                due.round = now + OVERTIME_ROUND_S
                due.handoff = now + DEPLOY_AFTER_S
            self._enqueue_due(client, ids, elapsed)
            self._break_things(cluster, store, due, now, overtime=elapsed >= c.duration_s)
            if restarts_at and elapsed >= restarts_at[0]:
                restarts_at.pop(0)
                self.chaos.events.append(f"{elapsed:.1f}s {outage()}")
            self._respawn(cluster)
            if elapsed >= c.duration_s and (handed_on or elapsed >= 2 * c.duration_s):
                break
            time.sleep(0.05)
        for proc, _ in self.frozen:
            proc.signal_group(signal.SIGCONT)
        self.frozen.clear()
        # A job still held back (no deploy handed an attempt on in the overtime): enqueued
        # now, so the run has every job; the check of handoffs then says what happened.
        self._reserve = 0
        self._enqueue_due(client, ids, elapsed)
        return ids

    def _break_things(
        self, cluster: Cluster, store: Store, due: _Due, now: float, *, overtime: bool
    ) -> None:
        """The kills, freezes and deploys that are due; in overtime with no attempt handed
        on yet, the next deploy waits for the next round's job."""
        c = self.config
        if now >= due.kill:
            self._kill_one(cluster)
            due.kill = now + c.kill_every_s * self.rng.uniform(0.5, 1.5)
        if now >= due.freeze:
            self._freeze_one()
            due.freeze = now + c.freeze_every_s * self.rng.uniform(0.5, 1.5)
        if now >= due.handoff and self._hand_off_one(store):
            due.handoff = now + c.handoff_every_s * self.rng.uniform(0.5, 1.5)
            if overtime and not self._handed_on:
                due.handoff = due.round + DEPLOY_AFTER_S
        self._thaw(now)

    def _enqueue_due(self, client: Client, ids: list[str], elapsed: float) -> None:
        """Enqueue the jobs due by now (spread over the first 60% of the run), all but the
        reserve."""
        c = self.config
        due = min(c.jobs, int(c.jobs * min(1.0, elapsed / (c.duration_s * 0.6))) + 1)
        while len(ids) < min(due, c.jobs - self._reserve):
            spec = {
                "prompt": _prompt(len(ids)),
                "provider": "soak",
                "model": "soak-model",
                "budget_tokens": 4 * c.completion_tokens,
                "exit": {"max_attempts": 50},
                "hooks": [HOOK] if _hooked(len(ids)) else [],
            }
            ids.append(self._retrying(lambda spec=spec: client.enqueue(spec)))

    def _deploys_seen(self, store: Store) -> bool:
        """Whether a deploy has handed an attempt on yet, from the totals the ledger
        records add to (read every ``DEPLOY_LOOK_S``, until one is seen)."""
        now = time.monotonic()
        if self._handed_on or now - self._handoff_looked < DEPLOY_LOOK_S:
            return self._handed_on
        self._handoff_looked = now
        try:
            totals = store.totals()
        except Exception:  # Redis restarting: look again at the next turn
            return False
        self._handed_on = any(k.endswith(":handoff") and n for k, n in totals.items())
        return self._handed_on

    def _retrying(self, fn: Any) -> Any:
        deadline = time.monotonic() + 30
        while True:
            try:
                return fn()
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def _kill_one(self, cluster: Cluster) -> None:
        busy = [w for w in self.workers if w.alive() and all(w is not f for f, _ in self.frozen)]
        if not busy:
            return
        victim = self.rng.choice(busy)
        victim.kill()
        self.killed.add(victim.pid)
        self.chaos.worker_kills += 1
        self.chaos.events.append(f"killed worker {victim.pid}")

    def _hand_off_one(self, store: Store) -> bool:
        """SIGTERM the worker holding the most leases, as a deploy does — to the process
        alone or to its process group, in turn: it must hand every stream on and exit 0
        within the grace period. False (try again soon) while no worker streams."""
        busy = [w for w in self.workers if w.alive() and all(w is not f for f, _ in self.frozen)]
        held: dict[int, int] = {}
        try:
            for job_id in store.in_state("running", limit=1000):
                pid = holder_pid(store.get(job_id).lease_token)
                if pid is not None:
                    held[pid] = held.get(pid, 0) + 1
        except Exception:  # Redis restarting: any worker will do
            held = {}
        # Not one already handing off: a second signal is a cold stop.
        busy = [w for w in busy if held.get(w.pid) and w.pid not in self.handed_off]
        if not busy:
            return False
        victim = max(busy, key=lambda w: (held[w.pid], self.rng.random()))
        if self.chaos.worker_handoffs % 2:
            os.killpg(victim.pid, signal.SIGTERM)
        else:
            os.kill(victim.pid, signal.SIGTERM)
        self.handed_off[victim.pid] = time.monotonic() + HANDOFF_GRACE_S
        self.chaos.worker_handoffs += 1
        self.chaos.events.append(f"SIGTERM to worker {victim.pid}, holding {held[victim.pid]}")
        return True

    def _unclean_handoff_events(self) -> list[str]:
        """What the soak did to each worker whose handoff was unclean (its SIGTERM, a
        freeze, how it ended), to tell the worker's fault from the soak's."""
        names = re.compile(rf"\bworker ({'|'.join(map(str, self.chaos.unclean_pids))})\b")
        return [e for e in self.chaos.events if self.chaos.unclean_pids and names.search(e)]

    def _freeze_one(self) -> None:
        # Not a worker handing off: frozen for longer than the handoff's grace, it could not
        # exit in time, and the check of handoffs would count the freeze against it.
        candidates = [
            w
            for w in self.workers
            if w.alive()
            and all(w is not f for f, _ in self.frozen)
            and w.pid not in self.handed_off
        ]
        if len(candidates) < 2:
            return
        victim = self.rng.choice(candidates)
        victim.signal_group(signal.SIGSTOP)
        thaw_at = time.monotonic() + self.config.lease_ttl_ms / 1000 * 2
        self.frozen.append((victim, thaw_at))
        self.chaos.worker_freezes += 1
        self.chaos.events.append(f"froze worker {victim.pid}")

    def _thaw(self, now: float) -> None:
        for proc, at in list(self.frozen):
            if now >= at:
                proc.signal_group(signal.SIGCONT)
                self.frozen.remove((proc, at))

    def _worker(self, cluster: Cluster) -> Proc:
        """Start a worker process arming the next failpoint in turn."""
        p = self.config.failpoint_probability
        point = ARMING_ORDER[len(self.spawned) % len(ARMING_ORDER)] if p > 0 else None
        env = cluster.env  # the cluster's environment, for this one worker plus its failpoint
        if point is not None:
            cluster.env = {**env, "RESUMEQ_FAILPOINTS": f"{point}={p}"}
        try:
            proc = cluster.worker()
        finally:
            cluster.env = env
        self.spawned.append((proc, point))
        return proc

    def _respawn(self, cluster: Cluster) -> None:
        for proc in list(self.workers):
            grace = self.handed_off.get(proc.pid)
            if grace is not None and proc.alive() and time.monotonic() > grace:
                self.chaos.handoffs_unclean += 1
                self.chaos.unclean_pids.add(proc.pid)
                self.chaos.events.append(f"worker {proc.pid} still running after its SIGTERM")
                proc.kill()
                self.killed.add(proc.pid)
            if not proc.alive():
                # A worker signalled while it was still starting, before it ran anything, ends
                # as SIGTERM's default: nothing to hand on. One that hit its failpoint while
                # handing on (a handoff's release is a commit too) exits 137, and one the soak
                # killed meanwhile (a deploy escalating to SIGKILL) ends -9: that is chaos.
                ended = proc.popen.returncode
                if (
                    grace is not None
                    and ended not in (0, -signal.SIGTERM, 137)
                    and proc.pid not in self.killed
                ):
                    self.chaos.handoffs_unclean += 1
                    self.chaos.unclean_pids.add(proc.pid)
                    self.chaos.events.append(f"worker {proc.pid} ended its handoff with {ended}")
                if proc.pid not in self.killed and grace is None:
                    self.chaos.worker_exits += 1
                    self.chaos.events.append(
                        f"worker {proc.pid} exited by itself: {proc.popen.returncode}"
                    )
                self.workers.remove(proc)
                self.workers.append(self._worker(cluster))

    def _settle(self, cluster: Cluster, store: Store, ids: list[str]) -> None:
        """Until every job ended. Workers that end meanwhile (a failpoint ends the process,
        with every stream it runs) are replaced, as their supervisor would."""
        deadline = time.monotonic() + self.config.settle_timeout_s
        pending = set(ids)
        while pending and time.monotonic() < deadline:
            self._respawn(cluster)
            for job_id in list(pending):
                try:
                    state = store.get(job_id).state.value
                except Exception:
                    continue
                if state in TERMINAL:
                    pending.discard(job_id)
            time.sleep(0.5)

    def _settle_hooks(self, cluster: Cluster, store: Store, ids: list[str]) -> None:
        """Wait until every done job that names the hook has a run, no outbox is pending and
        the queue is empty (or ``HOOK_SETTLE_S`` has passed)."""
        deadline = time.monotonic() + HOOK_SETTLE_S
        expected = {job_id for n, job_id in enumerate(ids) if _expects_hook(store, n, job_id)}
        # The soak's specs name no queue: every job, and every hook, is on the default one.
        queue = rq_queue(self._retrying(lambda: store.get(ids[0]).queue), store.redis)
        while time.monotonic() < deadline:
            self._respawn(cluster)
            try:
                if (
                    expected <= set(_hook_runs(store))
                    and not store.outbox_pending(0)
                    and queue.count == 0
                ):
                    return
            except Exception:
                pass  # Redis busy restarting: ask again
            time.sleep(0.25)

    def _verify(
        self, store: Store, fake: FakeProvider, ids: list[str], logs: str
    ) -> dict[str, Any]:
        journal = fake.journal()
        by_job: dict[str, list[dict[str, Any]]] = {}
        for entry in journal:
            for m in (entry["body"] or {}).get("messages", []):
                found = re.search(r"Soak job (\d+):", str(m.get("content")))
                if found:
                    by_job.setdefault(found.group(1), []).append(entry)
                    break
        counts: dict[str, int] = dict.fromkeys(
            ("terminal", "done", "canonical", "lost", "gap", "duplicated_text",
             "inconsistent_events", "over_billed", "over_billed_without_worker_death"),
            0,
        )  # fmt: skip
        excess_max = cuts_total = 0
        for n, job_id in enumerate(ids):
            requests = by_job.get(str(n), [])
            for outcome in self._check_job(store, fake, job_id, _prompt(n), requests):
                counts[outcome] += 1
            cuts_total += max(0, len(requests) - 1)
            excess_max = max(excess_max, self._excess.get(job_id, 0))
        refused = len(re.findall(r"stopped, .*no longer holds the lease", logs))
        kills = self._commit_kills()
        return {
            "jobs": len(ids),
            **counts,
            **self._check_hooks(store, ids),
            "fenced_writes_refused": refused,
            "worker_kills": self.chaos.worker_kills,
            "commit_kills": sum(kills.values()),
            **{f"kills_{point}": kills[point] for point in failpoints.NAMES},
            "worker_exits": self.chaos.worker_exits,
            "worker_freezes": self.chaos.worker_freezes,
            "worker_handoffs": self.chaos.worker_handoffs,
            "handoffs_unclean": self.chaos.handoffs_unclean,
            "unclean_handoff_events": self._unclean_handoff_events(),
            "handed_off_attempts": sum(
                1 for j in ids for a in store.ledger(j) if a.get("outcome") == "handoff"
            ),
            "redis_restarts": self.chaos.redis_restarts,
            "failovers": self.chaos.failovers,
            "failover_s": self.chaos.failover_s,
            "durability": self.config.durability,
            "faults_injected": sum(1 for r in journal if r.get("fault")),
            "requests": len(journal),
            "cuts": cuts_total,
            "output_tokens_billed": sum(r["output_tokens_billed"] for r in journal),
            "billed_excess_max_tokens": excess_max,
            "flush_tokens": self.config.flush_tokens,
        }

    def _check_job(
        self,
        store: Store,
        fake: FakeProvider,
        job_id: str,
        prompt: str,
        requests: list[dict[str, Any]],
    ) -> list[str]:
        """The categories one job falls in."""
        try:
            record = store.get(job_id)
        except Exception:
            return ["lost"]
        if record.state.value not in TERMINAL:
            return ["lost"]
        out = ["terminal"]
        text = store.text(job_id)
        if not self._events_consistent(
            store, job_id, text, record.spent_output_tokens, record.revision
        ):
            out.append("inconsistent_events")
        if record.state.value == "done":
            out.append("done")
            canonical = fake.canonical_text([{"role": "user", "content": prompt}])
            if text == canonical:
                out.append("canonical")
            else:
                out.append("gap" if canonical.startswith(text) else "duplicated_text")
        billed = sum(r["output_tokens_billed"] for r in requests)
        excess = billed - count_tokens(text)
        self._excess[job_id] = excess
        if excess > max(0, len(requests) - 1) * self.config.flush_tokens:
            out.append("over_billed")
            # A killed or frozen worker stops reading while the provider still writes into
            # its socket: those tokens are billed and never seen. Every other cut is seen
            # by the worker, which keeps all it read: beyond a flush interval is a defect.
            died = any(a.get("cut") == "worker_died" for a in store.ledger(job_id))
            if not died:
                out.append("over_billed_without_worker_death")
        return out

    def _commit_kills(self) -> dict[str, int]:
        """Processes that exited with 137 at a failpoint, by the point their worker armed:
        work horses, from the lines RQ's worker process logs for them, and worker processes
        themselves, were one to commit outside a work horse."""
        kills = dict.fromkeys(failpoints.NAMES, 0)
        for proc, point in self.spawned:
            if point is not None and proc.popen.returncode == 137:
                kills[point] += 1
                self.chaos.events.append(f"{point}: worker {proc.pid} exited")
            for rq_id, status in _HORSE_DIED.findall(proc.output()):
                code = int(status)
                if point is None or not (os.WIFEXITED(code) and os.WEXITSTATUS(code) == 137):
                    continue
                kills[point] += 1
                self.chaos.events.append(f"{point}: work horse of {rq_id} exited")
        return kills

    def _check_hooks(self, store: Store, ids: list[str]) -> dict[str, Any]:
        """Every done job that names the hook had its effect applied exactly once (a hook
        runs at least once; a second run — its worker died after the effect and before the
        run was recorded — carries the same idempotency key and changes nothing), with its
        final text; no other job saw it run."""
        runs = _hook_runs(store)
        effects = {decode(k): decode(v) for k, v in store.redis.hgetall(HOOK_EFFECTS).items()}
        hooked_done = reruns = 0
        found: dict[str, list[str]] = {
            "missing": [],
            "rerun_differed": [],
            "stale": [],
            "unexpected": [],
        }
        for n, job_id in enumerate(ids):
            seen = runs.pop(job_id, [])
            if not _expects_hook(store, n, job_id):
                if seen:
                    found["unexpected"].append(job_id)
                continue
            hooked_done += 1
            reruns += max(0, len(seen) - 1)
            effect = effects.get(idempotency_key(job_id, HOOK))
            if effect is None:
                found["missing"].append(job_id)
            if len({*seen}) > 1:
                found["rerun_differed"].append(job_id)  # a rerun saw another text
            if effect is not None and int(effect) != len(store.text(job_id)):
                found["stale"].append(job_id)
        found["unexpected"] += list(runs)  # runs for jobs the soak never enqueued
        problems = [
            {"job": job_id, "problem": what, **self._hook_trace(store, job_id)}
            for what, jobs in found.items()
            for job_id in jobs
        ]
        return {
            "hooked_done": hooked_done,
            "hook_runs": store.redis.llen(HOOK_RUNS),
            "hook_reruns": reruns,
            "hooks_missing": len(found["missing"]),
            "hooks_rerun_differed": len(found["rerun_differed"]),
            "hooks_stale_text": len(found["stale"]),
            "hooks_unexpected": len(found["unexpected"]),
            **({"hook_problems": problems[:10]} if problems else {}),
        }

    @staticmethod
    def _hook_trace(store: Store, job_id: str) -> dict[str, Any]:
        """What to read when a hook went wrong: its RQ job and the job's ledger."""
        trace: dict[str, Any] = {"hook_rq_job": hook_rq_id(job_id, HOOK)}
        try:
            rq_job = Job.fetch(
                trace["hook_rq_job"], connection=store.redis, serializer=JSONSerializer
            )
        except NoSuchJobError:
            trace["hook_rq_status"] = None
        else:
            status = rq_job.get_status(refresh=False)
            result = rq_job.latest_result()  # a failure's, RQ's registry cleanup's included
            error = result.exc_string if result is not None else None
            trace |= {
                "hook_rq_status": status.value if status else None,
                "hook_rq_worker": rq_job.worker_name,
                "hook_rq_started": str(rq_job.started_at),
                "hook_rq_error": (error or "").strip().splitlines()[-1:],
            }
        trace["ledger"] = [
            {k: a.get(k) for k in ("attempt", "worker", "ended_ms", "outcome", "cut")}
            for a in store.ledger(job_id)
        ]
        return trace

    @staticmethod
    def _events_consistent(store: Store, job_id: str, text: str, spent: int, revision: int) -> bool:
        """Revisions 1..n, text = the deltas in order, spent = the last cumulative count, and
        deltas only while an attempt held the job (between its ``running`` and the next
        state change)."""
        entries: Any = store.redis.xrange(keys.events(job_id))
        revs, deltas, last_spent, running = [], [], 0, False
        for _, raw in entries:
            fields = {decode(k): decode(v) for k, v in raw.items()}
            if "durable" in fields:
                continue  # a replica holds the events up to it: no revision of its own
            revs.append(int(fields["rev"]))
            if "delta" in fields:
                if not running:
                    return False
                deltas.append(fields["delta"])
                last_spent = int(fields["spent"])
            elif "state" in fields:
                running = fields["state"] == "running"
        return (
            revs == list(range(1, revision + 1)) and "".join(deltas) == text and last_spent == spent
        )


def _expects_hook(store: Store, n: int, job_id: str) -> bool:
    """Whether job number ``n`` names the hook and is done."""
    try:
        return _hooked(n) and store.get(job_id).state.value == "done"
    except Exception:
        return False


def _hook_runs(store: Store) -> dict[str, list[int]]:
    """Job id → the text length each run of its hook saw, from the hook's list."""
    runs: dict[str, list[int]] = {}
    for raw in store.redis.lrange(HOOK_RUNS, 0, -1):
        job_id, _, chars = decode(raw).partition("|")
        runs.setdefault(job_id, []).append(int(chars))
    return runs


def run_soak(config: SoakConfig, *, keep: Path | None = None) -> dict[str, Any]:
    """Run the soak in a temporary directory, or in ``keep`` (created), which then holds
    every process's log and the Redis data afterwards."""
    with tempfile.TemporaryDirectory(prefix="resumeq-soak-") as tmp:
        directory = Path(tmp) if keep is None else keep
        directory.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        result = Soak(config, directory).run()
        result["seconds"] = round(time.monotonic() - started, 1)
        return result
