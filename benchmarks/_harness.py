"""What the benchmarks share: plain RQ workers for the baseline, enqueueing its jobs, the
fake provider's journal totals, Redis command counts, process memory and CPU, the fake
provider as a process of its own, and the concurrent resumeq worker.

Everything here starts real processes and leaves stopping them to the caller's ``Cluster``
(they are appended to ``cluster.procs``, stopped by PID), or is a context manager that
stops its process by PID on the way out (:class:`FakeProcess`).
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import httpx
import redis
from rq import Queue, Retry
from rq.registry import FailedJobRegistry, FinishedJobRegistry
from rq.serializers import JSONSerializer
from rq.worker_registration import REDIS_WORKER_KEYS

from resumeq.store import Store
from resumeq.testing import RedisServer, free_port
from resumeq.testing.processes import Cluster, Proc, descendants, write_config

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
        # Generation requests (a background response's reads are billed nothing).
        if e["path"] not in ("/v1/chat/completions", "/v1/messages", "/v1/responses"):
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


def family_pss_kb(pid: int) -> int:
    """PSS of a process and every process below it (a worker, its scheduler, its horses)."""
    return sum(pss_kb(p) for p in family(pid))


_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """CPU seconds (user and system, every thread) one process has used, with those of its
    children it has reaped (``/proc/PID/stat`` utime, stime, cutime, cstime); 0 once gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / _TICKS


def family_cpu_s(pid: int) -> float:
    """:func:`cpu_s` of a process and of every live process below it."""
    return sum(cpu_s(p) for p in family(pid))


def concurrent_worker(cluster: Cluster, queue: str, concurrency: int) -> Proc:
    """One ``resumeq worker --concurrency N`` process serving ``queue``."""
    return cluster.command("worker", "--concurrency", str(concurrency), "--queues", queue)


def forking_worker(cluster: Cluster, queue: str) -> Proc:
    """The fork model: RQ's forking worker with resumeq's registry rules (``rq worker -w
    resumeq.worker.rq_worker.ForkingWorker``), one attempt at a time, each in a work horse."""
    url = cluster.env["RESUMEQ_REDIS_URL"]
    args = [
        sys.executable,
        "-m",
        "rq.cli",
        "worker",
        "-w",
        "resumeq.worker.rq_worker.ForkingWorker",
    ]
    args += ["-S", "json", "-u", url, queue]
    proc = Proc(args, env=cluster.env, log=cluster.directory / f"forking-{len(cluster.procs)}.log")
    cluster.procs.append(proc)
    return proc


def rq_workers(connection: redis.Redis) -> int:
    """RQ workers registered (what a worker adds once it is ready to dequeue)."""
    return int(connection.scard(REDIS_WORKER_KEYS))


def worker_load(connection: redis.Redis) -> dict[str, float]:
    """What the concurrent workers publish every second into RQ's hash of each worker
    (``resumeq_in_flight``, ``resumeq_lease_lag_ms``: the worst renewal lateness since it
    started, ``resumeq_cpu_s``), summed over workers (the lag: the worst); {} if none."""
    out: dict[str, float] = {}
    for key in connection.smembers(REDIS_WORKER_KEYS):
        fields = connection.hgetall(key)
        for name in (b"resumeq_in_flight", b"resumeq_lease_lag_ms", b"resumeq_cpu_s"):
            if name in fields:
                field, value = name.decode(), float(fields[name])
                worst = field == "resumeq_lease_lag_ms"
                out[field] = max(out.get(field, 0.0), value) if worst else out.get(field, 0) + value
    return out


class FakeProcess:
    """The fake provider as a process of its own (``python -m resumeq fake-provider`` on a
    free loopback port), so that its CPU neither shares the benchmark's GIL nor counts as
    the benchmark's. Stopped by PID on exit. Its CPU comes from ``/proc`` (:meth:`cpu_s`:
    the whole process, which does nothing but serve) and, where the provider reports it,
    from ``GET /_fake/stats`` (:meth:`stats`: its own threads only)."""

    def __init__(
        self,
        directory: Path,
        *,
        completion_tokens: int,
        token_delay_ms: float,
        env: Mapping[str, str],
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.openai_base_url = f"{self.url}/v1"
        args = [sys.executable, "-m", "resumeq", "fake-provider", "--port", str(self.port)]
        args += ["--completion-tokens", str(completion_tokens)]
        args += ["--token-delay-ms", str(token_delay_ms)]
        self.proc = Proc(args, env=env, log=directory / "fake-provider.log")
        self.http = httpx.Client(base_url=self.url, timeout=60.0)

    def __enter__(self) -> Self:
        try:
            wait_until(self._healthy, deadline=time.monotonic() + 30, interval_s=0.1,
                       what="the fake provider")  # fmt: skip
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()
        self.proc.stop()

    def _healthy(self) -> bool:
        if not self.proc.alive():
            raise RuntimeError(f"the fake provider exited: {self.proc.output()[-2000:]}")
        try:
            return self.http.get("/_fake/health").status_code == 200
        except httpx.TransportError:
            return False

    def journal(self) -> list[dict[str, Any]]:
        response = self.http.get("/_fake/requests")
        response.raise_for_status()
        entries: list[dict[str, Any]] = response.json()
        return entries

    def reset(self) -> None:
        self.http.post("/_fake/reset", json={}).raise_for_status()

    def warm(self, prompt: str) -> None:
        """Have the fake plan ``prompt``'s completion now (``POST /_fake/canonical``): it keeps
        the plan, and streams that start together then do not all plan it at once (a long
        completion takes a few hundred ms of CPU to plan)."""
        body = {"messages": [{"role": "user", "content": prompt}]}
        self.http.post("/_fake/canonical", json=body).raise_for_status()

    def stats(self) -> dict[str, Any] | None:
        """``GET /_fake/stats`` (the provider's own CPU seconds), or None where it has none."""
        with contextlib.suppress(httpx.HTTPError, ValueError):
            response = self.http.get("/_fake/stats")
            if response.status_code == 200:
                stats: dict[str, Any] = response.json()
                return stats
        return None

    def cpu_s(self) -> float:
        return family_cpu_s(self.proc.pid)

    def streaming(self, min_tokens: int = 3) -> int:
        """Requests it is sending tokens for right now (at least ``min_tokens`` out)."""
        return sum(
            1
            for e in self.journal()
            if e["outcome"] == "in_progress" and e["tokens_emitted"] >= min_tokens
        )


@contextlib.contextmanager
def slow_stream_bench(
    prefix: str,
    *,
    token_delay_ms: float,
    completion_tokens: int,
    prompt: str,
    worker: Mapping[str, Any],
) -> Iterator[tuple[Cluster, RedisServer, FakeProcess, Store]]:
    """What the memory and concurrency benchmarks stand on: a redis-server, the fake
    provider as a process of its own sending ``completion_tokens`` per stream with
    ``prompt``'s completion planned ahead, a config naming it (profile ``fake``, the
    ``[worker]`` settings given) and a cluster to start workers in; its processes stopped
    afterwards. A failure prints the cluster's logs."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp, RedisServer() as server:
        directory = Path(tmp)
        config_path = directory / "resumeq.toml"
        cluster = Cluster(
            directory, redis_url=server.url, config=config_path, thread_caches_off=False
        )
        with FakeProcess(
            directory,
            completion_tokens=completion_tokens,
            token_delay_ms=token_delay_ms,
            env=cluster.env,
        ) as fake:
            profile = {"kind": "openai", "base_url": fake.openai_base_url}
            write_config(config_path, {"providers": {"fake": profile}, "worker": dict(worker)})
            fake.warm(prompt)
            store = Store.from_url(server.url)
            try:
                yield cluster, server, fake, store
            except (TimeoutError, RuntimeError):
                print(cluster.logs(), file=sys.stderr)
                raise
            finally:
                cluster.stop()
                store.redis.close()
