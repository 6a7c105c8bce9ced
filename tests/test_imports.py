"""What each command loads, and what its start costs: ``resumeq --version`` and ``--help``
load click and the command modules only (≤ 0.3 s of CPU); the commands that read Redis load
no HTTP client, server, console or fake; an idle worker loads none of the server's parts.

CPU time, not wall time, is measured (the children's user + system time, the median of
five runs): a busy machine stretches the wall clock, much less the work."""

from __future__ import annotations

import os
import re
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from resumeq.testing import RedisServer
from resumeq.testing.processes import Proc, wait_for

pytestmark = pytest.mark.timeout(120)

#: The console script, as a user runs it (``python -m resumeq`` where it is not installed).
_SCRIPT = Path(sys.executable).with_name("resumeq")
RESUMEQ = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "resumeq"]

#: What a command that reads or writes Redis never needs.
NEVER = ("httpx", "httpcore", "starlette", "jinja2", "uvicorn", "resumeq.server",
         "resumeq.fake", "resumeq.context", "resumeq.providers", "resumeq.worker",
         "resumeq.docs")  # fmt: skip
#: What ``--version`` and ``--help`` never need, besides.
NOT_TO_START = (*NEVER, "redis", "rq", "pydantic", "resumeq.store", "resumeq.settings")

_IMPORTED = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)\s*$")


def imported(stderr: str) -> set[str]:
    """The modules a process loaded, from its ``-X importtime`` lines."""
    return {m.group(1) for line in stderr.splitlines() if (m := _IMPORTED.match(line))}


def loads(names: set[str], prefixes: Sequence[str]) -> list[str]:
    return sorted(n for n in names if any(n == p or n.startswith(p + ".") for p in prefixes))


def cpu_s(args: Sequence[str], env: dict[str, str], runs: int = 5) -> float:
    """The median user + system CPU seconds of ``args``, run to its end ``runs`` times."""
    spent = []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run(args, env=env, capture_output=True, timeout=60, check=False)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        spent.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return statistics.median(spent)


def environment(redis_url: str = "redis://127.0.0.1:1/0") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RESUMEQ_CONFIG"}
    return {**env, "RESUMEQ_REDIS_URL": redis_url}


@pytest.mark.parametrize("args", [["--version"], ["--help"], ["spill", "--help"]])
def test_starting_loads_click_and_the_commands_only(args: list[str]) -> None:
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "resumeq", *args],
        env=environment(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    names = imported(out.stderr)
    assert "click" in names and "resumeq.cli" in names  # the measure sees imports
    assert loads(names, NOT_TO_START) == []


@pytest.mark.parametrize("args", [["--version"], ["--help"]])
def test_version_and_help_cost_at_most_a_third_of_a_second(args: list[str]) -> None:
    spent = cpu_s([*RESUMEQ, *args], environment())
    assert spent <= 0.3, f"resumeq {' '.join(args)}: {spent:.3f} s of CPU"


COMMANDS = {
    "status": ["status", "0123456789abcdef0123456789abcdef", "--json"],
    "cancel": ["cancel", "0123456789abcdef0123456789abcdef", "--json"],
    "enqueue": [
        "enqueue",
        "--provider",
        "p",
        "--model",
        "m",
        "--budget",
        "10",
        "--prompt",
        "hi",
        "--json",
    ],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_commands_on_redis_load_no_http_client_server_or_fake(
    command: str, redis_server: RedisServer
) -> None:
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "resumeq", *COMMANDS[command]],
        env=environment(redis_server.url),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode in (0, 3), out.stderr[-2000:]  # 3: no such job
    names = imported(out.stderr)
    assert "redis" in names and "resumeq.store" in names
    assert loads(names, NEVER) == []


def test_an_idle_worker_loads_no_server_console_fake_or_openapi(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """The worker as ``resumeq worker`` starts it (it may start itself again: the
    environment carries the measure along), watched until it has been idle a second."""
    env = {**environment(redis_server.url), "PYTHONPROFILEIMPORTTIME": "1"}
    proc = Proc([*RESUMEQ, "worker"], env=env, log=tmp_path / "worker.log")
    try:
        wait_for(lambda: "Listening on" in proc.output(), timeout_s=30, what="the worker idle")
        time.sleep(1.0)
    finally:
        proc.stop()
    names = imported(proc.output())
    assert "resumeq.concurrent" in names  # the measure saw the worker's own imports
    forbidden = ("starlette", "jinja2", "uvicorn", "resumeq.server", "resumeq.fake",
                 "resumeq.testing", "schemathesis", "resumeq.docs")  # fmt: skip
    assert loads(names, forbidden) == []
