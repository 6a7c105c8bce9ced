"""Debian's ``nginx`` in front of a ``resumeq serve``, for tests: a reverse proxy with the
``location`` block that docs/http-api.md shows, on a free loopback port, in a directory of
its own; a child process stopped by PID (SIGQUIT, then SIGKILL), never left behind."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from resumeq.testing.redis_server import free_port


def documented_location(page: Path) -> str:
    """The ``location / { ... }`` block of the first nginx example in the Markdown ``page``
    (what the tests run is what the documentation shows)."""
    text = page.read_text(encoding="utf-8")
    start = text.index("```nginx\n") + len("```nginx\n")
    block = text[start : text.index("```", start)]
    location = block[block.index("location / {") :]
    depth, end = 0, 0
    for i, char in enumerate(location):
        depth += {"{": 1, "}": -1}.get(char, 0)
        if char == "}" and depth == 0:
            end = i + 1
            break
    return location[:end]


class Nginx:
    """nginx listening on ``port``, passing everything to ``upstream`` (``host:port``) with
    ``location`` (the documented block; its ``proxy_pass`` target is replaced)."""

    def __init__(self, upstream: str, location: str, *, binary: str = "nginx") -> None:
        found = shutil.which(binary) or shutil.which(binary, path="/usr/sbin:/usr/local/sbin")
        if found is None:
            raise FileNotFoundError(
                f"{binary} not found: install it (Debian: apt-get install nginx)"
            )
        self.binary = found
        self.port = free_port()
        self.directory = Path(tempfile.mkdtemp(prefix="resumeq-nginx-"))
        self.upstream = upstream
        self.location = location.replace("http://127.0.0.1:8000", f"http://{upstream}")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> str:
        d = self.directory
        temps = "\n".join(
            f"    {kind}_temp_path {d / kind};" for kind in ("client_body", "proxy", "fastcgi",
                                                            "uwsgi", "scgi")
        )  # fmt: skip
        return f"""daemon off;
master_process off;
worker_processes 1;
pid {d / "nginx.pid"};
error_log {d / "error.log"} warn;
events {{ worker_connections 1024; }}
http {{
    access_log {d / "access.log"};
{temps}
    server {{
        listen 127.0.0.1:{self.port};
        server_name localhost;
        {self.location}
    }}
}}
"""

    def start(self, timeout_s: float = 10.0) -> Nginx:
        conf = self.directory / "nginx.conf"
        conf.write_text(self.config(), encoding="utf-8")
        checked = subprocess.run(
            [self.binary, "-t", "-q", "-p", str(self.directory), "-c", str(conf)],
            capture_output=True,
            timeout=30,
            check=False,
        )
        if checked.returncode != 0:
            raise RuntimeError(f"nginx refused its config: {checked.stderr.decode()}")
        with (self.directory / "stderr.log").open("wb") as stderr:
            self.process = subprocess.Popen(
                [self.binary, "-p", str(self.directory), "-c", str(conf)],
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"nginx exited: {(self.directory / 'error.log').read_text()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"nginx did not listen on {self.port} within {timeout_s} s")

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGQUIT)  # a graceful stop
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        self.process = None
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> Nginx:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
