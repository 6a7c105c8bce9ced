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


class PortTaken(RuntimeError):
    """Another process listens on the port the server was to use."""


class RedisServer:
    """A ``redis-server`` child process.

    ``appendonly`` turns on AOF with ``appendfsync always`` so a restart keeps every
    acknowledged write; ``restart()`` stops and starts it on the same port and directory.
    ``args`` are more options (``("--replicaof", "127.0.0.1", "6379")``).
    ``password`` alone sets ``requirepass``; with ``username`` it creates that ACL user and
    turns the default user off. ``tls`` serves TLS only, with a self-signed certificate
    made in the server's directory (``openssl`` must be installed); ``url`` is then a
    ``rediss://`` URL that trusts it.
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        directory: Path | None = None,
        appendonly: bool = False,
        password: str | None = None,
        username: str | None = None,
        tls: bool = False,
        binary: str = "redis-server",
        start_timeout_s: float = 10.0,
        args: tuple[str, ...] = (),
    ) -> None:
        found = shutil.which(binary)
        if found is None:
            raise FileNotFoundError(
                f"{binary} not found: install it (Debian: apt-get install redis-server)"
            )
        self.binary = found
        self._port_chosen = port is None  # ours to change if another process takes it
        self.port = port or free_port()
        self._own_dir = directory is None
        self.directory = directory or Path(tempfile.mkdtemp(prefix="resumeq-redis-"))
        self.directory.mkdir(parents=True, exist_ok=True)
        self.appendonly = appendonly
        self.password = password
        self.username = username
        self.tls = tls
        self.start_timeout_s = start_timeout_s
        #: More command-line options (``--replicaof HOST PORT``, ...), given last.
        self.args = args
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f"{self.username or ''}:{self.password}@" if self.password else ""
        if self.tls:
            return f"rediss://{auth}127.0.0.1:{self.port}/0?ssl_ca_certs={self._cert}"
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    @property
    def _cert(self) -> Path:
        return self.directory / "tls-cert.pem"

    def _make_certificate(self) -> None:
        if self._cert.exists():
            return
        subprocess.run(
            [
                "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                "-keyout", str(self.directory / "tls-key.pem"), "-out", str(self._cert),
                "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )  # fmt: skip

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
            # Tests stall Redis on purpose (DEBUG SLEEP), from loopback only.
            "--enable-debug-command",
            "local",
        ]
        if self.appendonly:
            args += ["--appendonly", "yes", "--appendfsync", "always"]
        else:
            args += ["--appendonly", "no"]
        if self.password and self.username:
            args += ["--user", "default", "off"]
            args += ["--user", self.username, "on", f">{self.password}", "~*", "&*", "+@all"]
        elif self.password:
            args += ["--requirepass", self.password]
        if self.tls:
            self._make_certificate()
            key = str(self.directory / "tls-key.pem")
            args[args.index("--port") + 1] = "0"
            args += ["--tls-port", str(self.port), "--tls-cert-file", str(self._cert)]
            args += ["--tls-key-file", key, "--tls-ca-cert-file", str(self._cert)]
            args += ["--tls-auth-clients", "no"]
        return args + list(self.args)

    def start(self) -> RedisServer:
        """Start it and wait until it answers; a port chosen here that another process
        took meanwhile (free_port only finds one that was free) is chosen again."""
        for tries_left in range(4, -1, -1):
            try:
                return self._start()
            except PortTaken:
                if not self._port_chosen or not tries_left:
                    raise
                self.port = free_port()
        raise AssertionError("unreachable")

    def _start(self) -> RedisServer:
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
                    self.process = None
                    if "Address already in use" in tail:
                        raise PortTaken(f"port {self.port} is taken")
                    raise RuntimeError(f"redis-server exited at start: {tail}")
                try:
                    # the server answering must be ours, not one that had the port first
                    if client.info("server")["process_id"] == self.process.pid:
                        return self
                except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
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
        """Stop and start it again on the same port (its clients' URL stays right)."""
        self.stop()
        self._start()

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
