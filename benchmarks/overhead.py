"""Checkpoint overhead: tokens/s of one worker streaming a long completion at full speed, with
checkpointing (32 tokens / 250 ms) against the same attempt with checkpointing off.

Real parts: a redis-server, resumeq worker processes (forking RQ workers), the fake provider
over HTTP with no delay between tokens. Sides, each its own worker on its own queue, run one
at a time, in rotating order, ``--repeats`` times:

- ``default``: resumeq's worker, flush every 32 tokens or 250 ms (a token-count flush no
  sooner than 20 ms after the last one);
- ``off``: the same worker code with thresholds no stream reaches (one flush, at the end);
- ``every_token``: flush every token (the price of per-token durability);
- ``bare``: a plain RQ job streaming with the same provider client, storing nothing.

A resumeq attempt's time is what its ledger records (acquire to the last flush, in the work
horse); the bare job times itself the same way. ``throughput_ratio`` is the median over
repeats of default ÷ off measured within the same repeat. Prints one JSON object.

``--durability replica`` gives the server a replica and the resumeq sides ``[store]
durability = "replica"`` (each flush waits for the replica: ``WAIT 1``), and adds a side:

- ``primary``: the default thresholds with ``durability = "primary"`` (no wait), beside
  them; ``replica_vs_primary_ratio`` is the median of default ÷ primary: what the wait
  costs a stream.

    python benchmarks/overhead.py [--tokens N] [--repeats N] [--durability replica]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _harness import baseline_worker, ended_rq_jobs, enqueue_naive, median, wait_until
from rq.job import Job
from rq.serializers import JSONSerializer

from resumeq.fake import FakeProvider
from resumeq.producer.enqueue import enqueue_job
from resumeq.store import Store, keys
from resumeq.testing import RedisServer
from resumeq.testing.processes import Cluster, write_config
from resumeq.testing.sentinel import FAST_SYNC, wait_replicated

NEVER = 10**9
SIDES = {  # name: (flush_tokens, flush_ms, flush_min_ms), or None for the bare RQ job
    "default": (32, 250, 20),
    "off": (NEVER, NEVER, 0),
    "every_token": (1, 250, 0),
    "bare": None,
}


def spec(tokens: int) -> dict[str, Any]:
    return {
        "prompt": "Overhead benchmark: one long answer.",
        "provider": "fake",
        "model": "fake-model",
        "budget_tokens": tokens + 1000,
    }


def run_resumeq(store: Store, queue: str, tokens: int, timeout_s: float) -> dict[str, float]:
    started = time.monotonic()
    job_id = enqueue_job(store, store.redis, spec(tokens), queue=queue).id

    def done() -> bool:
        state = store.redis.hget(keys.job(job_id), "state")
        return state is not None and state.decode() in ("done", "failed", "spilled")

    wait_until(done, deadline=started + timeout_s, interval_s=0.02, what=f"job on {queue}")
    end_to_end = time.monotonic() - started
    record = store.get(job_id)
    (attempt,) = store.ledger(job_id)
    if record.state.value != "done" or record.spent_output_tokens != tokens:
        raise RuntimeError(f"{queue}: job ended {record.state.value}, {record.reason}")
    seconds = (attempt["ended_ms"] - attempt["started_ms"]) / 1000
    flushes = sum(1 for _, f in store.redis.xrange(keys.events(job_id)) if b"delta" in f)
    return {"seconds": seconds, "end_to_end_s": end_to_end, "flushes": flushes}


def run_bare(store: Store, tokens: int, timeout_s: float) -> dict[str, float]:
    before = ended_rq_jobs(store.redis, "bare")
    started = time.monotonic()
    rq_id = enqueue_naive(store.redis, spec(tokens), queue="bare", retries=0)
    wait_until(
        lambda: ended_rq_jobs(store.redis, "bare") > before,
        deadline=started + timeout_s,
        interval_s=0.02,
        what="the bare job",
    )
    end_to_end = time.monotonic() - started
    job = Job.fetch(rq_id, connection=store.redis, serializer=JSONSerializer)
    result = job.return_value()
    if not isinstance(result, dict) or result["tokens"] != tokens:
        raise RuntimeError(f"bare job did not finish: {job.get_status()}")
    return {"seconds": result["ended"] - result["started"], "end_to_end_s": end_to_end}


def sides_for(durability: str) -> dict[str, tuple[int, int, int] | None]:
    """The sides run: with replica durability, the default thresholds without the wait
    too (``primary``)."""
    return {**SIDES, "primary": SIDES["default"]} if durability == "replica" else dict(SIDES)


def start_workers(
    clusters: list[Cluster],
    tmp: Path,
    redis_url: str,
    base_url: str,
    *,
    read_pause_ms: int | None = None,
    durability: str = "primary",
) -> None:
    """One worker per side, each with its own config and queue (appended to ``clusters``);
    ``read_pause_ms``: the resumeq sides' ``[worker] read_pause_ms`` (None: the default);
    ``durability``: theirs (the ``primary`` side's is always ``primary``)."""
    profile = {"kind": "openai", "base_url": base_url, "counting": "chunks"}
    for side, flush in sides_for(durability).items():
        directory = tmp / side
        directory.mkdir()
        worker = (
            {"flush_tokens": flush[0], "flush_ms": flush[1], "flush_min_ms": flush[2]}
            if flush
            else {}
        )
        if flush and read_pause_ms is not None:
            worker["read_pause_ms"] = read_pause_ms
        store = {"durability": "primary" if side == "primary" else durability}
        config = write_config(
            directory / "resumeq.toml",
            {"providers": {"fake": profile}, "worker": worker, "store": store},
        )
        cluster = Cluster(directory, redis_url=redis_url, config=config, thread_caches_off=False)
        clusters.append(cluster)
        if flush is None:
            baseline_worker(cluster, "bare")
        else:
            cluster.worker(side, concurrency=1)  # one stream at a time, as the baseline


def run_rounds(store: Store, args: argparse.Namespace) -> dict[str, list[dict[str, float]]]:
    """Every side once per round, in rotating order; round -1 warms up (imports, the
    canonical text) and is not kept."""
    sides = sides_for(args.durability)
    samples: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
    names = list(sides)
    for r in range(-1, args.repeats):
        order = names[r % len(names) :] + names[: r % len(names)]
        for side in order:
            if side == "bare":
                sample = run_bare(store, args.tokens, args.timeout_s)
            else:
                sample = run_resumeq(store, side, args.tokens, args.timeout_s)
            if r >= 0:
                samples[side].append(sample)
    return samples


def summary(args: argparse.Namespace, samples: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    def rate(side: str, i: int) -> float:
        return float(args.tokens / samples[side][i]["seconds"])

    rounds = range(args.repeats)
    result: dict[str, Any] = {
        "tokens": args.tokens,
        "repeats": args.repeats,
        "durability": args.durability,
        "throughput_ratio": median(rate("default", i) / rate("off", i) for i in rounds),
        "target_throughput_ratio_min": 0.90,
        "every_token_ratio": median(rate("every_token", i) / rate("off", i) for i in rounds),
        "default_vs_bare_ratio": median(rate("default", i) / rate("bare", i) for i in rounds),
        "off_vs_bare_ratio": median(rate("off", i) / rate("bare", i) for i in rounds),
    }
    result["target_met"] = result["throughput_ratio"] >= 0.90
    if "primary" in samples:
        result["replica_vs_primary_ratio"] = median(
            rate("default", i) / rate("primary", i) for i in rounds
        )
        result["flushes_primary"] = median(s["flushes"] for s in samples["primary"])
    for side, runs in samples.items():
        result[f"{side}_tokens_per_s"] = round(median(rate(side, i) for i in rounds), 1)
        result[f"{side}_end_to_end_s"] = median(s["end_to_end_s"] for s in runs)
    for side in ("default", "off", "every_token"):
        result[f"flushes_{side}"] = median(s["flushes"] for s in samples[side])
    result["samples_tokens_per_s"] = {
        side: [round(rate(side, i)) for i in rounds] for side in samples
    }
    return result


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--timeout-s", type=float, default=120.0, help="per stream")
    parser.add_argument(
        "--read-pause-ms",
        type=int,
        help="the workers' [worker] read_pause_ms (default: its default)",
    )
    parser.add_argument(
        "--durability",
        choices=("primary", "replica"),
        default="primary",
        help="the resumeq sides' [store] durability; replica starts a replica to wait for",
    )
    args = parser.parse_args(argv)
    if args.tokens < 100 or args.repeats < 1:
        parser.error("need --tokens >= 100 and --repeats >= 1")
    with (
        tempfile.TemporaryDirectory(prefix="resumeq-overhead-") as tmp,
        RedisServer(args=FAST_SYNC) as server,
        RedisServer(args=("--replicaof", "127.0.0.1", str(server.port))) as replica,
        FakeProvider(completion_tokens=args.tokens) as fake,
    ):
        clusters: list[Cluster] = []
        try:
            if args.durability == "replica":
                wait_replicated(replica.port)
            else:
                replica.stop()  # nothing waits for it
            start_workers(
                clusters,
                Path(tmp),
                server.url,
                fake.openai_base_url,
                read_pause_ms=args.read_pause_ms,
                durability=args.durability,
            )
            samples = run_rounds(Store.from_url(server.url), args)
        except (TimeoutError, RuntimeError):
            for cluster in clusters:
                print(cluster.logs(), file=sys.stderr)
            raise
        finally:
            for cluster in clusters:
                cluster.stop()
    print(json.dumps(summary(args, samples)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
