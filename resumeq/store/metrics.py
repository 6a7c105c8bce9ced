"""Cluster-wide numbers for Prometheus (SPEC §18), kept in Redis.

Counters come from the running totals the scripts keep as they write each ledger record
and end each job (:data:`~resumeq.store.keys.TOTALS`, and one hash per provider profile); gauges
are read from the state indexes at scrape time. Two histograms — a flush's round trip, and
the time from a cut to the continuation's first token — are measured by the workers and
added to :data:`~resumeq.store.keys.METRICS` once per attempt, so they too survive any worker and
add up across machines. No job id, user or prompt is ever a label.
"""

from __future__ import annotations

import bisect
import math
import re
import time
from collections.abc import Iterable, Mapping
from typing import Any

import redis

from resumeq.store import SPILL_QUEUE, Store, check_queue, decode, keys, redis_errors

#: Bucket bounds (seconds) of both histograms.
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
FLUSH_LATENCY = "flush_latency"
RESUME_LATENCY = "resume_latency"
HISTOGRAMS = {
    FLUSH_LATENCY: "A checkpoint's round trip to Redis, as the worker waited for it.",
    RESUME_LATENCY: "From a cut (the job back on its queue) to its continuation's first token.",
}
#: What a spill's reason says, as a label (the reason itself is free text).
SPILL_REASONS = (
    ("below the floor", "floor"),
    ("attempts exhausted", "attempts_exhausted"),
    ("no output for", "retry_window"),
    ("byte_exact", "byte_exact"),
    ("requires exact counts", "exact_counts"),
    ("on_cut is", "on_cut"),
    ("tool-use or thinking block", "non_text_block"),
)


class Histogram:
    """Observations of one process, by bucket, until they are added to Redis."""

    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS) + 1)  # the last: above every bound
        self.total_s = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(BUCKETS, seconds)] += 1
        self.total_s += max(0.0, seconds)

    @property
    def count(self) -> int:
        return sum(self.counts)


def record(connection: redis.Redis, histograms: Mapping[str, Histogram]) -> None:
    """Add a process's observations to the cluster-wide histograms (one round trip)."""
    with connection.pipeline(transaction=False) as pipe:
        for name, histogram in histograms.items():
            if not histogram.count:
                continue
            for bound, n in zip((*BUCKETS, math.inf), histogram.counts, strict=True):
                if n:
                    pipe.hincrby(keys.METRICS, f"{name}:le:{_bound(bound)}", n)
            pipe.hincrby(keys.METRICS, f"{name}:count", histogram.count)
            pipe.hincrbyfloat(keys.METRICS, f"{name}:sum", histogram.total_s)
        if pipe.command_stack:
            pipe.execute()


def _bound(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(bound)


def spill_reason(reason: str | None) -> str:
    text = (reason or "").lower()
    return next((label for key, label in SPILL_REASONS if key in text), "other")


# -- the exposition ---------------------------------------------------------------------------


def render(store: Store) -> str:
    """The Prometheus text exposition (format 0.0.4) of every metric;
    :class:`~resumeq.core.errors.RedisUnavailable` when Redis cannot be read. Each provider
    with totals in Redis has its series (at most ``MAX_PROVIDER_SERIES``), whatever the
    serving process's config names: a profile removed from it keeps its counters."""
    with redis_errors("metrics"):
        return _render(store, store.providers())


def _render(store: Store, providers: Iterable[str]) -> str:
    out = _Exposition()
    totals = store.totals()
    per_provider = {p: store.totals(p) for p in sorted(set(providers))}
    _jobs(out, store, totals)
    _by_provider(out, per_provider)
    out.family(
        "resumeq_tokens_billed_total",
        "counter",
        "Tokens the providers billed: input read fresh, input read from the cache, output.",
    )
    for provider, t in per_provider.items():
        billed = {
            "input": t.get("input_tokens_billed", 0) - t.get("cached_input_tokens", 0),
            "cached_input": t.get("cached_input_tokens", 0),
            "output": t.get("output_tokens_billed", 0),
        }
        for kind, n in billed.items():
            out.sample("resumeq_tokens_billed_total", {"provider": provider, "type": kind}, n)
    out.family("resumeq_output_tokens_needed_total", "counter", "Output tokens the answers kept.")
    for provider, t in per_provider.items():
        needed = t.get("output_tokens_persisted", 0)
        out.sample("resumeq_output_tokens_needed_total", {"provider": provider}, needed)
    out.family(
        "resumeq_output_tokens_saved_total",
        "counter",
        "Output tokens a naive replay of every cut would have billed, less those billed.",
    )
    for provider, t in per_provider.items():
        saved = t.get("naive_output_tokens_billed", 0) - t.get("output_tokens_billed", 0)
        out.sample("resumeq_output_tokens_saved_total", {"provider": provider}, max(0, saved))
    _histograms(out, store)
    _spill(out, store)
    out.family(
        "resumeq_lease_expiries_total", "counter", "Attempts whose worker died (a janitor reaped)."
    )
    out.sample("resumeq_lease_expiries_total", {}, totals.get("cuts:worker_died", 0))
    return out.text()


def _by_provider(out: _Exposition, per_provider: Mapping[str, Mapping[str, int]]) -> None:
    """Attempts by kind and outcome, and cuts by cause, of each provider profile."""
    out.family("resumeq_attempts_total", "counter", "Attempts by provider, kind and outcome.")
    for provider, t in per_provider.items():
        for field, n in sorted(t.items()):
            parts = field.split(":")
            if parts[0] == "attempts" and len(parts) == 3:
                labels = {"provider": provider, "kind": parts[1], "outcome": parts[2]}
                out.sample("resumeq_attempts_total", labels, n)
    out.family("resumeq_cuts_total", "counter", "Cuts by provider and cause.")
    for provider, t in per_provider.items():
        for field, n in sorted(t.items()):
            if field.startswith("cuts:"):
                labels = {"provider": provider, "cause": field.removeprefix("cuts:")}
                out.sample("resumeq_cuts_total", labels, n)


def _jobs(out: _Exposition, store: Store, totals: Mapping[str, int]) -> None:
    out.family("resumeq_jobs", "gauge", "Jobs by queue and state (ended ones: since the start).")
    counts: dict[tuple[str, str], int] = {}
    for state, queue in _live_queues(store):
        counts[(queue, state)] = counts.get((queue, state), 0) + 1
    for field, n in totals.items():
        if field.startswith("queue_jobs:"):
            queue, _, state = field.removeprefix("queue_jobs:").rpartition(":")
            counts[(queue, state)] = n
    for (queue, state), n in sorted(counts.items()):
        if _label_safe(queue):
            out.sample("resumeq_jobs", {"queue": queue, "state": state}, n)


def _live_queues(store: Store) -> list[tuple[str, str]]:
    """``(state, queue)`` of every job in a state that is not terminal (the indexes, and
    each job's queue in one pipelined round trip)."""
    indexes = {"queued": keys.QUEUED, "running": keys.RUNNING, "stalled": keys.STALLED,
               "spilled": keys.SPILLED}  # fmt: skip
    members: list[tuple[str, str]] = []
    for state, index in indexes.items():
        members += [(state, decode(m)) for m in store.redis.zrange(index, 0, -1)]
    with store.redis.pipeline(transaction=False) as pipe:
        for _, job_id in members:
            pipe.hget(keys.job(job_id), "queue")
        queues = pipe.execute() if members else []
    return [
        (state, decode(queue))
        for (state, _), queue in zip(members, queues, strict=True)
        if queue is not None
    ]


def _histograms(out: _Exposition, store: Store) -> None:
    raw = {decode(k): decode(v) for k, v in store.redis.hgetall(keys.METRICS).items()}
    for name, help_ in HISTOGRAMS.items():
        family = f"resumeq_{name}_seconds"
        out.family(family, "histogram", help_)
        cumulative = 0
        for bound in (*BUCKETS, math.inf):
            cumulative += int(raw.get(f"{name}:le:{_bound(bound)}", 0))
            out.sample(f"{family}_bucket", {"le": _bound(bound)}, cumulative)
        out.sample(f"{family}_sum", {}, float(raw.get(f"{name}:sum", 0.0)))
        out.sample(f"{family}_count", {}, int(raw.get(f"{name}:count", 0)))


def _spill(out: _Exposition, store: Store) -> None:
    entries: Any = store.redis.zrange(keys.SPILLED, 0, -1, withscores=True)
    with store.redis.pipeline(transaction=False) as pipe:
        for job_id, _ in entries:
            pipe.hget(keys.job(decode(job_id)), "reason")
        reasons = pipe.execute() if entries else []
    depth: dict[str, int] = dict.fromkeys((label for _, label in SPILL_REASONS), 0)
    depth["other"] = 0
    for reason in reasons:
        label = spill_reason(decode(reason) if reason is not None else None)
        depth[label] += 1
    out.family("resumeq_spill_depth", "gauge", f"Jobs waiting on the spill lane ({SPILL_QUEUE}).")
    for label, n in depth.items():
        out.sample("resumeq_spill_depth", {"reason": label}, n)
    oldest = min((score for _, score in entries), default=None)
    age = max(0.0, time.time() - oldest / 1000) if oldest is not None else 0.0
    out.family("resumeq_spill_oldest_age_seconds", "gauge", "How long the oldest spill has waited.")
    out.sample("resumeq_spill_oldest_age_seconds", {}, round(age, 3))


def _label_safe(queue: str) -> bool:
    try:
        check_queue(queue)
    except ValueError:
        return False
    return True


class _Exposition:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_: str) -> None:
        self.lines.append(f"# HELP {name} {help_}")
        self.lines.append(f"# TYPE {name} {kind}")

    def sample(self, name: str, labels: Mapping[str, str], value: float) -> None:
        text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
        self.lines.append(f"{name}{{{text}}} {value}" if text else f"{name} {value}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


_ESCAPES = re.compile(r'[\\"\n]')


def _escape(value: str) -> str:
    return _ESCAPES.sub(lambda m: {"\\": "\\\\", '"': '\\"', "\n": "\\n"}[m.group()], value)


__all__ = ["BUCKETS", "Histogram", "record", "render", "spill_reason"]
