"""RQ's registries say what became of each attempt, read with ``rq info`` itself: an
attempt that was cut and handed its job on is finished, never failed; an attempt whose
job resumeq failed is failed, with the reason; a cancelled, fenced-out or dead attempt
is canceled. ``rq info``'s failed count is the number of jobs that need a person.

And ``resumeq worker --burst`` waits for a retry it scheduled instead of leaving the job
queued, and says what it leaves that is due later."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_support import World, make_world
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer

from resumeq.fake import FakeProvider
from resumeq.queue.queueing import attempt_rq_id
from resumeq.store import Store
from resumeq.testing import RedisServer
from resumeq.testing.processes import descendants, wait_for

ENDED = {"done", "failed", "cancelled", "abandoned", "dropped"}
QUEUE = "resumeq"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("rq-view")
    with RedisServer() as server, FakeProvider(completion_tokens=120) as fake:
        store = Store.from_url(server.url)
        yield from make_world(tmp, store, fake, server.url)


@pytest.fixture(autouse=True)
def fresh(world: World) -> Iterator[None]:
    world.fake.reset()
    world.fake.completion_tokens = 120
    world.fake.token_delay_ms = 0
    world.store.redis.flushall()
    yield
    world.cluster.stop()
    world.cluster.procs.clear()


def rq_info(world: World) -> dict[str, int]:
    url = world.cluster.env["RESUMEQ_REDIS_URL"]
    out = subprocess.run(
        [sys.executable, "-m", "rq.cli", "info", "--raw", "--only-queues", "-u", url, QUEUE],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    m = re.search(r"^queue resumeq (\d+), (\d+) executing, (\d+) finished, (\d+) failed$",
                  out.stdout, re.M)  # fmt: skip
    assert m, out.stdout
    queued, executing, finished, failed = map(int, m.groups())
    return {"queued": queued, "executing": executing, "finished": finished, "failed": failed}


def newest(pids: list[int]) -> int:
    """The process started last (the work horse, forked for the attempt running now)."""

    def started(pid: int) -> int:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[19])  # field 22: start time

    return max(pids, key=started)


def rq_job(world: World, job_id: str, attempt: int) -> Job:
    rq_id = attempt_rq_id(job_id, attempt)
    return Job.fetch(rq_id, connection=world.store.redis, serializer=JSONSerializer)


@pytest.mark.timeout(120)
def test_rq_info_counts_failed_exactly_the_jobs_that_need_a_person(world: World) -> None:
    world.fake.token_delay_ms = 5
    worker = world.cluster.worker()
    world.cluster.janitor(interval_s=0.3)
    # cut twice and resumed: done, each attempt finished
    world.fake.add_faults([{"kind": "disconnect", "after_tokens": 30, "times": 2,
                            "match": "cut twice"}])  # fmt: skip
    resumed = world.enqueue("A poem that is cut twice.")
    # refused by the provider, and a profile no worker knows: failed, needing a person
    world.fake.add_faults([{"kind": "status", "status": 401, "match": "key is wrong"}])
    refused = world.enqueue("A request whose key is wrong.")
    unknown = world.enqueue("A request for nobody.", provider="no-such-profile")
    for job_id in (resumed, refused, unknown):
        world.wait_state(job_id, ENDED)
    # cancelled mid-stream: its attempt is canceled
    world.fake.token_delay_ms = 40
    cancelled = world.enqueue("A long story to cancel.")
    world.wait_spent(cancelled, 16)
    world.store.cancel(cancelled, reason="changed my mind")
    # the worker killed mid-stream: the janitor hands the job on to another worker
    horse_killed = world.enqueue("A story whose worker dies.")
    world.wait_spent(horse_killed, 16)
    worker.kill()
    world.cluster.worker()
    world.fake.token_delay_ms = 0
    world.wait_state(horse_killed, ENDED, timeout_s=40)
    wait_for(lambda: rq_info(world)["executing"] == 0, timeout_s=20, what="no attempt executing")

    states = {j: world.store.get(j).state.value for j in (resumed, refused, unknown, cancelled,
                                                         horse_killed)}  # fmt: skip
    assert states == {resumed: "done", refused: "failed", unknown: "failed",
                      cancelled: "cancelled", horse_killed: "done"}  # fmt: skip
    info = rq_info(world)
    assert info["failed"] == 2 == sum(1 for s in states.values() if s == "failed")
    assert info["executing"] == 0 and info["queued"] == 0

    assert [rq_job(world, resumed, n).get_status() for n in (1, 2, 3)] == [JobStatus.FINISHED] * 3
    for job_id, why in ((refused, "401"), (unknown, "no-such-profile")):
        job = rq_job(world, job_id, 1)
        assert job.get_status() == JobStatus.FAILED
        result = job.latest_result()
        assert result is not None and f"resumeq failed job {job_id}" in (result.exc_string or "")
        assert why in (result.exc_string or "")
    assert rq_job(world, cancelled, 1).get_status() == JobStatus.CANCELED
    assert rq_job(world, horse_killed, 1).get_status() == JobStatus.CANCELED
    assert rq_job(world, horse_killed, 2).get_status() == JobStatus.FINISHED


@pytest.mark.timeout(120)
def test_a_forking_worker_counts_a_dead_work_horse_canceled(world: World) -> None:
    """``rq worker -w resumeq.worker.rq_worker.ForkingWorker``: a process per attempt; a work horse
    killed mid-stream (its worker lives on) is canceled, and the janitor hands the job on."""
    world.fake.token_delay_ms = 40
    url = world.cluster.env["RESUMEQ_REDIS_URL"]
    worker = world.cluster.spawn(
        "forking-worker",
        [sys.executable, "-m", "rq.cli", "worker", "-w", "resumeq.worker.rq_worker.ForkingWorker",
         "-S", "rq.serializers.JSONSerializer", "-u", url, QUEUE],
    )  # fmt: skip
    world.cluster.janitor(interval_s=0.3)
    job_id = world.enqueue("A story whose horse dies.")
    world.wait_spent(job_id, 16)
    os.kill(newest(descendants(worker.pid)), signal.SIGKILL)
    world.fake.token_delay_ms = 0
    assert world.wait_state(job_id, ENDED, timeout_s=40).state.value == "done"
    wait_for(lambda: rq_info(world)["executing"] == 0, timeout_s=20, what="no attempt executing")
    assert rq_job(world, job_id, 1).get_status() == JobStatus.CANCELED
    assert rq_job(world, job_id, 2).get_status() == JobStatus.FINISHED
    assert "attempt " + attempt_rq_id(job_id, 1) + " died" in worker.output()


@pytest.mark.timeout(120)
def test_burst_waits_for_the_retry_it_scheduled(world: World, tmp_path: Path) -> None:
    world.fake.add_faults([{"kind": "status", "status": 503, "retry_after": 2,
                            "match": "briefly down"}])  # fmt: skip
    job_id = world.enqueue("A request while the provider is briefly down.")
    started = time.monotonic()
    burst = world.cluster.command("worker", "--burst")
    assert burst.wait(timeout=60) == 0, burst.output()
    assert time.monotonic() - started >= 2  # it waited for the Retry-After
    record = world.store.get(job_id)
    assert (record.state.value, record.attempt) == ("done", 2), burst.output()
    assert "burst: waiting" in burst.output()


@pytest.mark.timeout(120)
def test_burst_says_what_it_leaves_for_later(world: World) -> None:
    world.fake.add_faults([{"kind": "status", "status": 429, "retry_after": 120,
                            "match": "come back later"}])  # fmt: skip
    job_id = world.enqueue("A request told to come back later.")
    burst = world.cluster.command("worker", "--burst")
    assert burst.wait(timeout=60) == 0, burst.output()
    record = world.store.get(job_id)
    assert (record.state.value, record.attempt) == ("queued", 1)
    assert f"burst: leaving {attempt_rq_id(job_id, 2)} on queue {QUEUE}, scheduled in" in (
        burst.output()
    )
