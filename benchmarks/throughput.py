"""Queue throughput: jobs/s of resumeq against plain RQ jobs that stream the same completions
with no checkpointing, and what resumeq costs per job in Redis commands.

Real parts: a redis-server, ``--workers`` resumeq workers and as many plain ``rq worker``
processes (all forking, all alive throughout), the fake provider over HTTP. Each round
enqueues ``--jobs`` jobs of ``--tokens`` tokens on one side and times them from the first
enqueue to the last job ended (detected from RQ's finished/failed registries); the sides
alternate, ``--repeats`` rounds each, and ``jobs_per_s_ratio`` is the median of resumeq ÷
baseline over adjacent rounds. Redis commands per job come from ``INFO commandstats`` over
the round, less the idle workers' background rate and the benchmark's own polling. Prints
one JSON object.

    python benchmarks/throughput.py [--jobs N] [--tokens N] [--workers N] [--repeats N]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _harness import (
    baseline_worker,
    calls_between,
    command_calls,
    ended_rq_jobs,
    enqueue_naive,
    median,
)

from resumeq.fake import FakeProvider
from resumeq.producer.enqueue import enqueue_job
from resumeq.store import Store, keys
from resumeq.testing import RedisServer
from resumeq.testing.processes import Cluster, wait_for, write_config

QUEUES = {"resumeq": "resumeq", "baseline": "naive"}
POLL_S = 0.05


def spec(n: int) -> dict[str, Any]:
    return {
        "prompt": f"Throughput job {n}.",
        "provider": "fake",
        "model": "fake-model",
        "budget_tokens": 200,
    }


class Bench:
    def __init__(self, args: argparse.Namespace, store: Store) -> None:
        self.args = args
        self.store = store
        self.redis = store.redis
        self.background_per_s = 0.0
        self.serial = 0

    def idle_rate(self, seconds: float) -> float:
        """Commands per second that idle workers issue (heartbeats, schedulers, dequeues)."""
        before = sum(command_calls(self.redis).values())
        time.sleep(seconds)
        after = sum(command_calls(self.redis).values())
        return max(0.0, (after - before - 2) / seconds)  # less our own two INFO calls

    def round(self, side: str) -> dict[str, Any]:
        queue, jobs = QUEUES[side], self.args.jobs
        ended_before = ended_rq_jobs(self.redis, queue)
        calls_before = command_calls(self.redis)
        started = time.monotonic()
        ids = []
        for _ in range(jobs):
            self.serial += 1
            if side == "resumeq":
                ids.append(enqueue_job(self.store, self.redis, spec(self.serial)).id)
            else:
                enqueue_naive(self.redis, spec(self.serial), queue=queue, retries=0)
        enqueued = time.monotonic() - started
        polls = 0
        deadline = started + self.args.timeout_s
        while ended_rq_jobs(self.redis, queue) - ended_before < jobs:
            polls += 1
            if time.monotonic() > deadline:
                raise TimeoutError(f"{side}: jobs did not end within {self.args.timeout_s} s")
            time.sleep(POLL_S)
        wall = time.monotonic() - started
        calls = calls_between(calls_before, command_calls(self.redis))
        calls["info"] = calls.get("info", 0) - 1
        calls["zcard"] = calls.get("zcard", 0) - 2 * (polls + 1)
        if side == "resumeq":
            self._check_done(ids)
        own = sum(calls.values()) - self.background_per_s * wall
        return {
            "jobs_per_s": round(jobs / wall, 2),
            "wall_s": round(wall, 3),
            "enqueue_s": round(enqueued, 3),
            "redis_commands_per_job": round(own / jobs, 2),
            "by_command": {k: round(v / jobs, 2) for k, v in sorted(calls.items()) if v > 0},
        }

    def _check_done(self, ids: list[str]) -> None:
        with self.redis.pipeline(transaction=False) as pipe:
            for job_id in ids:
                pipe.hget(keys.job(job_id), "state")
            states = [s.decode() for s in pipe.execute()]
        if states.count("done") != len(ids):
            raise RuntimeError(f"resumeq jobs not all done: {set(states)}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--tokens", type=int, default=50)
    parser.add_argument("--workers", type=int, default=4, help="per side")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=1,
        help="attempts per resumeq worker process (1: as many streams at once as the baseline)",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout-s", type=float, default=300.0, help="per round")
    args = parser.parse_args(argv)
    if min(args.jobs, args.tokens, args.workers, args.repeats) < 1:
        parser.error("every size must be >= 1")
    with (
        tempfile.TemporaryDirectory(prefix="resumeq-throughput-") as tmp,
        RedisServer() as server,
        FakeProvider(completion_tokens=args.tokens) as fake,
    ):
        profile = {"kind": "openai", "base_url": fake.openai_base_url}
        config = write_config(
            Path(tmp) / "resumeq.toml",
            {"providers": {"fake": profile}, "worker": {"flush_tokens": 32, "flush_ms": 250}},
        )
        cluster = Cluster(Path(tmp), redis_url=server.url, config=config, thread_caches_off=False)
        store = Store.from_url(server.url)
        bench = Bench(args, store)
        rounds: dict[str, list[dict[str, Any]]] = {"resumeq": [], "baseline": []}
        try:
            for _ in range(args.workers):
                cluster.worker(QUEUES["resumeq"], concurrency=args.concurrency)
                baseline_worker(cluster, QUEUES["baseline"])
            wait_for(
                lambda: len(store.redis.smembers("rq:workers")) >= 2 * args.workers,
                timeout_s=60,
                what="workers to register",
            )
            bench.background_per_s = bench.idle_rate(3.0)
            for r in range(args.repeats):
                order = ["resumeq", "baseline"] if r % 2 == 0 else ["baseline", "resumeq"]
                for side in order:
                    rounds[side].append(bench.round(side))
        except (TimeoutError, RuntimeError):
            print(cluster.logs(), file=sys.stderr)
            raise
        finally:
            cluster.stop()
    ratios = [
        a["jobs_per_s"] / b["jobs_per_s"]
        for a, b in zip(rounds["resumeq"], rounds["baseline"], strict=True)
    ]
    result: dict[str, Any] = {
        "jobs": args.jobs,
        "tokens_per_job": args.tokens,
        "workers_per_side": args.workers,
        "resumeq_concurrency": args.concurrency,
        "repeats": args.repeats,
        "jobs_per_s_ratio": median(ratios),
        "target_jobs_per_s_ratio_min": 0.80,
        "target_met": median(ratios) >= 0.80,
        "background_commands_per_s": round(bench.background_per_s, 1),
    }
    for side, samples in rounds.items():
        result[side] = {
            "jobs_per_s": median(s["jobs_per_s"] for s in samples),
            "enqueue_s": median(s["enqueue_s"] for s in samples),
            "redis_commands_per_job": median(s["redis_commands_per_job"] for s in samples),
            "by_command": samples[len(samples) // 2]["by_command"],
            "samples_jobs_per_s": [s["jobs_per_s"] for s in samples],
        }
    result["extra_redis_commands_per_job"] = round(
        result["resumeq"]["redis_commands_per_job"] - result["baseline"]["redis_commands_per_job"],
        2,
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
