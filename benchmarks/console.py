"""The operator console's pages with many jobs in Redis: do they stay fast without reading
every job?

``--jobs`` jobs (default 10,000) run through real ``resumeq worker`` processes from the fake
provider (a process of its own); ``--spilled`` of them (default 1,000) are cut and spill.
Then one ``resumeq serve`` answers the console's pages — the overview, its live fragment,
the job list (unfiltered, by state, by provider, a later page, a prompt search that matches
nothing and so reads its most), job pages, the spill lane (unfiltered, filtered, a later
page) and the audit log — each ``--requests`` times over real HTTP with a logged-in
session, one at a time.

Side by side, the peer: rq-dashboard over plain RQ holding as many jobs (the finished ones
in their registry with an answer-sized result each, the spilled ones waiting in a queue
nobody serves), its pages timed as a browser needs them (the page, then the JSON its script
fetches): the queues, the workers, the waiting queue's first page, the finished registry's
first and a later page, job pages.

Keys: ``p95_ms`` (every console request together), ``pages`` (p50/p95 per page),
``peer_p95_ms``, ``p95_ratio_vs_peer``; target ``p95_ms`` ≤ 100.

    python benchmarks/console.py [--jobs N] [--spilled N] [--requests N] [--tokens N]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import redis
from _console_peer import DONE_QUEUE, WAITING_QUEUE, populate, start_dashboard
from _harness import FakeProcess, wait_until

from resumeq.producer.enqueue import enqueue_job
from resumeq.producer.ops import stats
from resumeq.store import Store, audit
from resumeq.testing import RedisServer
from resumeq.testing.processes import Cluster, write_config
from resumeq.testing.redis_server import free_port

TOKEN = "console-benchmark-operator"
TARGET_P95_MS = 100.0
TOPICS = (
    "the tides of a northern harbour", "how a canal lock raises a boat", "the ferry timetable",
    "a lighthouse keeper's night", "the river's tributaries", "salt marsh birds",
    "a market town's history", "the weir and its fish ladder", "a pilot boat's crew",
)  # fmt: skip


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--spilled", type=int, default=1_000)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--tokens", type=int, default=120)
    args = parser.parse_args(argv)
    if not 0 <= args.spilled < args.jobs or args.requests < 1:
        parser.error("--spilled must be below --jobs, and --requests at least 1")
    with (
        tempfile.TemporaryDirectory(prefix="resumeq-console-") as tmp_,
        RedisServer() as server,
        RedisServer() as peer_server,
    ):
        tmp = Path(tmp_)
        fake = FakeProcess(
            tmp,
            completion_tokens=args.tokens,
            token_delay_ms=0,
            env={**os.environ, "RESUMEQ_REDIS_URL": server.url},
        )
        with fake:
            result = run(args, tmp, server, peer_server, fake)
    print(json.dumps(result))
    return 0 if result["target_met"] else 1


def run(
    args: argparse.Namespace,
    tmp: Path,
    server: RedisServer,
    peer_server: RedisServer,
    fake: FakeProcess,
) -> dict[str, Any]:
    port, peer_port = free_port(), free_port()
    profile = {"kind": "openai", "base_url": fake.openai_base_url, "counting": "usage"}
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    config = write_config(
        tmp / "resumeq.toml",
        {
            "providers": {"fake": profile, "fake-b": profile},
            "worker": {"flush_tokens": 32, "queues": ["resumeq", "vip"]},
            "server": {"port": port, "tokens": [{"sha256": digest, "role": "operator",
                                                  "name": "bench"}]},
        },
    )  # fmt: skip
    cluster = Cluster(tmp, redis_url=server.url, config=config, thread_caches_off=False)
    store = Store.from_url(server.url)
    try:
        for _ in range(2):
            cluster.worker("resumeq", "vip", concurrency=50)
        cluster.janitor(interval_s=1.0)
        cluster.command("serve")
        base = f"http://127.0.0.1:{port}"
        filled_s = fill(args, store, fake)
        for n in range(300):
            audit.record(store.redis, who="bench", role="operator", action="requeue",
                         jobs=[f"job{n}"], detail="to=vip", via="console")  # fmt: skip
        wait_until(lambda: _up(f"{base}/console/login"), deadline=time.monotonic() + 60,
                   interval_s=0.1, what="resumeq serve")  # fmt: skip
        console = measure_console(base, store, args.requests)
        populate(peer_server.url, finished=args.jobs - args.spilled, waiting=args.spilled,
                 text_chars=700)  # fmt: skip
        start_dashboard(cluster, redis_url=peer_server.url, port=peer_port)
        peer_base = f"http://127.0.0.1:{peer_port}"
        wait_until(lambda: _up(f"{peer_base}/0/data/queues.json"),
                   deadline=time.monotonic() + 60, interval_s=0.2, what="rq-dashboard")  # fmt: skip
        peer = measure_peer(peer_base, redis.Redis.from_url(peer_server.url), args.requests)
    finally:
        cluster.stop()
    p95 = percentile(console["all"], 95)
    peer_p95 = percentile(peer["all"], 95)
    return {
        "jobs": args.jobs,
        "spilled": args.spilled,
        "requests_per_page": args.requests,
        "fill_s": round(filled_s, 1),
        "p95_ms": round(p95, 1),
        "p50_ms": round(percentile(console["all"], 50), 1),
        "pages": console["pages"],
        "peer_p95_ms": round(peer_p95, 1),
        "peer_pages": peer["pages"],
        "p95_ratio_vs_peer": round(p95 / peer_p95, 3),
        "target_p95_ms": TARGET_P95_MS,
        "target_met": p95 <= TARGET_P95_MS,
    }


def _up(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def fill(args: argparse.Namespace, store: Store, fake: FakeProcess) -> float:
    """Run the jobs through the workers: every ``jobs / spilled``-th one is cut and spills."""
    started = time.monotonic()
    every = args.jobs // args.spilled if args.spilled else 0
    fault = {"kind": "disconnect", "after_tokens": 20, "match": "[to-spill]",
             "times": max(args.spilled, 1)}  # fmt: skip
    fake.http.post("/_fake/faults", json=[fault]).raise_for_status()
    rng = random.Random(16)
    spilled = 0
    for n in range(args.jobs):
        topic = TOPICS[n % len(TOPICS)]
        prompt = f"Job {n}: write about {topic}, with {rng.randint(2, 9)} details."
        spec: dict[str, Any] = {
            "prompt": prompt,
            "provider": "fake-b" if n % 3 == 0 else "fake",
            "model": "m",
            "budget_tokens": 1000,
        }
        if every and n % every == 0 and spilled < args.spilled:
            spec["prompt"] += " [to-spill]"
            spec["exit"] = {"on_cut": "spill"}
            spilled += 1
        enqueue_job(store, store.redis, spec, queue="vip" if n % 5 == 0 else "resumeq")

    def settled() -> bool:
        states = stats(store)["states"]
        return bool(states["done"] + states["spilled"] >= args.jobs)

    wait_until(settled, deadline=time.monotonic() + 1800, interval_s=1.0, what="every job")
    return time.monotonic() - started


def measure_console(base: str, store: Store, requests: int) -> dict[str, Any]:
    # The token for /metrics (measured beside the pages: its scrape reads every live job).
    headers = {"Authorization": f"Bearer {TOKEN}"}
    client = httpx.Client(base_url=base, timeout=30, follow_redirects=False, headers=headers)
    login = client.post("/console/login", data={"token": TOKEN})
    assert login.status_code == 303, login.text
    first_jobs = client.get("/console/jobs").text
    first_spill = client.get("/console/spill").text
    job_ids = re.findall(r'data-job-id="([0-9a-f]+)"', first_jobs + first_spill)
    pages: dict[str, Callable[[], str]] = {
        "overview": lambda: "/console",
        "overview_fragment": lambda: "/console?fragment=1",
        "jobs": lambda: "/console/jobs",
        "jobs_done": lambda: "/console/jobs?state=done",
        "jobs_provider": lambda: "/console/jobs?provider=fake-b",
        "jobs_later_page": lambda: "/console/jobs" + _next(first_jobs),
        "jobs_search_nothing": lambda: "/console/jobs?q=no+such+words",
        "job": lambda: f"/console/jobs/{random.choice(job_ids)}",
        "spill": lambda: "/console/spill",
        "spill_filtered": lambda: "/console/spill?reason=on_cut&provider=fake",
        "spill_later_page": lambda: "/console/spill" + _next(first_spill),
        "audit": lambda: "/console/audit",
    }
    measured = _measure(client, pages, requests)
    metrics = _measure(client, {"metrics": lambda: "/metrics"}, requests)
    measured["pages"]["metrics (not a page: apart from p95_ms)"] = metrics["pages"]["metrics"]
    return measured


def _next(html: str) -> str:
    match = re.search(r'rel="next" href="/console/(?:jobs|spill)(\?[^"]+)"', html)
    assert match, "no next page"
    return match.group(1).replace("&amp;", "&")


def measure_peer(base: str, connection: redis.Redis, requests: int) -> dict[str, Any]:
    client = httpx.Client(base_url=base, timeout=30, follow_redirects=True)
    finished = [m.decode() for m in connection.zrange(f"rq:finished:{DONE_QUEUE}", 0, 199)]
    waiting = [m.decode() for m in connection.lrange(f"rq:queue:{WAITING_QUEUE}", 0, 199)]
    ids = finished + waiting
    view = "/0/view/jobs/{q}/{r}/50/asc/{p}"
    data = "/0/data/jobs/{q}/{r}/50/asc/{p}.json"

    def both(page: str, json_: str) -> list[str]:
        return [page, json_]

    def job() -> list[str]:
        job_id = random.choice(ids)
        return both(f"/0/view/job/{job_id}", f"/0/data/job/{job_id}.json")

    pages: dict[str, Callable[[], list[str]]] = {
        "queues": lambda: both("/0/view/queues", "/0/data/queues.json"),
        "workers": lambda: both("/0/view/workers", "/0/data/workers.json"),
        "waiting_queue": lambda: both(
            view.format(q=WAITING_QUEUE, r="queued", p=1),
            data.format(q=WAITING_QUEUE, r="queued", p=1),
        ),
        "finished": lambda: both(
            view.format(q=DONE_QUEUE, r="finished", p=1),
            data.format(q=DONE_QUEUE, r="finished", p=1),
        ),
        "finished_later_page": lambda: both(
            view.format(q=DONE_QUEUE, r="finished", p=20),
            data.format(q=DONE_QUEUE, r="finished", p=20),
        ),
        "job": job,
    }
    return _measure(client, pages, requests)


def _measure(
    client: httpx.Client, pages: dict[str, Callable[[], Any]], requests: int
) -> dict[str, Any]:
    """Each page ``requests`` times, round robin after one warm-up each: ms per answer (a
    list of paths is one page shown: the times add up)."""
    times: dict[str, list[float]] = {name: [] for name in pages}
    for warm in (True, *([False] * requests)):
        for name, path_of in pages.items():
            paths = path_of()
            started = time.perf_counter()
            for path in paths if isinstance(paths, list) else [paths]:
                response = client.get(path)
                assert response.status_code == 200, (path, response.status_code)
            if not warm:
                times[name].append((time.perf_counter() - started) * 1000)
    every = [t for values in times.values() for t in values]
    return {
        "all": every,
        "pages": {
            name: {"p50_ms": round(percentile(v, 50), 1), "p95_ms": round(percentile(v, 95), 1)}
            for name, v in times.items()
        },
    }


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main(sys.argv[1:]))
