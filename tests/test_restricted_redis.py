"""Redis as managed services and locked-down deployments run it (SPEC §21): ``CLIENT``
renamed away, and the usual application ACL (``+@all -@dangerous``, keys and channels as
docs/operations.md's minimal ACL has them). Workers, janitors and ``resumeq serve`` run; jobs end
exact; each process says once, at WARNING, what it falls back to; a killed worker's jobs
go on when its leases expire."""

from __future__ import annotations

import json
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis
from e2e_support import World, make_world

from resumeq.fake import FakeProvider
from resumeq.store import Store
from resumeq.testing import RedisServer
from resumeq.testing.processes import wait_for
from resumeq.testing.redis_server import free_port

pytestmark = pytest.mark.timeout(120)

OPERATIONS = Path(__file__).resolve().parent.parent / "docs" / "operations.md"


def documented_acl() -> tuple[str, ...]:
    """The rules of docs/operations.md's ``ACL SETUSER`` line (after the name, ``on`` and the
    password) less its ``+client|...`` ones: what the processes do without is under test."""
    text = OPERATIONS.read_text(encoding="utf-8")
    line = next(line for line in text.splitlines() if line.startswith("ACL SETUSER "))
    rules = tuple(r for r in line.split()[5:] if not r.startswith("+client|"))
    assert "-@dangerous" in rules and "~resumeq:*" in rules, line
    return rules


#: The documented ACL for a deployment's processes, less what -@dangerous takes.
ACL = documented_acl()


@dataclass
class Restricted:
    name: str
    server: RedisServer
    url: str
    #: The processes expected to warn, each once, and of which command.
    warns: dict[str, str]


@pytest.fixture(scope="module", params=["client-renamed", "acl-no-dangerous"])
def restricted(request: pytest.FixtureRequest) -> Iterator[Restricted]:
    if request.param == "client-renamed":
        server = RedisServer(args=("--rename-command", "CLIENT", ""))
        warns = {"worker": "CLIENT SETNAME", "janitor": "CLIENT LIST", "serve": "CLIENT ID"}
    else:
        server = RedisServer(args=("--user", "app", "on", ">app-secret", *ACL))
        warns = {"janitor": "CLIENT LIST", "serve": "CLIENT UNBLOCK"}
    server.start()
    try:
        url = server.url
        if request.param == "acl-no-dangerous":
            url = f"redis://app:app-secret@127.0.0.1:{server.port}/0"
        yield Restricted(request.param, server, url, warns)
    finally:
        server.close()


@pytest.fixture
def world(tmp_path: Path, fake: FakeProvider, restricted: Restricted) -> Iterator[World]:
    admin = redis.Redis.from_url(restricted.server.url)  # the default user: all commands
    admin.flushall()
    admin.close()
    store = Store.from_url(restricted.url)
    try:
        yield from make_world(
            tmp_path,
            store,
            fake,
            restricted.url,
            lease_ttl_ms=2_000,
            server_settings={"port": free_port(), "keepalive_s": 1.0},
        )
    finally:
        store.redis.close()


def follow(base: str, job_id: str) -> str:
    """The job's text as its event stream delivers it."""
    text = []
    with (
        httpx.Client(base_url=base, timeout=30) as http,
        http.stream("GET", f"/v1/jobs/{job_id}/events") as response,
    ):
        assert response.status_code == 200
        event = None
        for line in response.iter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: ") and event == "delta":
                text.append(json.loads(line[6:])["text"])
            elif line.startswith("data: ") and event == "end":
                break
    return "".join(text)


def test_every_process_runs_and_says_once_what_it_falls_back_to(
    world: World, restricted: Restricted
) -> None:
    world.fake.completion_tokens = 120
    world.fake.token_delay_ms = 5
    worker = world.cluster.worker(concurrency=4)
    janitor = world.cluster.janitor()
    serve = world.cluster.command("serve")
    base = f"http://127.0.0.1:{tomllib.loads(world.config.read_text())['server']['port']}"
    wait_for(lambda: _up(base), timeout_s=30, what="resumeq serve")
    prompts = [f"Restricted Redis, story {i} [fake:mixed]" for i in range(3)]
    ids = [world.enqueue(p) for p in prompts]
    followed = follow(base, ids[0])  # a reader without CLIENT ID or UNBLOCK: polling
    for job_id, prompt in zip(ids, prompts, strict=True):
        record = world.wait_state(job_id, {"done", "failed", "spilled", "abandoned"})
        assert record.state.value == "done"
        assert world.store.text(job_id) == world.canonical(prompt)
    assert followed == world.canonical(prompts[0])
    # A job followed after the reader started also arrives whole.
    late = world.enqueue("Followed once the reader runs")
    assert follow(base, late) == world.canonical("Followed once the reader runs")
    for name, proc in {"worker": worker, "janitor": janitor, "serve": serve}.items():
        said = [line for line in proc.output().splitlines() if "warning: Redis" in line]
        if name not in restricted.warns:
            assert said == [], said
            continue
        assert len(said) == 1, said
        line = said[0]
        assert f"resumeq {name}: warning:" in line and restricted.warns[name] in line
        assert "+client|" in line  # the ACL rule that would restore it
    assert "Traceback" not in world.cluster.logs(tail=None)
    assert "command not supported" not in worker.output()  # RQ is not left to warn again


def test_a_killed_workers_jobs_go_on_when_its_leases_expire(world: World) -> None:
    world.fake.completion_tokens = 400
    world.fake.token_delay_ms = 10
    world.cluster.janitor()
    doomed = world.cluster.worker(concurrency=2)
    prompt = "A worker killed on a restricted Redis"
    job_id = world.enqueue(prompt)
    world.wait_spent(job_id, 30)
    time.sleep(0.6)  # the janitor has looked (or found it cannot)
    doomed.kill()
    killed = time.monotonic()
    world.fake.token_delay_ms = 0  # the continuation at full speed
    world.cluster.worker(concurrency=2)
    wait_for(lambda: world.store.ledger(job_id), timeout_s=15, what="the dead attempt reaped")
    took = time.monotonic() - killed
    record = world.wait_state(job_id, {"done", "failed", "spilled", "abandoned"})
    assert record.state.value == "done" and world.store.text(job_id) == world.canonical(prompt)
    first = world.store.ledger(job_id)[0]
    assert first["cut"] == "worker_died" and first["detail"].startswith("lease expired")
    # The lease (2 s, renewed every 0.67 s), not the connections (about half a second).
    assert 1.0 <= took <= 6.0, took


def _up(base: str) -> bool:
    try:
        return httpx.get(f"{base}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False
