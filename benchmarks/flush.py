"""Flush latency with a small and a large stored prefix, against a bare SET.

A flush APPENDs the delta; it never rewrites the prefix, so its cost must not grow with
the prefix. Both prefixes and the SET baseline are measured in the same run, interleaved,
so a noisy machine slows them alike. Prints one JSON object.

    python benchmarks/flush.py [--iterations N] [--delta-bytes B] [--redis-url URL]

Without --redis-url it starts its own redis-server on a free port.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from contextlib import ExitStack

import redis

from resumeq.core.models import Lease
from resumeq.store import Store, keys
from resumeq.testing import RedisServer

SPEC = {"prompt": "benchmark", "provider": "bench", "model": "m", "budget_tokens": 60_000}


def prepared(store: Store, prefix_bytes: int) -> tuple[Lease, int]:
    """A running job whose stored prefix is ``prefix_bytes`` long."""
    job_id = store.create(SPEC).id
    got = store.acquire(job_id, worker="bench", ttl_ms=600_000)
    result = store.flush(
        got.lease, expected_revision=got.record.revision, delta="p" * prefix_bytes, tokens=1
    )
    return got.lease, result.revision


def measure(url: str, iterations: int, delta_bytes: int) -> dict[str, float | int]:
    client = redis.Redis.from_url(url)
    store = Store(client)
    small, small_rev = prepared(store, 1024)
    large, large_rev = prepared(store, 1024 * 1024)
    delta = "d" * delta_bytes
    samples: dict[str, list[float]] = {"small": [], "large": [], "set": []}
    for i in range(iterations + iterations // 10):
        t0 = time.perf_counter()
        small_rev = store.flush(small, expected_revision=small_rev, delta=delta, tokens=32).revision
        t1 = time.perf_counter()
        large_rev = store.flush(large, expected_revision=large_rev, delta=delta, tokens=32).revision
        t2 = time.perf_counter()
        client.set("bench:set", delta)
        t3 = time.perf_counter()
        if i >= iterations // 10:  # the first tenth warms up connections and caches
            samples["small"].append(t1 - t0)
            samples["large"].append(t2 - t1)
            samples["set"].append(t3 - t2)
    med = {k: statistics.median(v) * 1e6 for k, v in samples.items()}
    return {
        "iterations": iterations,
        "delta_bytes": delta_bytes,
        "flush_1kb_median_us": round(med["small"], 1),
        "flush_1mb_median_us": round(med["large"], 1),
        "set_median_us": round(med["set"], 1),
        "ratio": round(med["large"] / med["small"], 3),
        "flush_1kb_vs_set": round(med["small"] / med["set"], 3),
        "flush_1mb_vs_set": round(med["large"] / med["set"], 3),
        "large_prefix_final_bytes": int(client.strlen(keys.text(large.job_id))),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=3000)
    parser.add_argument("--delta-bytes", type=int, default=128)
    parser.add_argument("--redis-url", default=None)
    args = parser.parse_args(argv)
    if args.iterations < 10 or args.delta_bytes < 1:
        parser.error("--iterations must be >= 10 and --delta-bytes >= 1")
    with ExitStack() as stack:
        url = args.redis_url or stack.enter_context(RedisServer()).url
        print(json.dumps(measure(url, args.iterations, args.delta_bytes)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
