"""Memory per in-flight stream: total PSS of the worker processes ÷ streams in flight.

``--streams`` forking resumeq workers (``python -m resumeq worker``) each stream one slow
completion from the fake provider (``--token-delay-ms`` between tokens) at the same time.
Once every stream is flowing, the PSS (proportional set size: a page shared by n processes
counts 1/n to each) of every worker process and its work horse is summed. The same is then
measured for plain ``rq worker`` processes running the naive baseline job, for comparison.
Workers are killed by PID at the end of each side (their streams are endless on purpose).
Prints one JSON object.

Two more sides for comparison (skipped with ``--no-baseline``): the naive baseline job on
plain ``rq worker`` processes, and resumeq's attempts on one ``rq worker-pool`` (which forks
its workers from one parent, so they share its imported pages).

    python benchmarks/memory.py [--streams N] [--token-delay-ms MS] [--no-baseline]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _harness import baseline_worker, enqueue_naive, family, pss_kb

from resumeq.fake import FakeProvider
from resumeq.producer import enqueue_job
from resumeq.store import Store
from resumeq.testing import RedisServer
from resumeq.testing.processes import Cluster, Proc, wait_for, write_config


def spec(n: int) -> dict[str, Any]:
    return {
        "prompt": f"Memory benchmark stream {n}.",
        "provider": "fake",
        "model": "fake-model",
        "budget_tokens": 60_000,
    }


def streaming(fake: FakeProvider) -> int:
    """Requests the fake provider is sending tokens for right now."""
    return sum(
        1 for e in fake.journal() if e["outcome"] == "in_progress" and e["tokens_emitted"] >= 3
    )


def start(cluster: Cluster, side: str, streams: int) -> list[Proc]:
    if side == "resumeq":
        return [cluster.worker("resumeq") for _ in range(streams)]
    if side == "baseline":
        return [baseline_worker(cluster, "naive") for _ in range(streams)]
    # rq worker-pool: one parent forks the workers, which share its imported pages.
    url = cluster.env["RESUMEQ_REDIS_URL"]
    args = [sys.executable, "-m", "rq.cli", "worker-pool", "-n", str(streams), "-S", "json"]
    log = cluster.directory / "pool.log"
    proc = Proc([*args, "-u", url, "resumeq"], env=cluster.env, log=log)
    cluster.procs.append(proc)
    return [proc]


def measure(
    fake: FakeProvider, store: Store, cluster: Cluster, side: str, args: argparse.Namespace
) -> dict[str, Any]:
    fake.reset()
    procs = start(cluster, side, args.streams)
    try:
        for n in range(args.streams):
            if side == "baseline":
                enqueue_naive(store.redis, spec(n), queue="naive", retries=0)
            else:
                enqueue_job(store, store.redis, spec(n))
        wait_for(
            lambda: streaming(fake) >= args.streams,
            timeout_s=args.timeout_s,
            interval_s=0.2,
            what=f"{args.streams} {side} streams",
        )
        time.sleep(args.settle_s)  # let every stream run a while (buffers, flushes)
        families = [[pss_kb(pid) for pid in family(p.pid)] for p in procs]
        in_flight = streaming(fake)
    finally:
        for p in procs:
            p.kill()
    total_mb = sum(sum(f) for f in families) / 1024
    out = {
        "processes": sum(len(f) for f in families),
        "streams_in_flight": in_flight,
        "total_pss_mb": round(total_mb, 1),
        "mb_per_stream": round(total_mb / max(in_flight, 1), 2),
    }
    if side != "resumeq_pool":  # a worker and its work horse per stream
        parents = sorted(f[0] for f in families)
        horses = sorted(sum(f[1:]) for f in families)
        out["worker_pss_mb_median"] = round(parents[len(parents) // 2] / 1024, 2)
        out["horse_pss_mb_median"] = round(horses[len(horses) // 2] / 1024, 2)
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=20)
    parser.add_argument("--token-delay-ms", type=float, default=50.0)
    parser.add_argument("--settle-s", type=float, default=3.0)
    parser.add_argument("--timeout-s", type=float, default=120.0)
    parser.add_argument("--no-baseline", action="store_true")
    args = parser.parse_args(argv)
    if args.streams < 1 or args.token_delay_ms <= 0:
        parser.error("need --streams >= 1 and --token-delay-ms > 0")
    with (
        tempfile.TemporaryDirectory(prefix="resumeq-memory-") as tmp,
        RedisServer() as server,
        FakeProvider(completion_tokens=50_000, token_delay_ms=args.token_delay_ms) as fake,
    ):
        profile = {"kind": "openai", "base_url": fake.openai_base_url}
        config = write_config(
            Path(tmp) / "resumeq.toml",
            {"providers": {"fake": profile}, "worker": {"flush_tokens": 32, "flush_ms": 250}},
        )
        cluster = Cluster(Path(tmp), redis_url=server.url, config=config)
        store = Store.from_url(server.url)
        sides = ["resumeq"] if args.no_baseline else ["resumeq", "baseline", "resumeq_pool"]
        results: dict[str, Any] = {}
        try:
            for side in sides:
                results[side] = measure(fake, store, cluster, side, args)
        except TimeoutError:
            print(cluster.logs(), file=sys.stderr)
            raise
        finally:
            cluster.stop()
            fake.reset()
        redis_mb = store.redis.info("memory")["used_memory"] / 2**20
    ours = results["resumeq"]["mb_per_stream"]
    out: dict[str, Any] = {
        "streams": args.streams,
        "token_delay_ms": args.token_delay_ms,
        "mb_per_stream": ours,
        "target_mb_per_stream_max": 40,
        "target_met": ours <= 40,
        "redis_used_memory_mb_after": round(redis_mb, 2),
        **results,
    }
    if "baseline" in results:
        out["vs_baseline"] = round(ours / results["baseline"]["mb_per_stream"], 3)
        out["worker_pool_mb_per_stream"] = results["resumeq_pool"]["mb_per_stream"]
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
