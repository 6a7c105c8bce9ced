"""Real resumeq processes for tests, benchmarks and the soak: workers and janitors started
as ``python -m resumeq ...`` in their own process groups, stopped (or killed) by PID."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from resumeq.worker import heap


def toml_value(v: Any) -> str:
    """One TOML value (the shapes resumeq's config uses)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list | tuple):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, Mapping):
        return "{ " + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"cannot write {v!r} as TOML")


def write_config(path: Path, config: Mapping[str, Any]) -> Path:
    """Write a resumeq TOML config: ``{"providers": {name: {...}}, "worker": {...}, ...}``."""
    lines: list[str] = []
    for name, body in config.items():
        tables = body.items() if name == "providers" else [(None, body)]
        for sub, fields in tables:
            lines.append(f"[{name}.{sub}]" if sub else f"[{name}]")
            lines += [f"{k} = {toml_value(v)}" for k, v in fields.items()]
            lines.append("")
    text = "\n".join(lines)
    tomllib.loads(text)  # what we wrote must read back
    path.write_text(text, encoding="utf-8")
    return path


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (RQ puts its work horses in process groups of
    their own, so a group kill does not reach them)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        out += children
        todo += children
    return out


class Proc:
    """One child process in its own session (so a kill reaches its work horses too)."""

    def __init__(self, args: Sequence[str], *, env: Mapping[str, str], log: Path) -> None:
        self.args = list(args)
        self.log_path = log
        self._log = log.open("ab")
        self.popen = subprocess.Popen(
            self.args,
            env=dict(env),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.pid = self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def wait(self, timeout: float) -> int:
        """Wait for it to exit; answers its exit status (``TimeoutExpired`` after
        ``timeout`` seconds, and it is left running for the caller to stop)."""
        return self.popen.wait(timeout=timeout)

    def signal_group(self, sig: int) -> None:
        """Signal the process, its group and every descendant (work horses included)."""
        for pid in [*descendants(self.pid), self.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, sig)

    def kill(self) -> None:
        """SIGKILL the worker and whatever attempt it is running."""
        self.signal_group(signal.SIGKILL)
        self.popen.wait(timeout=10)

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM, and SIGKILL if it has not exited within ``timeout_s``; its work horses
        are killed either way."""
        self._stopped(self._terminate(), timeout_s)

    def _terminate(self) -> list[int]:
        """The first half of :meth:`stop`: the SIGTERM; answers the work horses."""
        horses = descendants(self.pid)
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
        return horses

    def _stopped(self, horses: list[int], timeout_s: float) -> None:
        """The second half of :meth:`stop`: wait, kill what is left, close the log."""
        try:
            self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
        for pid in horses:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._log.close()

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")


class Cluster:
    """Workers and janitors sharing one Redis and one config file."""

    def __init__(
        self, directory: Path, *, redis_url: str, config: Path, thread_caches_off: bool = True
    ) -> None:
        """``thread_caches_off``: start every process with glibc's thread caches off, as
        ``resumeq worker`` starts itself again (:mod:`resumeq.worker.heap`), which saves each
        worker that second start (some 0.8 s of CPU). Benchmarks pass False: their workers
        start exactly as a user's do."""
        self.directory = directory
        self.env = {
            **os.environ,
            "RESUMEQ_REDIS_URL": redis_url,
            "RESUMEQ_CONFIG": str(config),
            "PYTHONUNBUFFERED": "1",
        }
        if thread_caches_off and not heap.thread_caches_off(self.env):
            tunables = (self.env.get("GLIBC_TUNABLES"), heap.TCACHE_OFF)
            self.env["GLIBC_TUNABLES"] = ":".join(t for t in tunables if t)
        self.procs: list[Proc] = []

    def command(self, *args: str) -> Proc:
        """``resumeq ARGS…`` as a process of the cluster (stopped with it)."""
        return self._start(args[0] if args else "resumeq", *args)

    def _start(self, name: str, *args: str) -> Proc:
        return self.spawn(name, [sys.executable, "-m", "resumeq", *args])

    def spawn(self, name: str, args: Sequence[str]) -> Proc:
        """Any command as a process of the cluster (its environment; stopped with it)."""
        log = self.directory / f"{name}-{len(self.procs)}.log"
        proc = Proc(args, env=self.env, log=log)
        self.procs.append(proc)
        return proc

    def worker(self, *queues: str, concurrency: int | None = None) -> Proc:
        args = ["worker"]
        for q in queues:
            args += ["--queues", q]
        if concurrency is not None:
            args += ["--concurrency", str(concurrency)]
        return self._start("worker", *args)

    def janitor(self, interval_s: float = 0.5) -> Proc:
        return self._start("janitor", "janitor", "--interval", str(interval_s))

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop every process: all are sent their SIGTERM first, so that they shut down
        side by side (one by one, a test's teardown took a quarter second per process)."""
        horses = [proc._terminate() for proc in self.procs]
        for proc, theirs in zip(self.procs, horses, strict=True):
            proc._stopped(theirs, timeout_s)

    def logs(self, tail: int | None = 3000) -> str:
        """Every process's log (the last ``tail`` characters of each; None: all of it)."""
        return "\n".join(
            f"--- {p.log_path.name}\n{p.output()[-tail:] if tail else p.output()}"
            for p in self.procs
        )


def wait_for(predicate: Any, *, timeout_s: float, interval_s: float = 0.05, what: str = "") -> Any:
    """Poll ``predicate`` until it answers something truthy; raise after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s} s waiting for {what or predicate}")
        time.sleep(interval_s)
