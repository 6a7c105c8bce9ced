"""rq-dashboard over plain RQ holding as many jobs as the console benchmark's resumeq: the
peer its pages are measured against (issue 16).

rq-dashboard brings Flask and its own pins, so it lives in ``.venv/console-peer`` (the
``console-peer`` extra of pyproject.toml) and this file runs there as its own process:
``python _console_peer.py populate ...`` writes the jobs with that environment's RQ — the
finished ones in their queue's finished registry, each with an LLM-sized result, the rest
waiting in a queue no worker serves (the peer's spill lane). The benchmark driver imports
only :func:`populate` and :func:`start_dashboard`, which do not import RQ.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from _peer_env import peer_python

if TYPE_CHECKING:
    from resumeq.testing.processes import Cluster, Proc

#: The peer's queues: where the finished jobs ran, and the lane nobody serves.
DONE_QUEUE = "default"
WAITING_QUEUE = "spill"


def populate(redis_url: str, *, finished: int, waiting: int, text_chars: int) -> None:
    python = peer_python("console-peer")
    args = [python, str(Path(__file__).resolve()), "populate", "--redis-url", redis_url]
    args += ["--finished", str(finished), "--waiting", str(waiting)]
    args += ["--text-chars", str(text_chars)]
    subprocess.run(args, check=True, timeout=600)


def start_dashboard(cluster: Cluster, *, redis_url: str, port: int) -> Proc:
    """rq-dashboard on loopback, a process of ``cluster`` (stopped with it)."""
    python = peer_python("console-peer")
    args = [python, "-m", "rq_dashboard", "--redis-url", redis_url]
    args += ["--bind", "127.0.0.1", "--port", str(port)]
    return cluster.spawn("rq-dashboard", args)


# -- the peer's side (its own environment) ----------------------------------------------------


def _populate(args: argparse.Namespace) -> None:
    import redis  # noqa: PLC0415 - the peer's environment only
    from rq import Queue  # noqa: PLC0415
    from rq.job import Job, JobStatus  # noqa: PLC0415
    from rq.registry import FinishedJobRegistry  # noqa: PLC0415

    connection = redis.Redis.from_url(args.redis_url)
    done = Queue(DONE_QUEUE, connection=connection)
    registry = FinishedJobRegistry(queue=done)
    text = ("An answer of an LLM, about the size real ones are. " * 200)[: args.text_chars]
    batch = 500
    for start in range(0, args.finished, batch):
        with connection.pipeline() as pipe:
            for n in range(start, min(start + batch, args.finished)):
                job = Job.create(
                    "builtins.len",
                    args=(f"Prompt {n}: describe the harbour, its boats and its tides.",),
                    connection=connection,
                    origin=DONE_QUEUE,
                    result_ttl=-1,
                    meta={"text": text},
                )
                job.set_status(JobStatus.FINISHED, pipeline=pipe)
                job.save(pipeline=pipe)
                registry.add(job, -1, pipeline=pipe)
            pipe.execute()
    waiting = Queue(WAITING_QUEUE, connection=connection)
    for start in range(0, args.waiting, batch):
        waiting.enqueue_many(
            [
                Queue.prepare_data(
                    "builtins.len",
                    args=(f"Spilled {n}: the ferry timetable, every crossing.",),
                    meta={"text": text[: args.text_chars // 3]},
                )
                for n in range(start, min(start + batch, args.waiting))
            ]
        )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    fill = sub.add_parser("populate")
    fill.add_argument("--redis-url", required=True)
    fill.add_argument("--finished", type=int, required=True)
    fill.add_argument("--waiting", type=int, required=True)
    fill.add_argument("--text-chars", type=int, default=1500)
    args = parser.parse_args(argv)
    _populate(args)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
