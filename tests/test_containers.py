"""Workers as containers run them (SPEC §21): PID 1 of a PID namespace of their own, with
the host's name, restarted after a kill; two such containers side by side.

Each worker here is started by ``unshare -p -f --mount-proc``: it is PID 1, as in a Docker
or Kubernetes container (its hostname is the host's, as with host networking). Where the
kernel does not allow new PID namespaces the tests skip; ``test_identity.py`` covers the
same cases on the naming function alone.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from e2e_support import World, make_world

from resumeq.core.identity import pid_of
from resumeq.fake import FakeProvider
from resumeq.store import Store
from resumeq.testing import RedisServer
from resumeq.testing.processes import Proc, wait_for

pytestmark = pytest.mark.timeout(90)


def _namespaces_allowed() -> str | None:
    """Why a PID namespace cannot be made here, or None."""
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    try:
        done = subprocess.run(
            ["unshare", "-p", "-f", "--mount-proc", "true"],
            capture_output=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare failed: {exc}"
    if done.returncode != 0:
        return f"unshare -p is not allowed here: {done.stderr.decode(errors='replace').strip()}"
    return None


NOT_ALLOWED = _namespaces_allowed()
needs_namespaces = pytest.mark.skipif(NOT_ALLOWED is not None, reason=NOT_ALLOWED or "")


@pytest.fixture
def world(
    tmp_path: Path, real_store: Store, fake: FakeProvider, redis_server: RedisServer
) -> Iterator[World]:
    fake.completion_tokens = 60
    for world in make_world(tmp_path, real_store, fake, redis_server.url, lease_ttl_ms=15_000):
        try:
            yield world
        finally:
            # unshare passes no signal on: the worker inside is told itself, as a
            # container runtime tells its PID 1.
            for proc in world.cluster.procs:
                if proc.args[0] == "unshare" and proc.alive():
                    proc.signal_group(signal.SIGTERM)
            for proc in world.cluster.procs:
                if proc.args[0] == "unshare":
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(10)


def container(world: World, name: str) -> Proc:
    """``resumeq worker`` as PID 1 of a new PID namespace."""
    command = ["unshare", "-p", "-f", "--mount-proc", sys.executable, "-m", "resumeq", "worker"]
    return world.cluster.spawn(name, [*command, "--concurrency", "4"])


def registered(r: redis.Redis) -> dict[str, int]:
    """The workers RQ lists, with the PID each registered with."""
    out: dict[str, int] = {}
    for key in r.smembers("rq:workers"):
        pid = r.hget(key, "pid")
        out[key.decode().removeprefix("rq:worker:")] = int(pid) if pid else -1
    return out


def new_registration(r: redis.Redis, before: set[str], timeout_s: float = 5.0) -> str:
    found: set[str] = wait_for(
        lambda: set(registered(r)) - before, timeout_s=timeout_s, what="a worker registered"
    )
    (name,) = found
    return name


def run_one(world: World, prompt: str) -> None:
    job_id = world.enqueue(prompt)
    record = world.wait_state(job_id, {"done", "failed", "spilled", "abandoned"}, timeout_s=15)
    assert record.state.value == "done"
    assert world.store.text(job_id) == world.canonical(prompt)


@needs_namespaces
def test_a_worker_killed_as_pid_1_and_started_again_serves_at_once(world: World) -> None:
    r = world.store.redis
    janitor = world.cluster.janitor()
    first = container(world, "incarnation-1")
    old = new_registration(r, set())
    assert pid_of(old) == 1 and registered(r)[old] == 1  # PID 1, as in a container
    run_one(world, "Before the kill")
    # The janitor has looked at the connections (a worker it never saw is left to its
    # leases: it started and died between two looks).
    wait_for(lambda: "sweeping every" in janitor.output(), timeout_s=10, what="the janitor")
    time.sleep(0.6)
    first.kill()  # an OOM kill: no death registered
    started = time.monotonic()
    container(world, "incarnation-2")
    new = new_registration(r, {old})
    took = time.monotonic() - started
    assert new != old and pid_of(new) == 1
    # Registered and dequeuing within seconds, not once RQ's worker TTL runs out (8 min).
    assert took < 5.0, took
    run_one(world, "After the restart")
    # The janitor retired the killed incarnation: rq info lists only the live one.
    wait_for(lambda: set(registered(r)) == {new}, timeout_s=5, what=f"only {new}: {registered(r)}")
    assert "There exists an active worker" not in world.cluster.logs(tail=None)


@needs_namespaces
def test_two_containers_on_one_host_both_pid_1_never_collide(world: World) -> None:
    r = world.store.redis
    container(world, "container-a")
    a = new_registration(r, set())
    container(world, "container-b")
    b = new_registration(r, {a})
    assert a != b and pid_of(a) == pid_of(b) == 1
    assert a.rsplit("-", 2)[0] == b.rsplit("-", 2)[0]  # the same host, readable at the front
    prompts = [f"Side by side {i}" for i in range(8)]
    ids = [world.enqueue(p) for p in prompts]
    for job_id, prompt in zip(ids, prompts, strict=True):
        assert world.wait_state(job_id, {"done", "failed"}, timeout_s=20).state.value == "done"
        assert world.store.text(job_id) == world.canonical(prompt)
    workers = {a["worker"] for j in ids for a in world.store.ledger(j)}
    assert workers <= {a, b}
