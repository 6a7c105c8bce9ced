"""Start and stop a real ``redis-server`` on a free loopback port, in its own directory.

Used by the test suite, the benchmarks and the soak: the server is a child process that
is stopped by PID (SIGTERM, then SIGKILL after a timeout), never left behind.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

import redis


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class RedisServer:
    """A ``redis-server`` child process.

    ``appendonly`` turns on AOF with ``appendfsync always`` so a restart keeps every
    acknowledged write; ``restart()`` stops and starts it on the same port and directory.
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        directory: Path | None = None,
        appendonly: bool = False,
        password: str | None = None,
        binary: str = "redis-server",
        start_timeout_s: float = 10.0,
    ) -> None:
        found = shutil.which(binary)
        if found is None:
            raise FileNotFoundError(
                f"{binary} not found: install it (Debian: apt-get install redis-server)"
            )
        self.binary = found
        self.port = port or free_port()
        self._own_dir = directory is None
        self.directory = directory or Path(tempfile.mkdtemp(prefix="resumeq-redis-"))
        self.appendonly = appendonly
        self.password = password
        self.start_timeout_s = start_timeout_s
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def _args(self) -> list[str]:
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.directory),
            "--save",
            "",
            "--daemonize",
            "no",
            "--logfile",
            str(self.directory / "redis.log"),
        ]
        if self.appendonly:
            args += ["--appendonly", "yes", "--appendfsync", "always"]
        else:
            args += ["--appendonly", "no"]
        if self.password:
            args += ["--requirepass", self.password]
        return args

    def start(self) -> RedisServer:
        if self.process is not None and self.process.poll() is None:
            return self
        self.process = subprocess.Popen(
            self._args(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        client = redis.Redis.from_url(self.url, socket_timeout=1.0)
        deadline = time.monotonic() + self.start_timeout_s
        try:
            while True:
                if self.process.poll() is not None:
                    log = self.directory / "redis.log"
                    tail = log.read_text(errors="replace")[-800:] if log.exists() else ""
                    raise RuntimeError(f"redis-server exited at start: {tail}")
                try:
                    if client.ping():
                        return self
                except (redis.ConnectionError, redis.BusyLoadingError):
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    raise TimeoutError(f"redis-server on port {self.port} did not answer")
                time.sleep(0.02)
        finally:
            client.close()

    def stop(self, timeout_s: float = 10.0) -> None:
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=timeout_s)

    def restart(self) -> None:
        self.stop()
        self.start()

    def close(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
