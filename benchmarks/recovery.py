"""Recovery time: SIGKILL a worker mid-stream and time the continuation's first flushed token.

With ``lease_ttl_ms`` (default 3000) and a janitor sweeping every ``--janitor-interval`` (1 s),
each round kills the worker streaming a job — the worker process and its work horse — and
measures the seconds from the kill to the first token the continuation checkpoints. Real
parts throughout: a redis-server, worker and janitor processes, the fake provider over HTTP.
Prints one JSON object with ``median_s`` and ``max_s``.

    python benchmarks/recovery.py [--kills N] [--lease-ttl-ms MS] [--janitor-interval S]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from resumeq.fake import FakeProvider
from resumeq.producer import enqueue_job
from resumeq.store import Store
from resumeq.testing import RedisServer
from resumeq.testing.processes import Cluster, Proc, descendants, wait_for, write_config


def round_trip(store: Store, cluster: Cluster, workers: list[Proc], n: int) -> float:
    spec = {
        "prompt": f"Recovery round {n}",
        "provider": "fake",
        "model": "m",
        "budget_tokens": 4000,
    }
    job_id = enqueue_job(store, store.redis, spec).id
    wait_for(lambda: store.get(job_id).spent_output_tokens >= 40, timeout_s=30, what="tokens")
    token = store.get(job_id).lease_token or ""
    horse_pid = int(token.split(":")[1].rsplit("-", 1)[1])
    victim = next(w for w in workers if horse_pid in _family(w))
    spent = store.get(job_id).spent_output_tokens
    victim.kill()
    killed = time.monotonic()
    workers.remove(victim)
    workers.append(cluster.worker())  # keep the pool at its size

    def resumed() -> bool:
        record = store.get(job_id)
        return record.attempt >= 2 and record.spent_output_tokens > spent

    wait_for(resumed, timeout_s=60, interval_s=0.01, what="the continuation's first flush")
    elapsed = time.monotonic() - killed
    wait_for(lambda: store.get(job_id).state.value == "done", timeout_s=60, what="done")
    return elapsed


def _family(proc: Proc) -> list[int]:
    return [proc.pid, *descendants(proc.pid)]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--lease-ttl-ms", type=int, default=3000)
    parser.add_argument("--janitor-interval", type=float, default=1.0)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    if args.kills < 1 or args.workers < 1:
        parser.error("--kills and --workers must be >= 1")
    with (
        tempfile.TemporaryDirectory(prefix="resumeq-recovery-") as tmp,
        RedisServer() as server,
        FakeProvider(completion_tokens=1500, token_delay_ms=4) as fake,
    ):
        config = write_config(
            Path(tmp) / "resumeq.toml",
            {
                "providers": {"fake": {"kind": "openai", "base_url": fake.openai_base_url}},
                "worker": {"lease_ttl_ms": args.lease_ttl_ms},
                "janitor": {"interval_s": args.janitor_interval},
            },
        )
        cluster = Cluster(Path(tmp), redis_url=server.url, config=config, thread_caches_off=False)
        store = Store.from_url(server.url)
        try:
            workers = [cluster.worker() for _ in range(args.workers)]
            cluster.janitor(interval_s=args.janitor_interval)
            samples = [round_trip(store, cluster, workers, n) for n in range(args.kills)]
        finally:
            cluster.stop()
    print(
        json.dumps(
            {
                "kills": args.kills,
                "lease_ttl_ms": args.lease_ttl_ms,
                "janitor_interval_s": args.janitor_interval,
                "median_s": round(statistics.median(samples), 3),
                "max_s": round(max(samples), 3),
                "min_s": round(min(samples), 3),
                "samples_s": [round(s, 3) for s in samples],
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
