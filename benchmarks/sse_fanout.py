"""SSE fan-out: one ``resumeq serve`` process, many followers on live jobs.

``--jobs`` jobs stream from the fake provider (a process of its own; ``--tokens`` tokens at
``--token-delay-ms``, some cut by chaos and resumed) through one ``resumeq worker``, and
``--followers-per-job`` followers of each read ``GET /v1/jobs/{id}/events`` over real
sockets, connected before the jobs start. Side by side, the peer: the same number of
followers reading Redis on their own (``AsyncClient.follow``, one blocking XREAD loop each,
what a web app without the service would do), on the same jobs run again.

Keys: ``followers``; ``exact`` (followers whose text equals the job's canonical text);
``p99_delivery_ms`` (from the event's write to Redis — its stream entry's time — to the
follower reading it, over every delta of every follower); ``kb_per_follower`` (the
server's RSS growth, at its peak while streaming, over its RSS before the followers
connected, ÷ followers); ``redis_xread_per_delivered_event`` for the service and for the
peer, and their ratio. Targets: exact = followers, p99_delivery_ms ≤ 100,
kb_per_follower ≤ 100.

    python benchmarks/sse_fanout.py [--jobs N] [--followers-per-job N] [--tokens N]
        [--token-delay-ms D] [--cut-probability P]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis
from _harness import FakeProcess, command_calls, cpu_s, wait_until

from resumeq.producer.async_client import AsyncClient
from resumeq.producer.enqueue import enqueue_job
from resumeq.store import Store, keys
from resumeq.testing import RedisServer
from resumeq.testing.processes import Cluster, Proc, write_config
from resumeq.testing.redis_server import free_port

ENDED = {"done", "failed", "abandoned", "spilled", "cancelled", "dropped"}


@dataclass
class Follower:
    job_id: str
    text: list[str] = field(default_factory=list)
    #: (revision, receive time in ms) of each delta.
    received: list[tuple[int, float]] = field(default_factory=list)
    ended: bool = False
    error: str = ""


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def follow_sse(port: int, f: Follower, connected: asyncio.Event) -> None:
    """A follower as lean as a browser's EventSource: a raw socket, HTTP/1.1 chunked
    decoding and SSE parsing by hand (an HTTP client library here would spend more CPU
    than the server being measured, on the same two cores)."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            f"GET /v1/jobs/{f.job_id}/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            "Accept: text/event-stream\r\n\r\n".encode()
        )
        status = await reader.readline()
        if b" 200 " not in status:
            raise RuntimeError(status.decode().strip())
        while (await reader.readline()) not in (b"\r\n", b""):
            pass  # the headers (chunked: uvicorn streams so)
        pending = ""
        while not f.ended:
            size = int((await reader.readline()).strip() or b"0", 16)
            if size == 0:
                break
            chunk = (await reader.readexactly(size + 2))[:-2].decode()
            at = time.time() * 1000
            pending += chunk
            *blocks, pending = pending.split("\n\n")
            for block in blocks:
                _take(f, block, at, connected)
        writer.close()
    except Exception as exc:  # reported, not raised: one follower's failure is a finding
        f.error = repr(exc)
        connected.set()


def _take(f: Follower, block: str, at: float, connected: asyncio.Event) -> None:
    fields = dict(line.split(": ", 1) if ": " in line else (line, "") for line in block.split("\n"))
    if block.startswith(":"):
        connected.set()
    elif fields.get("event") == "delta":
        data = json.loads(fields["data"])
        f.received.append((data["revision"], at))
        f.text.append(data["text"])
    elif fields.get("event") == "end":
        f.ended = True


async def follow_redis(client: AsyncClient, f: Follower) -> None:
    try:
        async for delta in client.follow(f.job_id):
            f.received.append((delta.revision, time.time() * 1000))
            f.text.append(delta.text)
        f.ended = True
    except Exception as exc:
        f.error = repr(exc)


class Run:
    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.args = args
        self.tmp = tmp

    def jobs(self, store: Store, tag: str, queue: str) -> list[tuple[str, str]]:
        out = []
        for n in range(self.args.jobs):
            prompt = f"Fan-out {tag} job {n}: the harbour log, hour by hour."
            spec = {
                "prompt": prompt,
                "provider": "fake",
                "model": "m",
                "budget_tokens": self.args.tokens * 2,
                "exit": {"max_attempts": 20},
            }
            out.append((enqueue_job(store, store.redis, spec, queue=queue).id, prompt))
        return out


def delivery_ms(store: Store, followers: list[Follower]) -> list[float]:
    """Each delta's delay: its events-stream entry's time (when the flush wrote it) to the
    follower's read."""
    written: dict[tuple[str, int], float] = {}
    for job_id in {f.job_id for f in followers}:
        for entry_id, fields in store.redis.xrange(keys.events(job_id)):
            revision = int(fields[b"rev"])
            written[(job_id, revision)] = float(entry_id.decode().split("-")[0])
    return [
        at - written[(f.job_id, rev)]
        for f in followers
        for rev, at in f.received
        if (f.job_id, rev) in written
    ]


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, round(pct / 100 * len(ordered)) - 1)] if ordered else 0.0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--followers-per-job", type=int, default=10)
    parser.add_argument("--tokens", type=int, default=300)
    parser.add_argument("--token-delay-ms", type=float, default=20.0)
    parser.add_argument("--cut-probability", type=float, default=0.3)
    parser.add_argument("--timeout-s", type=float, default=300.0)
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.followers_per_job < 1 or args.tokens < 1:
        parser.error("--jobs, --followers-per-job and --tokens must be at least 1")
    with tempfile.TemporaryDirectory(prefix="resumeq-fanout-") as tmp_, RedisServer() as server:
        tmp = Path(tmp_)
        env = {"RESUMEQ_REDIS_URL": server.url}
        fake = FakeProcess(
            tmp,
            completion_tokens=args.tokens,
            token_delay_ms=args.token_delay_ms,
            env={**os.environ, **env},
        )
        with fake:
            return run(args, tmp, server, fake)


@dataclass
class Bench:
    args: argparse.Namespace
    tmp: Path
    server: RedisServer
    fake: FakeProcess
    cluster: Cluster
    store: Store
    connection: redis.Redis
    port: int

    @property
    def followers(self) -> int:
        return int(self.args.jobs * self.args.followers_per_job)

    def new_jobs(self, tag: str, queue: str) -> tuple[list[Follower], dict[str, str]]:
        self.fake.reset()
        chaos(self.fake, self.args.cut_probability)  # the same cuts on both sides
        jobs = Run(self.args, self.tmp).jobs(self.store, tag, queue)
        canonical = {job_id: _canonical(self.fake, prompt) for job_id, prompt in jobs}
        each = self.args.followers_per_job
        return [Follower(job_id) for job_id, _ in jobs for _ in range(each)], canonical

    def service(self, serve: Proc) -> dict[str, Any]:
        """Followers of the service connect to queued jobs, then a worker starts them."""
        followers, canonical = self.new_jobs("sse", "resumeq")
        before_rss = rss_kb(serve.pid)
        before_calls = command_calls(self.connection)
        sampler = RssSampler(serve.pid)

        async def side() -> int:
            connected = [asyncio.Event() for _ in followers]
            tasks = [
                asyncio.create_task(follow_sse(self.port, f, e))
                for f, e in zip(followers, connected, strict=True)
            ]
            await asyncio.gather(*(e.wait() for e in connected))
            rss = rss_kb(serve.pid)
            self.cluster.worker("resumeq", concurrency=self.args.jobs)
            await asyncio.wait_for(asyncio.gather(*tasks), self.args.timeout_s)
            return rss

        cpu = (cpu_s(serve.pid), time.process_time(), time.monotonic())
        with sampler:
            connected_rss = asyncio.run(side())
        used = (cpu_s(serve.pid) - cpu[0], time.process_time() - cpu[1], time.monotonic() - cpu[2])
        calls = _calls(before_calls, command_calls(self.connection))
        ids = list(canonical)
        deadline = time.monotonic() + 60
        wait_until(lambda: _ended(self.store, ids), deadline=deadline, interval_s=0.1,
                   what="the jobs to end")  # fmt: skip
        n = self.followers
        return {
            **summarize(self.store, followers, canonical),
            "kb_per_follower": round((sampler.peak - before_rss) / n, 1),
            "kb_per_follower_connected": round((connected_rss - before_rss) / n, 1),
            "server_rss_kb": {
                "before": before_rss,
                "connected": connected_rss,
                "peak": sampler.peak,
            },
            "cpu_s": {
                "server": round(used[0], 2),
                "followers_client": round(used[1], 2),
                "wall": round(used[2], 2),
            },
            "xread_calls": calls,
        }

    def peer(self) -> dict[str, Any]:
        """As many followers, each reading Redis on its own, on the same jobs again."""
        followers, canonical = self.new_jobs("redis", "peer")
        before_calls = command_calls(self.connection)

        async def side() -> None:
            client = AsyncClient.from_url(self.server.url, max_connections=self.followers + 16)
            async with client:
                tasks = [asyncio.create_task(follow_redis(client, f)) for f in followers]
                await asyncio.sleep(1.0)  # every follower blocked in its read
                self.cluster.worker("peer", concurrency=self.args.jobs)
                await asyncio.wait_for(asyncio.gather(*tasks), self.args.timeout_s)

        asyncio.run(side())
        calls = _calls(before_calls, command_calls(self.connection))
        return {**summarize(self.store, followers, canonical), "xread_calls": calls}


class RssSampler:
    """The highest RSS of a process, sampled every 100 ms while in use."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = rss_kb(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self.peak = max(self.peak, rss_kb(self.pid))

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(1)


def run(args: argparse.Namespace, tmp: Path, server: RedisServer, fake: FakeProcess) -> int:
    port = free_port()
    profile = {"kind": "openai", "base_url": fake.openai_base_url,
               "continue_mode": "instruction", "counting": "usage"}  # fmt: skip
    config = write_config(
        tmp / "resumeq.toml",
        {
            "providers": {"fake": profile},
            "worker": {"flush_tokens": 32, "flush_ms": 250},
            "server": {"port": port},
        },
    )
    cluster = Cluster(tmp, redis_url=server.url, config=config, thread_caches_off=False)
    store = Store.from_url(server.url)
    connection = redis.Redis.from_url(server.url)
    bench = Bench(args, tmp, server, fake, cluster, store, connection, port)
    try:
        serve = cluster.command("serve")
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        wait_until(lambda: _up(base), deadline=deadline, interval_s=0.1, what="resumeq serve")
        sse = bench.service(serve)
        peer = bench.peer()
    finally:
        cluster.stop()
        connection.close()
    n = bench.followers
    sse_per_event = sse["xread_calls"] / max(1, sse["events_delivered"])
    peer_per_event = peer["xread_calls"] / max(1, peer["events_delivered"])
    result = {
        "jobs": args.jobs,
        "followers": n,
        **{
            k: sse[k]
            for k in (
                "exact",
                "p99_delivery_ms",
                "p50_delivery_ms",
                "kb_per_follower",
                "kb_per_follower_connected",
                "server_rss_kb",
                "errors",
                "cpu_s",
            )
        },
        "redis_xread_per_delivered_event": round(sse_per_event, 4),
        "peer": {**peer, "redis_xread_per_delivered_event": round(peer_per_event, 4)},
        "xread_ratio_vs_peer": round(sse_per_event / peer_per_event, 4) if peer_per_event else None,
        "targets": {"exact": n, "p99_delivery_ms_max": 100, "kb_per_follower_max": 100},
        "target_met": sse["exact"] == n
        and sse["p99_delivery_ms"] <= 100
        and sse["kb_per_follower"] <= 100,
    }
    print(json.dumps(result))
    return 0


def summarize(store: Store, followers: list[Follower], canonical: dict[str, str]) -> dict[str, Any]:
    delays = delivery_ms(store, followers)
    return {
        "followers": len(followers),
        "exact": sum(1 for f in followers if f.ended and "".join(f.text) == canonical[f.job_id]),
        "errors": sorted({f.error for f in followers if f.error})[:5],
        "events_delivered": sum(len(f.received) for f in followers),
        "p50_delivery_ms": round(percentile(delays, 50), 1),
        "p99_delivery_ms": round(percentile(delays, 99), 1),
    }


def chaos(fake: FakeProcess, probability: float) -> None:
    """The same seeded cuts on both sides (one RNG per conversation)."""
    body = {"chaos": {"probability": probability, "kinds": ["disconnect"], "seed": 5,
                      "scope": "conversation"}}  # fmt: skip
    fake.http.post("/_fake/config", json=body).raise_for_status()


def _calls(before: dict[str, int], after: dict[str, int]) -> int:
    return after.get("xread", 0) - before.get("xread", 0)


def _canonical(fake: FakeProcess, prompt: str) -> str:
    body = {"messages": [{"role": "user", "content": prompt}]}
    response = fake.http.post("/_fake/canonical", json=body)
    response.raise_for_status()
    return str(response.json()["text"])


def _ended(store: Store, job_ids: list[str]) -> bool:
    return all(store.get(j).state.value in ENDED for j in job_ids)


def _up(base: str) -> bool:
    try:
        return httpx.get(f"{base}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
