"""What each command loads, and what its start costs: ``resumeq --version`` and ``--help``
load click and the command modules only (≤ 0.3 s of CPU); ``status``, ``cancel`` and
``enqueue`` load no pydantic model, HTTP client, server, console or fake, and cost at most
``import redis`` and 0.15 s more; an idle worker loads none of the server's parts.

CPU time, not wall time, is measured (the children's user + system time, the median of
five runs, the commands compared run in turns): a busy machine stretches the wall clock,
much less the work."""

from __future__ import annotations

import os
import re
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from resumeq.store import Store
from resumeq.testing import RedisServer
from resumeq.testing.processes import Proc, wait_for

pytestmark = pytest.mark.timeout(120)

#: The console script, as a user runs it (``python -m resumeq`` where it is not installed).
_SCRIPT = Path(sys.executable).with_name("resumeq")
RESUMEQ = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "resumeq"]

#: What a command that reads or writes Redis never needs (without a config file: one is
#: validated by the settings models).
NEVER = ("httpx", "httpcore", "starlette", "jinja2", "uvicorn", "resumeq.server",
         "resumeq.fake", "resumeq.worker.context", "resumeq.providers", "resumeq.worker.attempt",
         "resumeq.docs", "pydantic", "resumeq.core.spec", "resumeq.core.settings",
         "resumeq.core.ledger")  # fmt: skip
#: What ``--version`` and ``--help`` never need, besides.
NOT_TO_START = (*NEVER, "redis", "rq", "pydantic", "resumeq.store.facade",
                "resumeq.store.transport", "resumeq.core.settings")  # fmt: skip

_IMPORTED = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)\s*$")


def imported(stderr: str) -> set[str]:
    """The modules a process loaded, from its ``-X importtime`` lines."""
    return {m.group(1) for line in stderr.splitlines() if (m := _IMPORTED.match(line))}


def loaded(args: Sequence[str], env: dict[str, str]) -> set[str]:
    """The modules a command (``args``: a command line) loaded; it succeeded."""
    out = subprocess.run(args, env={**env, "PYTHONPROFILEIMPORTTIME": "1"}, capture_output=True,
                         text=True, timeout=60, check=False)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    names = imported(out.stderr)
    assert "resumeq.cli" in names  # the measure saw the imports
    return names


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


def installed(redis_url: str) -> dict[str, str]:
    """:func:`environment` as an installed package runs: from its bytecode (an
    installation compiles it; a first run writes it), never compiled again each run."""
    return {k: v for k, v in environment(redis_url).items() if k != "PYTHONDONTWRITEBYTECODE"}


def cpu_of_each(
    commands: dict[str, Callable[[], Sequence[str]]], env: dict[str, str], runs: int = 5
) -> dict[str, float]:
    """The median user + system CPU seconds of each command, run in turns ``runs`` times
    after one run each to warm up (a command's arguments are made anew for each run)."""
    spent: dict[str, list[float]] = {name: [] for name in commands}
    for round_ in range(runs + 1):
        for name, args in commands.items():
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            out = subprocess.run(args(), env=env, capture_output=True, timeout=60, check=False)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            assert out.returncode == 0, (name, out.stderr[-2000:])
            if round_:
                spent[name].append(
                    after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
                )
    return {name: statistics.median(s) for name, s in spent.items()}


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
@pytest.mark.parametrize("job", ["queued", "gone"])
def test_commands_on_redis_load_no_model_rq_http_client_server_or_fake(
    command: str, job: str, redis_server: RedisServer, real_store: Store
) -> None:
    """Of a job that is queued (a cancel deletes its RQ job) and of one that is gone."""
    args = COMMANDS[command]
    if job == "queued":
        queued = _enqueued(real_store, SPEC)
        args = [queued if a == COMMANDS["status"][1] else a for a in args]
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "resumeq", *args],
        env=environment(redis_server.url),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == (3 if job == "gone" and command != "enqueue" else 0), out.stderr
    names = imported(out.stderr)
    assert "redis" in names and "resumeq.store.scripts" in names  # the store loaded
    assert loads(names, (*NEVER, "rq")) == []
    if job == "queued" and command == "cancel":
        assert real_store.get(queued).state.value == "cancelled"
        assert not real_store.redis.exists(f"rq:job:{queued}-a1")  # its RQ job deleted


@pytest.mark.xdist_group("cpu-heavy")
def test_commands_on_redis_cost_at_most_import_redis_and_a_seventh_of_a_second(
    redis_server: RedisServer, real_store: Store, tmp_path: Path
) -> None:
    """``status`` of a job, ``cancel`` of a queued one (its RQ job deleted) and ``enqueue``
    of one against a real redis-server, each against ``python -c "import redis"`` in the
    same run: what resumeq adds to a command that needs Redis is at most 0.15 s of CPU."""
    queued = iter([_enqueued(real_store, SPEC) for _ in range(12)])  # a cancel each, warm-up too
    shown = _enqueued(real_store, SPEC)
    # As a deployment runs them: with a config file (its digest kept by the warm-up round).
    config = ["--config", str(_config(tmp_path))]
    commands: dict[str, Callable[[], Sequence[str]]] = {
        "import redis": lambda: [sys.executable, "-c", "import redis"],
        "status": lambda: [*RESUMEQ, "status", shown, "--json"],
        "cancel": lambda: [*RESUMEQ, "cancel", next(queued), "--json"],
        "enqueue": lambda: [*RESUMEQ, *COMMANDS["enqueue"]],
        "status, config": lambda: [*RESUMEQ, *config, "status", shown, "--json"],
        "cancel, config": lambda: [*RESUMEQ, *config, "cancel", next(queued), "--json"],
        "enqueue, config": lambda: [*RESUMEQ, *config, *COMMANDS["enqueue"]],
    }
    env = {**installed(redis_server.url), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    spent = cpu_of_each(commands, env)
    budget = spent["import redis"] + 0.15
    report = ", ".join(f"{name} {s:.3f} s" for name, s in spent.items())
    assert all(s <= budget for s in spent.values()), f"over {budget:.3f} s: {report}"
    assert real_store.get(shown).state.value == "queued"  # status changed nothing


SPEC = {"prompt": "hi", "provider": "p", "model": "m", "budget_tokens": 10}


def _config(tmp_path: Path, *, retention_s: int = 3600) -> Path:
    path = tmp_path / "resumeq.toml"
    path.write_text(
        f'[providers.p]\nkind = "fake"\nbase_url = "http://127.0.0.1:9/v1"\n'
        f"[store]\nretention_s = {retention_s}\n[limits]\nmax_budget_tokens = 500\n",
        encoding="utf-8",
    )
    return path


def test_a_config_file_is_validated_once_per_content_then_read_without_the_models(
    redis_server: RedisServer, real_store: Store, tmp_path: Path
) -> None:
    """The first command validates the file with the models and keeps its digest; the next
    reads the digest and loads no model; a file changed by one byte is validated again (a
    mistake in it is named, whatever was kept of the file before); an unwritable cache only
    means validating every time."""
    shown = _enqueued(real_store, SPEC)
    config = _config(tmp_path)
    env = {**environment(redis_server.url), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    status = [*RESUMEQ, "--config", str(config), "status", shown, "--json"]
    first, second = loaded(status, env), loaded(status, env)
    assert "pydantic" in first and "resumeq.core.settings" in first  # validated
    assert loads(second, ("pydantic", "resumeq.core.settings", "rq")) == []  # the digest
    assert len(list((tmp_path / "cache" / "resumeq").glob("config-*.json"))) == 1
    # The digest holds what the models made of the file: [limits] still bounds a job.
    enqueue = [*RESUMEQ, "--config", str(config), "enqueue", "--provider", "p", "--model",
               "m", "--budget", "600", "--prompt", "hi"]  # fmt: skip
    over = subprocess.run(enqueue, env=env, capture_output=True, text=True, timeout=60,
                          check=False)  # fmt: skip
    assert over.returncode != 0 and "budget_tokens" in over.stderr
    nope = [*RESUMEQ, "--config", str(config), "enqueue", "--provider", "nope", "--model",
            "m", "--budget", "10", "--prompt", "hi"]  # fmt: skip
    unknown = subprocess.run(nope, env=env, capture_output=True, text=True, timeout=60,
                             check=False)  # fmt: skip
    assert unknown.returncode != 0 and "unknown provider profile 'nope'" in unknown.stderr
    config.write_text(config.read_text().replace("3600", "-1"), encoding="utf-8")
    broken = subprocess.run(status, env=env, capture_output=True, text=True, timeout=60,
                            check=False)  # fmt: skip
    assert broken.returncode != 0 and "store.retention_s" in broken.stderr
    # A cache that cannot be written: validated each time, and the command works.
    (tmp_path / "blocked").write_text("a file where the cache directory would be")
    _config(tmp_path)
    blocked = {**env, "XDG_CACHE_HOME": str(tmp_path / "blocked")}
    for _ in range(2):
        assert "pydantic" in loaded(status, blocked)


def _enqueued(store: Store, spec: dict[str, object]) -> str:
    from resumeq.producer.enqueue import enqueue_job  # noqa: PLC0415

    return enqueue_job(store, store.redis, spec).id


def test_an_idle_worker_loads_no_server_console_fake_or_openapi(
    redis_server: RedisServer, real_store: Store, tmp_path: Path
) -> None:
    """The worker as ``resumeq worker`` starts it (it may start itself again: the
    environment carries the measure along), watched until it has been idle a second. What
    an attempt needs (its module, the provider clients, httpx and its TLS context) is loaded
    at start, not by the first attempt: a job's first attempt on a new worker, or a
    continuation due to the millisecond, never waits for imports. Redis holds no job
    (``real_store`` emptied it)."""
    env = {**environment(redis_server.url), "PYTHONPROFILEIMPORTTIME": "1"}
    proc = Proc([*RESUMEQ, "worker"], env=env, log=tmp_path / "worker.log")
    try:
        wait_for(lambda: "Listening on" in proc.output(), timeout_s=30, what="the worker idle")
        time.sleep(1.0)
    finally:
        proc.stop()
    names = imported(proc.output())
    assert "resumeq.worker.concurrent" in names  # the measure saw the worker's own imports
    forbidden = ("starlette", "jinja2", "uvicorn", "resumeq.server", "resumeq.fake",
                 "resumeq.testing", "schemathesis", "resumeq.docs")  # fmt: skip
    assert loads(names, forbidden) == []
    assert {"resumeq.worker.attempt", "resumeq.providers", "httpx"} <= names  # ready for an attempt
