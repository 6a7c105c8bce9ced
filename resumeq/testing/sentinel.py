"""A Redis deployment that fails over, for tests, benchmarks and the soak: a primary, one
replica and three sentinels (``redis-server --sentinel``, quorum 2), each a child process
on a free loopback port, stopped by PID.

:meth:`SentinelDeployment.failover` is what an outage looks like from the clients: the
primary is SIGKILLed (what it had not sent to its replica is lost), the sentinels promote
the replica, and the old primary comes back empty as the new primary's replica (as a
restarted node's init script would start it), so that the next failover has a replica to
promote and ``durability = "replica"`` has one to wait for.
"""

from __future__ import annotations

import contextlib
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import redis

from resumeq.store import keys
from resumeq.testing.redis_server import RedisServer, free_port

SERVICE = "resumeq"
#: A primary sends a new replica its data at once (Redis waits 5 s by default, in case
#: more replicas come to share one transfer).
FAST_SYNC = ("--repl-diskless-sync-delay", "0")


def wait_replicated(port: int, *, timeout_s: float = 20.0) -> None:
    """Wait until the replica on ``port`` has synced with its primary and acknowledges
    its writes (what a ``WAIT`` counts)."""
    deadline = time.monotonic() + timeout_s
    while not _online(port):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the replica on port {port} did not sync")
        time.sleep(0.05)


def _online(port: int) -> bool:
    try:
        with contextlib.closing(redis.Redis(port=port, socket_timeout=1.0)) as replica:
            mine: Any = replica.info("replication")
            if mine.get("master_link_status") != "up":
                return False
            with contextlib.closing(
                redis.Redis(port=int(mine["master_port"]), socket_timeout=1.0)
            ) as primary:
                # A write it acknowledges (a replica reported online may still be loading).
                primary.set(keys.REPLICATION_PROBE, "1", px=1000)
                return bool(primary.execute_command("WAIT", 1, 100) >= 1)  # type: ignore[no-untyped-call]
    except redis.RedisError:
        return False


class SentinelDeployment:
    """``url`` is the ``redis+sentinel://`` URL of the deployment; ``down_after_ms`` is
    how long the sentinels wait before they call a silent primary down."""

    def __init__(
        self,
        *,
        service: str = SERVICE,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 4000,
        start_timeout_s: float = 20.0,
    ) -> None:
        self.service = service
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.start_timeout_s = start_timeout_s
        self.directory = Path(tempfile.mkdtemp(prefix="resumeq-sentinel-"))
        self.nodes: list[RedisServer] = []
        self.sentinel_ports: list[int] = []
        self._sentinels: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        where = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        return f"redis+sentinel://{where}/{self.service}/0"

    def start(self) -> SentinelDeployment:
        try:
            primary = RedisServer(directory=self.directory / "node-0", args=FAST_SYNC).start()
            self.nodes.append(primary)
            replica = RedisServer(
                directory=self.directory / "node-1",
                args=(*FAST_SYNC, "--replicaof", "127.0.0.1", str(primary.port)),
            ).start()
            self.nodes.append(replica)
            self._wait_replicated(replica)
            self._start_sentinels(primary.port, replica.port)
            self._wait(self._sentinels_agree, "the sentinels to see the primary, its replica "
                       "and each other")  # fmt: skip
        except BaseException:
            self.close()
            raise
        return self

    def _start_sentinels(self, primary_port: int, replica_port: int) -> None:
        """Three sentinels, each told of the others and of the replica (as a sentinel's
        rewritten config is after a while): they agree at once instead of over a few
        rounds of hello messages."""
        ports = [free_port() for _ in range(3)]
        ids = [secrets.token_hex(20) for _ in range(3)]
        for n, port in enumerate(ports):
            conf = self.directory / f"sentinel-{n}.conf"
            lines = [
                f"port {port}",
                "bind 127.0.0.1",
                f"dir {self.directory}",
                f"logfile {self.directory / f'sentinel-{n}.log'}",
                f"sentinel myid {ids[n]}",
                f"sentinel monitor {self.service} 127.0.0.1 {primary_port} 2",
                f"sentinel down-after-milliseconds {self.service} {self.down_after_ms}",
                f"sentinel failover-timeout {self.service} {self.failover_timeout_ms}",
                f"sentinel parallel-syncs {self.service} 1",
                f"sentinel known-replica {self.service} 127.0.0.1 {replica_port}",
            ]
            lines += [
                f"sentinel known-sentinel {self.service} 127.0.0.1 {other} {ids[m]}"
                for m, other in enumerate(ports)
                if m != n
            ]
            conf.write_text("\n".join(lines) + "\n")
            self._sentinels.append(
                subprocess.Popen(
                    ["redis-server", str(conf), "--sentinel"],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
            self.sentinel_ports.append(port)

    def _ask(self, port: int) -> redis.Redis:
        return redis.Redis(port=port, socket_timeout=1.0, socket_connect_timeout=1.0)

    def _sentinels_agree(self) -> bool:
        for port in self.sentinel_ports:
            with contextlib.closing(self._ask(port)) as sentinel:
                try:
                    master: Any = sentinel.sentinel_master(self.service)
                except redis.RedisError:
                    return False
                if master.get("num-slaves", 0) < 1 or master.get("num-other-sentinels", 0) < 2:
                    return False
        return True

    def primary_port(self) -> int:
        """The primary's port as the sentinels name it."""
        for port in self.sentinel_ports:
            with contextlib.closing(self._ask(port)) as sentinel:
                try:
                    found: Any = sentinel.sentinel_get_master_addr_by_name(self.service)
                except redis.RedisError:
                    continue
                if found:
                    return int(found[1])
        raise RuntimeError("no sentinel names a primary")

    def node(self, port: int) -> RedisServer:
        return next(node for node in self.nodes if node.port == port)

    @property
    def primary(self) -> RedisServer:
        return self.node(self.primary_port())

    def failover(self, *, lag_s: float = 0.0) -> float:
        """SIGKILL the primary; wait until the sentinels promoted the replica and the old
        primary is back as its replica. Answers the seconds from the kill to the
        promotion (what clients wait).

        ``lag_s``: the replica is frozen (SIGSTOP) that long before the kill, so that it
        misses the primary's last writes, as a replica behind on a busy link does: what
        the primary acknowledged in that time is lost with it (its link to the replica
        is cut too, so that the writes stay in the primary's backlog)."""
        old = self.primary
        replica = next(node for node in self.nodes if node is not old)
        frozen = lag_s > 0 and replica.process is not None
        try:
            if frozen and replica.process is not None:
                # Frozen, and cut off: what the primary writes now stays in its backlog (a
                # frozen replica alone would find it in its socket's buffer on waking).
                replica.process.send_signal(signal.SIGSTOP)
                with contextlib.closing(self._ask(old.port)) as primary:
                    primary.client_kill_filter(_type="replica")
                time.sleep(lag_s)
            killed = time.monotonic()
            self.kill(old)
        finally:
            if frozen and replica.process is not None:
                replica.process.send_signal(signal.SIGCONT)
        self._wait(lambda: self._promoted(old.port), "the sentinels to promote the replica")
        took = time.monotonic() - killed
        self.rejoin(old)
        return took

    def kill(self, node: RedisServer) -> None:
        proc, node.process = node.process, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)

    def _promoted(self, old_port: int) -> bool:
        """Every sentinel names the same new primary, and it says it is one."""
        named = set()
        for sentinel_port in self.sentinel_ports:
            with contextlib.closing(self._ask(sentinel_port)) as sentinel:
                try:
                    found: Any = sentinel.sentinel_get_master_addr_by_name(self.service)
                except redis.RedisError:
                    return False
            if not found:
                return False
            named.add(int(found[1]))
        if len(named) != 1:
            return False
        (port,) = named
        if port == old_port:
            return False
        with contextlib.closing(self._ask(port)) as client:
            try:
                role = client.info("replication")["role"]
            except redis.RedisError:
                return False
        return bool(role == "master")

    def rejoin(self, node: RedisServer) -> None:
        """Start a killed node again, empty, as the current primary's replica."""
        node.args = (*FAST_SYNC, "--replicaof", "127.0.0.1", str(self.primary_port()))
        shutil.rmtree(node.directory, ignore_errors=True)
        node.directory.mkdir(parents=True)
        node.start()
        self._wait_replicated(node)

    def _wait_replicated(self, replica: RedisServer) -> None:
        wait_replicated(replica.port, timeout_s=self.start_timeout_s)

    def _wait(self, done: object, what: str) -> None:
        assert callable(done)
        deadline = time.monotonic() + self.start_timeout_s
        while not done():
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out waiting for {what} (logs in {self.directory})")
            time.sleep(0.05)

    def close(self) -> None:
        for proc in self._sentinels:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
        self._sentinels.clear()
        for node in self.nodes:
            node.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> SentinelDeployment:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
