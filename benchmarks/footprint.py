"""Redis bytes per finished job ÷ the bytes of its text, before and after the janitor trims
ended jobs' events streams, against plain RQ keeping the same answer as a job result.

``--jobs`` jobs, each a ``--tokens``-token answer from the fake provider, run to the end on
a real resumeq worker (flush every 32 tokens / 250 ms, the defaults); the same jobs run as
the naive baseline on a plain ``rq worker``. A job's bytes are ``MEMORY USAGE`` (every
element sampled) of what it leaves in Redis: resumeq's job hash, text, events stream and
ledger — what it keeps for the retention (7 days by default) — and, apart, the RQ job
hashes and results of its attempts, which RQ keeps for an hour; for the baseline, its RQ
job hash and result (kept for the hour its ``result_ttl`` says). Measured once every job is
done ("before"), then again once a janitor (with ``[store] events_grace_s = 1``) has
trimmed them ("after"). Prints one JSON object; ``bytes_per_finished_job_ratio`` is the
"after" figure (target ≤ 1.5 for 600 tokens).

    python benchmarks/footprint.py [--jobs N] [--tokens N]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis
from _harness import baseline_worker, ended_rq_jobs, enqueue_naive, median, wait_until

from resumeq.fake import FakeProvider
from resumeq.producer.enqueue import enqueue_job
from resumeq.queue.queueing import attempt_rq_id
from resumeq.store import Store, keys
from resumeq.testing import RedisServer
from resumeq.testing.processes import Cluster, write_config

TARGET = 1.5


def spec(n: int, tokens: int) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": f"Job {n}: explain how a harbour works."}],
        "provider": "fake",
        "model": "fake-model",
        "budget_tokens": tokens * 2,
    }


def usage(client: redis.Redis, *names: str) -> int:
    total = 0
    for name in names:
        size = client.memory_usage(name, samples=0)
        total += int(size or 0)
    return total


def rq_keys(rq_id: str) -> tuple[str, str]:
    return f"rq:job:{rq_id}", f"rq:results:{rq_id}"


def breakdown(store: Store, job_id: str) -> dict[str, int]:
    """Bytes of each thing a finished job leaves in Redis."""
    record = store.get(job_id)
    attempts = [k for n in range(1, record.attempt + 1) for k in rq_keys(attempt_rq_id(job_id, n))]
    return {
        "job_hash": usage(store.redis, keys.job(job_id)),
        "text": usage(store.redis, keys.text(job_id)),
        "events": usage(store.redis, keys.events(job_id)),
        "ledger": usage(store.redis, keys.ledger(job_id)),
        "rq_attempt_jobs": usage(store.redis, *attempts),
    }


def resumeq_bytes(store: Store, job_id: str) -> tuple[int, int, int]:
    """(bytes the job keeps for the retention, its RQ attempt jobs' bytes — they expire
    after an hour — and its text's bytes)."""
    parts = breakdown(store, job_id)
    rq = parts.pop("rq_attempt_jobs")
    return sum(parts.values()), rq, len(store.text(job_id).encode())


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10)
    parser.add_argument("--tokens", type=int, default=600)
    parser.add_argument("--timeout-s", type=float, default=180.0)
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.tokens < 1:
        parser.error("need --jobs >= 1 and --tokens >= 1")
    with (
        tempfile.TemporaryDirectory(prefix="resumeq-footprint-") as tmp,
        RedisServer() as server,
        FakeProvider(completion_tokens=args.tokens) as fake,
    ):
        profile = {"kind": "openai", "base_url": fake.openai_base_url}
        config = write_config(
            Path(tmp) / "resumeq.toml",
            {"providers": {"fake": profile}, "store": {"events_grace_s": 1}},
        )
        cluster = Cluster(Path(tmp), redis_url=server.url, config=config, thread_caches_off=False)
        store = Store.from_url(server.url)
        try:
            cluster.worker("resumeq")
            baseline_worker(cluster, "naive")
            ids = [enqueue_job(store, store.redis, spec(n, args.tokens), queue="resumeq").id
                   for n in range(args.jobs)]  # fmt: skip
            naive = [enqueue_naive(store.redis, spec(n, args.tokens), queue="naive", retries=0)
                     for n in range(args.jobs)]  # fmt: skip
            deadline = time.monotonic() + args.timeout_s
            wait_until(
                lambda: (
                    all(store.get(i).state.value == "done" for i in ids)
                    and ended_rq_jobs(store.redis, "naive") == args.jobs
                ),
                deadline=deadline,
                interval_s=0.2,
                what="every job to finish",
            )
            before = [resumeq_bytes(store, i) for i in ids]
            baseline = []
            for rq_id in naive:
                result_text = store.redis.hget(f"rq:job:{rq_id}", "status")
                assert result_text == b"finished", (rq_id, result_text)
                baseline.append(usage(store.redis, *rq_keys(rq_id)))
            cluster.janitor(interval_s=0.5)
            wait_until(
                lambda: store.redis.zcard(keys.ENDED) == 0,
                deadline=deadline,
                interval_s=0.2,
                what="the janitor to trim every ended job's events",
            )
            after = [resumeq_bytes(store, i) for i in ids]
            parts = breakdown(store, ids[0])
            for job_id in ids:  # the text a late follower reads is all still there
                assert store.get(job_id).events_trimmed is not None, job_id
        except TimeoutError:
            print(cluster.logs(), file=sys.stderr)
            raise
        finally:
            cluster.stop()

    def ratio(rows: list[tuple[int, int, int]], *, with_rq: bool = False) -> float:
        return median((kept + (rq if with_rq else 0)) / text for kept, rq, text in rows)

    target = ratio(after)
    out = {
        "jobs": args.jobs,
        "tokens": args.tokens,
        "text_bytes_median": median(text for _, _, text in before),
        "bytes_per_job_before_median": median(kept for kept, _, _ in before),
        "bytes_per_job_after_median": median(kept for kept, _, _ in after),
        "ratio_before_trim": ratio(before),
        "bytes_per_finished_job_ratio": target,
        "bytes_of_one_job_after": parts,
        # the first hour, while RQ keeps the attempts' jobs and results (both sides)
        "first_hour_ratio_before_trim": ratio(before, with_rq=True),
        "rq_baseline_first_hour_ratio": median(
            b / t for b, (_, _, t) in zip(baseline, before, strict=True)
        ),
        "target_ratio_max": TARGET,
        "target_met": target <= TARGET,
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
