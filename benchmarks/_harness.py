"""What the benchmarks share: plain RQ workers for the baseline, enqueueing its jobs, the
fake provider's journal totals, Redis command counts and process memory.

Everything here starts real processes and leaves stopping them to the caller's ``Cluster``
(they are appended to ``cluster.procs``, stopped by PID).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import redis
from rq import Queue, Retry
from rq.registry import FailedJobRegistry, FinishedJobRegistry
from rq.serializers import JSONSerializer

from resumeq.testing.processes import Cluster, Proc, descendants

BENCH_DIR = Path(__file__).resolve().parent
NAIVE_FUNC = "_baseline.naive_attempt"

#: Example prices per million tokens (input, cached input, output).
PRICES = {"input": 3.0, "cached_input": 0.3, "output": 15.0}


def baseline_worker(cluster: Cluster, queue: str) -> Proc:
    """A plain ``rq worker`` (forking, JSON serializer) that imports ``_baseline`` once, as
    its settings module (``-c``), so work horses inherit it instead of importing it per job
    (what a careful RQ user does)."""
    path = os.pathsep.join(p for p in (str(BENCH_DIR), cluster.env.get("PYTHONPATH")) if p)
    env = {**cluster.env, "PYTHONPATH": path}
    url = cluster.env["RESUMEQ_REDIS_URL"]
    log = cluster.directory / f"baseline-{len(cluster.procs)}.log"
    args = [sys.executable, "-m", "rq.cli", "worker", "-c", "_baseline", "-S", "json", "-u", url]
    args.append(queue)
    proc = Proc(args, env=env, log=log)
    cluster.procs.append(proc)
    return proc


def enqueue_naive(
    connection: redis.Redis, spec: Mapping[str, Any], *, queue: str, retries: int
) -> str:
    """Enqueue one naive job with ``Retry(max=retries)`` (no interval: a cut replays at once)."""
    q = Queue(queue, connection=connection, serializer=JSONSerializer)
    options: dict[str, Any] = {"job_timeout": -1, "result_ttl": 3600, "failure_ttl": 3600}
    if retries > 0:
        options["retry"] = Retry(max=retries)
    job = q.enqueue(NAIVE_FUNC, dict(spec), **options)
    return str(job.id)


def ended_rq_jobs(connection: redis.Redis, queue: str) -> int:
    """Finished plus failed RQ jobs of ``queue`` (two ZCARDs; no registry cleanup)."""
    finished = FinishedJobRegistry(queue, connection=connection, serializer=JSONSerializer)
    failed = FailedJobRegistry(queue, connection=connection, serializer=JSONSerializer)
    with connection.pipeline(transaction=False) as pipe:
        pipe.zcard(finished.key)
        pipe.zcard(failed.key)
        a, b = pipe.execute()
    return int(a) + int(b)


def wait_until(
    predicate: Callable[[], bool], *, deadline: float, interval_s: float, what: str
) -> None:
    """Poll until ``predicate`` holds; raise once ``time.monotonic()`` passes ``deadline``."""
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"benchmark timed out waiting for {what}")
        time.sleep(interval_s)


def journal_totals(entries: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """What the fake provider billed, over generation requests only."""
    totals = {"requests": 0, "output": 0, "input": 0, "cached_input": 0, "cut": 0}
    for e in entries:
        if e["path"] not in ("/v1/chat/completions", "/v1/messages"):
            continue
        totals["requests"] += 1
        totals["output"] += int(e["output_tokens_billed"])
        totals["input"] += int(e["input_tokens_billed"])
        totals["cached_input"] += int(e["cached_input_tokens"])
        totals["cut"] += e["fault"] is not None
    return totals


def money(input_tokens: int, cached_input: int, output: int) -> float:
    """Dollars at :data:`PRICES` (``input_tokens`` includes the cached part)."""
    uncached = input_tokens - cached_input
    cost = uncached * PRICES["input"] + cached_input * PRICES["cached_input"]
    return (cost + output * PRICES["output"]) / 1e6


def command_calls(connection: redis.Redis) -> dict[str, int]:
    """Redis commands served so far, by command (``INFO commandstats``)."""
    stats = connection.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


def calls_between(before: Mapping[str, int], after: Mapping[str, int]) -> dict[str, int]:
    out = {k: v - before.get(k, 0) for k, v in after.items()}
    return {k: v for k, v in out.items() if v > 0}


def pss_kb(pid: int) -> int:
    """Proportional set size of one process (shared pages split among their sharers)."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    return 0


def family(pid: int) -> list[int]:
    return [pid, *descendants(pid)]


def median(values: Iterable[float], digits: int = 3) -> float:
    return round(statistics.median(list(values)), digits)
