"""Memory per in-flight stream: PSS of the worker processes ÷ streams in flight.

The fake provider (a process of its own) sends every stream one slow completion
(``--token-delay-ms`` between tokens, never ending while measured). Each side starts its
worker processes, waits until they are ready, reads their idle PSS, enqueues its streams,
waits until the fake is sending every one of them, lets them run ``--settle-s``, and reads
PSS again (proportional set size: a page shared by n processes counts 1/n to each). What is
summed is every process of the side, with every process below it: a worker, RQ's
scheduler child, a work horse. Then the side's processes are killed by PID (their streams
are endless on purpose).

- ``mb_per_stream`` = total PSS of the concurrent side's processes (one ``resumeq worker
  --concurrency S`` and every process below it; RQ's scheduler runs on a thread of it, so
  it is inside; nothing subtracted) ÷ the streams the fake was sending when it was read
  (S = ``--streams``, 200: issue 13's definition).
- ``mb_per_stream_above_idle`` = (that PSS - the same processes' PSS when ready and idle,
  before any job) ÷ the same streams: what one more stream costs.
- ``arq_mb_per_stream`` and ``arq_mb_per_stream_above_idle``: the same for arq 0.28
  (``_arq_peer.py``), one process with ``max_jobs`` = S, running the same stream with a
  checkpoint on the same rule (32 tokens or 250 ms), measured in the same run.
- ``mb_per_stream_fork``: the fork model, measured at ``--fork-streams`` (20) streams: one
  ``rq worker -w resumeq.worker.rq_worker.ForkingWorker`` per stream, each forking a work horse.
- ``baseline_mb_per_stream`` (skipped with ``--no-baseline``): the naive job of
  ``_baseline.py`` on plain ``rq worker`` processes, one per stream, at ``--fork-streams``.

The concurrent worker and arq are measured ``--repeats`` times (3), side by side, the
order alternating; the figures are medians, and ``vs_arq`` is the median over the pairs of
``mb_per_stream`` ÷ ``arq_mb_per_stream``. The fork model and the baseline run once.
Targets: ``mb_per_stream`` ≤ 0.5 and ``vs_arq`` ≤ 2. Prints one JSON object.

    python benchmarks/memory.py [--streams 200] [--fork-streams 20] [--repeats 3]
                                [--no-baseline] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import _arq_peer
import redis
from _harness import (
    FakeProcess,
    baseline_worker,
    concurrent_worker,
    enqueue_naive,
    family,
    family_pss_kb,
    forking_worker,
    rq_workers,
    slow_stream_bench,
    wait_until,
)

from resumeq.producer.enqueue import enqueue_job
from resumeq.store import Store
from resumeq.testing.processes import Cluster, Proc

#: One prompt for every stream: the fake plans its (long) completion once.
PROMPT = "Memory benchmark: one long answer, streamed slowly."
QUEUE = "resumeq"
COMPLETION_TOKENS = 50_000
FLUSH = {"flush_tokens": 32, "flush_ms": 250}


def spec() -> dict[str, Any]:
    return {"prompt": PROMPT, "provider": "fake", "model": "fake-model", "budget_tokens": 60_000}


class Side:
    """One way of running S streams: how its processes start, when they are ready, how
    its jobs are enqueued."""

    def __init__(
        self,
        name: str,
        streams: int,
        start: Callable[[], list[Proc]],
        ready: Callable[[list[Proc]], bool],
        enqueue: Callable[[int], None],
    ) -> None:
        self.name, self.streams = name, streams
        self.start, self.ready, self.enqueue = start, ready, enqueue


def sides(
    cluster: Cluster, store: Store, fake: FakeProcess, args: argparse.Namespace
) -> list[Side]:
    r = store.redis
    n, forks = args.streams, args.fork_streams

    def enqueue_resumeq(count: int) -> None:
        for _ in range(count):
            enqueue_job(store, r, spec(), queue=QUEUE)

    def enqueue_arq(count: int) -> None:
        _arq_peer.enqueue(cluster, [f"arq-{i}" for i in range(count)], prompt=PROMPT)

    def enqueue_baseline(count: int) -> None:
        for _ in range(count):
            enqueue_naive(r, spec(), queue="naive", retries=0)

    def forking() -> list[Proc]:
        return [forking_worker(cluster, QUEUE) for _ in range(forks)]

    def registered(count: int) -> Callable[[list[Proc]], bool]:
        return lambda procs: rq_workers(r) >= count

    out = [
        Side(
            "concurrent",
            n,
            lambda: [concurrent_worker(cluster, QUEUE, n)],
            registered(1),
            enqueue_resumeq,
        ),
        Side(
            "arq",
            n,
            lambda: [_arq_peer.start_worker(cluster, base_url=fake.url, max_jobs=n, **FLUSH)],
            lambda procs: _arq_peer.ready(r),
            enqueue_arq,
        ),
        Side("fork", forks, forking, registered(forks), enqueue_resumeq),
    ]
    if not args.no_baseline:
        start = lambda: [baseline_worker(cluster, "naive") for _ in range(forks)]  # noqa: E731
        out.append(Side("baseline", forks, start, registered(forks), enqueue_baseline))
    return out


def measure(
    side: Side, fake: FakeProcess, r: redis.Redis, args: argparse.Namespace
) -> dict[str, Any]:
    r.flushall()
    fake.reset()
    procs = side.start()
    try:

        def ready() -> bool:
            dead = [p for p in procs if not p.alive()]
            if dead:
                raise RuntimeError(f"{side.name}: a process exited: {dead[0].output()[-2000:]}")
            return side.ready(procs)

        wait_until(
            ready,
            deadline=time.monotonic() + args.timeout_s,
            interval_s=0.2,
            what=f"{side.name} workers to be ready",
        )
        time.sleep(args.idle_s)
        idle_kb = sum(family_pss_kb(p.pid) for p in procs)
        side.enqueue(side.streams)
        wait_until(
            lambda: fake.streaming() >= side.streams,
            deadline=time.monotonic() + args.timeout_s,
            interval_s=0.5,
            what=f"{side.streams} {side.name} streams",
        )
        time.sleep(args.settle_s)  # let every stream run a while (buffers, flushes)
        families = [[family_pss_kb(pid) for pid in family(p.pid)] for p in procs]
        in_flight = fake.streaming()
    finally:
        for p in procs:
            p.kill()
    total_mb = sum(sum(f) for f in families) / 1024
    idle_mb = idle_kb / 1024
    return {
        "processes": sum(len(f) for f in families),
        "streams_in_flight": in_flight,
        "idle_pss_mb": round(idle_mb, 1),
        "total_pss_mb": round(total_mb, 1),
        "mb_per_stream": round(total_mb / max(in_flight, 1), 3),
        "mb_per_stream_above_idle": round((total_mb - idle_mb) / max(in_flight, 1), 3),
    }


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--fork-streams", type=int, default=20)
    parser.add_argument("--token-delay-ms", type=float, default=50.0)
    parser.add_argument("--idle-s", type=float, default=2.0)
    parser.add_argument("--settle-s", type=float, default=3.0)
    parser.add_argument("--timeout-s", type=float, default=180.0)
    parser.add_argument("--repeats", type=int, default=3, help="concurrent/arq pairs")
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--quick", action="store_true", help="50 streams, 4 forks, 1 pair")
    args = parser.parse_args(argv)
    if args.quick:
        args.streams, args.fork_streams, args.repeats = 50, 4, 1
    if min(args.streams, args.fork_streams, args.repeats) < 1 or args.token_delay_ms <= 0:
        parser.error("need --streams, --fork-streams, --repeats >= 1 and --token-delay-ms > 0")
    return args


def main(argv: list[str]) -> int:
    args = parse(argv)
    load_before = os.getloadavg()[0]
    with slow_stream_bench(
        "resumeq-memory-",
        token_delay_ms=args.token_delay_ms,
        completion_tokens=COMPLETION_TOKENS,
        prompt=PROMPT,
        worker=FLUSH,
    ) as (cluster, _, fake, store):
        runs: dict[str, list[dict[str, Any]]] = {}
        for i, pair in enumerate([sides(cluster, store, fake, args)] * args.repeats):
            # the concurrent worker and arq side by side, the order alternating; the fork
            # model and the baseline once, after the first pair
            order = pair[:2] if i % 2 == 0 else pair[1::-1]
            for side in [*order, *(pair[2:] if i == 0 else [])]:
                got = measure(side, fake, store.redis, args)
                runs.setdefault(side.name, []).append(got)
                print(f"... {side.name}: {json.dumps(got)}", file=sys.stderr)
    print(json.dumps(summary(runs, args, load_before)))
    return 0


def summary(
    runs: dict[str, list[dict[str, Any]]], args: argparse.Namespace, load_before: float
) -> dict[str, Any]:
    """The medians over repeats; ``vs_arq`` is the median of each pair's ratio."""

    def med(side: str, key: str) -> float:
        return round(statistics.median(r[key] for r in runs[side]), 3)

    pairs = zip(runs["concurrent"], runs["arq"], strict=True)
    ratio = statistics.median(a["mb_per_stream"] / b["mb_per_stream"] for a, b in pairs)
    ours = med("concurrent", "mb_per_stream")
    out: dict[str, Any] = {
        "streams": args.streams,
        "token_delay_ms": args.token_delay_ms,
        "repeats": args.repeats,
        "mb_per_stream": ours,
        "mb_per_stream_above_idle": med("concurrent", "mb_per_stream_above_idle"),
        "arq_mb_per_stream": med("arq", "mb_per_stream"),
        "arq_mb_per_stream_above_idle": med("arq", "mb_per_stream_above_idle"),
        "vs_arq": round(ratio, 3),
        "fork_streams": args.fork_streams,
        "mb_per_stream_fork": runs["fork"][0]["mb_per_stream"],
        "target_mb_per_stream_max": 0.5,
        "target_vs_arq_max": 2.0,
        "target_met": ours <= 0.5 and ratio <= 2.0,
        # Other work on the machine (its 2 cores are shared): the 1-minute load average.
        "load_avg_1m_before": round(load_before, 2),
        "load_avg_1m_after": round(os.getloadavg()[0], 2),
    }
    if "baseline" in runs:
        out["baseline_mb_per_stream"] = runs["baseline"][0]["mb_per_stream"]
    out["runs"] = runs
    return out


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
