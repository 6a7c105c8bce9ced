"""The chaos soak: many jobs, workers killed and frozen, provider faults, a Redis restart —
then a check that nothing was lost, nothing spliced twice, and no replay was paid for.

Real parts throughout: a redis-server with AOF (``appendfsync always``), worker and janitor
processes, the fake provider over HTTP with seeded random faults. ``benchmarks/chaos.py``
runs the long version; the test suite runs a short one.
"""

from __future__ import annotations

import random
import re
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from resumeq import keys
from resumeq.client import Client
from resumeq.fake import FakeProvider, count_tokens
from resumeq.store import Store, decode
from resumeq.testing.processes import Cluster, Proc, write_config
from resumeq.testing.redis_server import RedisServer

TERMINAL = {"done", "failed", "cancelled", "abandoned", "dropped"}
FAULT_KINDS = ("disconnect", "truncate", "malformed", "error_event", "stall", "status")


@dataclass
class SoakConfig:
    jobs: int = 300
    workers: int = 4
    duration_s: float = 300.0
    fault_probability: float = 0.2
    kill_every_s: float = 4.0
    freeze_every_s: float = 25.0
    redis_restarts: int = 1
    completion_tokens: int = 160
    token_delay_ms: float = 2.0
    flush_tokens: int = 16
    lease_ttl_ms: int = 2000
    seed: int = 7
    settle_timeout_s: float = 240.0


@dataclass
class Chaos:
    """What the soak did to the system."""

    worker_kills: int = 0
    worker_freezes: int = 0
    redis_restarts: int = 0
    events: list[str] = field(default_factory=list)


def _prompt(n: int) -> str:
    return f"Soak job {n}: describe a coastline, its birds and its weather."


class Soak:
    def __init__(self, config: SoakConfig, directory: Path) -> None:
        self.config = config
        self.directory = directory
        self.rng = random.Random(config.seed)
        self.chaos = Chaos()
        self.workers: list[Proc] = []
        self.frozen: list[tuple[Proc, float]] = []
        self._excess: dict[str, int] = {}

    def run(self) -> dict[str, Any]:
        c = self.config
        with (
            RedisServer(appendonly=True, directory=self.directory / "redis") as server,
            FakeProvider(
                completion_tokens=c.completion_tokens, token_delay_ms=c.token_delay_ms
            ) as fake,
        ):
            fake.chaos(
                probability=c.fault_probability,
                kinds=list(FAULT_KINDS),
                seed=c.seed,
                status=503,
                seconds=3.0,
            )
            config = self._config(fake)
            cluster = Cluster(self.directory, redis_url=server.url, config=config)
            store = Store.from_url(server.url)
            try:
                self.workers = [cluster.worker() for _ in range(c.workers)]
                cluster.janitor(interval_s=0.5)
                cluster.janitor(interval_s=0.7)
                ids = self._drive(cluster, server, store)
                self._settle(store, ids)
                logs = cluster.logs(tail=None)
            finally:
                cluster.stop()
            return self._verify(store, fake, ids, logs)

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
                },
                "janitor": {"interval_s": 0.5},
            },
        )

    def _drive(self, cluster: Cluster, server: RedisServer, store: Store) -> list[str]:
        """Enqueue the jobs over the first part of the run while breaking things."""
        c = self.config
        client = Client(store.redis)
        start = time.monotonic()
        enqueue_window = c.duration_s * 0.6
        restarts_at = [
            c.duration_s * (i + 1) / (c.redis_restarts + 1) for i in range(c.redis_restarts)
        ]
        next_kill = start + c.kill_every_s
        next_freeze = start + c.freeze_every_s / 2
        ids: list[str] = []
        while True:
            now = time.monotonic()
            elapsed = now - start
            due = min(c.jobs, int(c.jobs * min(1.0, elapsed / enqueue_window)) + 1)
            while len(ids) < due:
                spec = {
                    "prompt": _prompt(len(ids)),
                    "provider": "soak",
                    "model": "soak-model",
                    "budget_tokens": 4 * c.completion_tokens,
                    "exit": {"max_attempts": 50},
                }
                ids.append(self._retrying(lambda spec=spec: client.enqueue(spec)))
            if now >= next_kill:
                self._kill_one(cluster)
                next_kill = now + c.kill_every_s * self.rng.uniform(0.5, 1.5)
            if now >= next_freeze:
                self._freeze_one()
                next_freeze = now + c.freeze_every_s * self.rng.uniform(0.5, 1.5)
            self._thaw(now)
            if restarts_at and elapsed >= restarts_at[0]:
                restarts_at.pop(0)
                server.restart()
                self.chaos.redis_restarts += 1
                self.chaos.events.append(f"{elapsed:.1f}s redis restarted")
            self._respawn(cluster)
            if elapsed >= c.duration_s and len(ids) >= c.jobs:
                break
            time.sleep(0.05)
        for proc, _ in self.frozen:
            proc.signal_group(signal.SIGCONT)
        self.frozen.clear()
        return ids

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
        self.chaos.worker_kills += 1
        self.chaos.events.append(f"killed worker {victim.pid}")

    def _freeze_one(self) -> None:
        candidates = [
            w for w in self.workers if w.alive() and all(w is not f for f, _ in self.frozen)
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

    def _respawn(self, cluster: Cluster) -> None:
        for proc in list(self.workers):
            if not proc.alive():
                self.workers.remove(proc)
                self.workers.append(cluster.worker())

    def _settle(self, store: Store, ids: list[str]) -> None:
        deadline = time.monotonic() + self.config.settle_timeout_s
        pending = set(ids)
        while pending and time.monotonic() < deadline:
            for job_id in list(pending):
                try:
                    state = store.get(job_id).state.value
                except Exception:
                    continue
                if state in TERMINAL:
                    pending.discard(job_id)
            time.sleep(0.5)

    def _verify(
        self, store: Store, fake: FakeProvider, ids: list[str], logs: str
    ) -> dict[str, Any]:
        journal = fake.journal()
        by_job: dict[str, list[dict[str, Any]]] = {}
        for entry in journal:
            for m in entry["body"].get("messages", []):
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
        return {
            "jobs": len(ids),
            **counts,
            "fenced_writes_refused": refused,
            "worker_kills": self.chaos.worker_kills,
            "worker_freezes": self.chaos.worker_freezes,
            "redis_restarts": self.chaos.redis_restarts,
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

    @staticmethod
    def _events_consistent(store: Store, job_id: str, text: str, spent: int, revision: int) -> bool:
        """Revisions 1..n, text = the deltas in order, spent = the last cumulative count, and
        deltas only while an attempt held the job (between its ``running`` and the next
        state change)."""
        entries: Any = store.redis.xrange(keys.events(job_id))
        revs, deltas, last_spent, running = [], [], 0, False
        for _, raw in entries:
            fields = {decode(k): decode(v) for k, v in raw.items()}
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


def run_soak(config: SoakConfig) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="resumeq-soak-") as tmp:
        started = time.monotonic()
        result = Soak(config, Path(tmp)).run()
        result["seconds"] = round(time.monotonic() - started, 1)
        return result
