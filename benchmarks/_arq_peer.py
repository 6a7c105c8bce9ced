"""arq 0.28 running the benchmarks' streaming job: the peer the concurrent worker is measured
against (issue 13).

The job streams one completion from the fake provider over the OpenAI wire (one token per
chunk) through one ``httpx.AsyncClient`` per process, and checkpoints into Redis every
``--flush-tokens`` tokens or ``--flush-ms``, whichever first — the rule resumeq's worker
runs with. A checkpoint is one MULTI/EXEC pipeline: APPEND the delta to the job's text,
HINCRBY its ``spent`` and ``revision``, HSET ``updated_ms``. The job ends with the stream
(the benchmarks stop the worker by PID while its streams are still going).

arq pins redis-py below 6, and resumeq's own environment has redis-py 8 (its type checks
fail on redis-py 5), so arq lives in a virtual environment of its own, ``.venv/arq-peer``
(made on first use from the ``arq-peer`` extra of pyproject.toml), and this file runs there
as its own process: ``python _arq_peer.py worker ...`` serves the jobs, ``python
_arq_peer.py enqueue ...`` enqueues them. The benchmark drivers import only the helpers
below (:func:`arq_python`, :func:`start_worker`, :func:`enqueue`, :func:`spent`), which do not
import arq.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from _peer_env import peer_python

if TYPE_CHECKING:
    import redis

    from resumeq.testing.processes import Cluster, Proc

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
#: The function name jobs are enqueued under, and the arq queue.
FUNCTION = "stream_job"
QUEUE = "arq:peer"
#: What arq appends to the queue's name for its health-check key.
HEALTH_CHECK_SUFFIX = ":health-check"
#: The peer's own keys: a hash (spent, revision, updated_ms) and the text, per job.
KEY_PREFIX = "arqpeer"


def job_key(job_id: str) -> str:
    return f"{KEY_PREFIX}:{job_id}"


def text_key(job_id: str) -> str:
    return f"{KEY_PREFIX}:{job_id}:text"


# -- the driver's side (resumeq's environment) -------------------------------------------------


def arq_python() -> str:
    """The interpreter of arq's environment, made (and the extra installed) on first use."""
    return peer_python("arq-peer")


def start_worker(
    cluster: Cluster,
    *,
    base_url: str,
    max_jobs: int,
    flush_tokens: int = 32,
    flush_ms: int = 250,
) -> Proc:
    """One arq worker process (``max_jobs`` at once), a process of ``cluster``."""
    from resumeq.testing.processes import Proc  # noqa: PLC0415 - resumeq's side only

    args = [arq_python(), str(Path(__file__).resolve()), "worker"]
    args += ["--redis-url", cluster.env["RESUMEQ_REDIS_URL"], "--base-url", base_url]
    args += ["--max-jobs", str(max_jobs), "--flush-tokens", str(flush_tokens)]
    args += ["--flush-ms", str(flush_ms)]
    proc = Proc(args, env=cluster.env, log=cluster.directory / f"arq-{len(cluster.procs)}.log")
    cluster.procs.append(proc)
    return proc


def enqueue(cluster: Cluster, job_ids: Sequence[str], *, prompt: str) -> None:
    """Enqueue one streaming job per id (prompt ``prompt.format(n=i)``), in a short-lived
    process of arq's environment."""
    args = [arq_python(), str(Path(__file__).resolve()), "enqueue"]
    args += ["--redis-url", cluster.env["RESUMEQ_REDIS_URL"], "--prompt", prompt, *job_ids]
    subprocess.run(args, check=True, env=cluster.env, timeout=120)


def ready(connection: redis.Redis) -> bool:
    """Whether a worker has started polling (it records its health check first)."""
    return bool(connection.exists(f"{QUEUE}{HEALTH_CHECK_SUFFIX}"))


def spent(connection: redis.Redis, job_ids: Sequence[str]) -> list[int]:
    """The tokens each job has checkpointed so far (0 before its first checkpoint)."""
    with connection.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.hget(job_key(job_id), "spent")
        return [int(v or 0) for v in pipe.execute()]


# -- arq's side (its own environment) ---------------------------------------------------------


async def stream_job(ctx: dict[str, Any], job_id: str, prompt: str) -> int:
    """Stream one completion, checkpointing as it goes; answers the tokens received."""
    http, redis_, options = ctx["http"], ctx["redis"], ctx["options"]
    body = {
        "model": "fake-model",
        "messages": [{"role": "user", "content": prompt}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 1_000_000,
    }
    pending: list[str] = []
    total = 0
    last_flush = time.monotonic()

    async def flush() -> None:
        nonlocal last_flush
        async with redis_.pipeline(transaction=True) as pipe:
            pipe.append(text_key(job_id), "".join(pending))
            pipe.hincrby(job_key(job_id), "spent", len(pending))
            pipe.hincrby(job_key(job_id), "revision", 1)
            pipe.hset(job_key(job_id), "updated_ms", int(time.time() * 1000))
            await pipe.execute()
        pending.clear()
        last_flush = time.monotonic()

    async with http.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            choices = chunk.get("choices") or []
            content = choices[0].get("delta", {}).get("content") if choices else None
            if not content:
                continue
            pending.append(content)
            total += 1
            elapsed_ms = (time.monotonic() - last_flush) * 1000
            if len(pending) >= options.flush_tokens or elapsed_ms >= options.flush_ms:
                await flush()
    if pending:
        await flush()
    return total


def _worker(options: argparse.Namespace) -> None:
    import httpx  # noqa: PLC0415 - arq's environment only
    from arq.connections import RedisSettings  # noqa: PLC0415
    from arq.worker import run_worker  # noqa: PLC0415

    async def startup(ctx: dict[str, Any]) -> None:
        limits = httpx.Limits(max_connections=options.max_jobs, max_keepalive_connections=None)
        timeout = httpx.Timeout(30.0, connect=10.0)
        ctx["http"] = httpx.AsyncClient(base_url=options.base_url, limits=limits, timeout=timeout)
        ctx["options"] = options

    async def shutdown(ctx: dict[str, Any]) -> None:
        await ctx["http"].aclose()

    class Settings:
        functions = [stream_job]  # noqa: RUF012 - arq reads class attributes
        queue_name = QUEUE
        redis_settings = RedisSettings.from_dsn(options.redis_url)
        max_jobs = options.max_jobs
        job_timeout = 24 * 3600
        keep_result = 0
        max_tries = 1
        on_startup = startup
        on_shutdown = shutdown

    run_worker(Settings)  # type: ignore[arg-type]


def _enqueue(options: argparse.Namespace) -> None:
    import asyncio  # noqa: PLC0415

    from arq.connections import RedisSettings, create_pool  # noqa: PLC0415

    async def run() -> None:
        pool = await create_pool(RedisSettings.from_dsn(options.redis_url))
        try:
            for n, job_id in enumerate(options.job_ids):
                prompt = options.prompt.format(n=n)
                await pool.enqueue_job(FUNCTION, job_id, prompt, _job_id=job_id, _queue_name=QUEUE)
        finally:
            await pool.aclose()

    asyncio.run(run())


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    worker = commands.add_parser("worker")
    worker.add_argument("--redis-url", required=True)
    worker.add_argument("--base-url", required=True)
    worker.add_argument("--max-jobs", type=int, default=200)
    worker.add_argument("--flush-tokens", type=int, default=32)
    worker.add_argument("--flush-ms", type=float, default=250.0)
    enqueue_ = commands.add_parser("enqueue")
    enqueue_.add_argument("--redis-url", required=True)
    enqueue_.add_argument("--prompt", required=True)
    enqueue_.add_argument("job_ids", nargs="+")
    options = parser.parse_args(argv)
    if options.command == "worker":
        _worker(options)
    else:
        _enqueue(options)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main(sys.argv[1:]))
