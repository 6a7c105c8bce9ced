"""End to end: one worker process running many attempts at once (``--concurrency``), with
RQ's registries truthful, a SIGKILL costing at most a flush interval per stream, a SIGTERM
handing every stream on at once, and a cancel stopping exactly one stream (SPEC §16)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_support import TERMINAL, World, make_world
from rq.registry import StartedJobRegistry

from resumeq.fake import FakeProvider
from resumeq.queue.queueing import attempt_rq_id, rq_queue
from resumeq.store import Store, keys
from resumeq.testing import RedisServer
from resumeq.testing.processes import Proc, descendants, wait_for
from resumeq.worker import heap

# CPU-bound (50 streams a process, bounds on what a busy process leaves unread): never
# beside another such test (``--dist loadgroup`` runs a group on one worker).
pytestmark = [pytest.mark.timeout(150), pytest.mark.xdist_group("cpu-heavy")]

FLUSH_TOKENS = 8


@pytest.fixture
def world(
    tmp_path: Path, real_store: Store, fake: FakeProvider, redis_server: RedisServer
) -> Iterator[World]:
    yield from make_world(tmp_path, real_store, fake, redis_server.url, flush_tokens=FLUSH_TOKENS)


def prompts(n: int, what: str) -> list[str]:
    return [f"Stream {i:03d} of {n}: {what}." for i in range(n)]


def started_ids(world: World) -> set[str]:
    """The RQ job ids in the StartedJobRegistry (its executions, by job)."""
    registry = StartedJobRegistry(queue=rq_queue("resumeq", world.store.redis))  # type: ignore[no-untyped-call]
    return set(registry.get_job_ids())


def running(world: World, job_ids: list[str]) -> list[str]:
    return [j for j in job_ids if world.store.get(j).state.value == "running"]


def streaming(world: World, job_ids: list[str], at_least: int) -> bool:
    return all(world.store.get(j).spent_output_tokens >= at_least for j in job_ids)


def lost_at_first_cut(world: World, job_id: str, prompt: str) -> int:
    """Output tokens the provider sent (and billed) on the job's first request that were
    not kept: sent, minus the prefix the next attempt started from."""
    first = world.requests_for(prompt)[0]
    return int(first["tokens_emitted"]) - int(world.store.ledger(job_id)[1]["prefix_tokens"])


def start_streams(
    world: World, n: int, what: str, *, tokens: int, at_least: int = 16
) -> tuple[Proc, list[str], list[str]]:
    """One worker with ``--concurrency n`` streaming n jobs of ``tokens`` tokens, 20 ms
    apart; returned once each has checkpointed ``at_least`` tokens."""
    world.fake.completion_tokens = tokens
    world.fake.token_delay_ms = 20
    worker = world.cluster.worker(concurrency=n)
    texts = prompts(n, what)
    job_ids = [world.enqueue(p) for p in texts]
    wait_for(lambda: streaming(world, job_ids, at_least), timeout_s=40, what=f"{n} streams")
    return worker, texts, job_ids


def finish_elsewhere(
    world: World, job_ids: list[str], texts: list[str], *, janitor: bool = False
) -> None:
    """Another worker (and a janitor, for leases left to expire) takes the jobs on; each
    ends with its canonical text."""
    world.fake.token_delay_ms = 0
    world.cluster.worker(concurrency=len(job_ids))
    if janitor:
        world.cluster.janitor()
    for job_id in job_ids:
        world.wait_state(job_id, TERMINAL, timeout_s=60)
    assert_canonical(world, job_ids, texts)


def assert_canonical(world: World, job_ids: list[str], texts: list[str]) -> None:
    for job_id, prompt in zip(job_ids, texts, strict=True):
        record = world.store.get(job_id)
        assert record.state.value == "done", (job_id, record.state, record.reason, record.error)
        assert world.store.text(job_id) == world.canonical(prompt), job_id


def test_a_hundred_jobs_with_cuts_through_one_process(world: World) -> None:
    world.fake.completion_tokens = 120
    world.fake.token_delay_ms = 2
    world.fake.chaos(0.3, kinds=("disconnect", "truncate"), seed=13)
    worker = world.cluster.worker(concurrency=50)
    world.cluster.janitor()
    texts = prompts(100, "cut at random")
    # Five cuts in a row spill a job (max_attempts 5): at 30 % a request, 0.3^5 a job, and
    # one of a hundred jobs now and then (it did once in a full suite). What is tested here
    # is the process, not the exit.
    job_ids = [world.enqueue(p, exit={"max_attempts": 20}) for p in texts]
    samples = []
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        samples.append(len(started_ids(world)))
        if all(world.store.get(j).state.value in TERMINAL for j in job_ids):
            break
        time.sleep(0.05)
    world.fake.chaos(0)
    assert_canonical(world, job_ids, texts)
    # never more attempts in RQ's started registry than the worker runs at once; none left
    assert max(samples) <= 50 and max(samples) > 1
    wait_for(lambda: not started_ids(world), timeout_s=10, what="an empty started registry")
    cut = [j for j in job_ids if world.store.get(j).attempt > 1]
    assert cut, "the chaos cut no stream"
    assert descendants(worker.pid) == []  # RQ's scheduler runs on a thread, not a child


def test_the_started_registry_holds_exactly_the_attempts_in_flight(world: World) -> None:
    world.fake.completion_tokens = 150
    world.fake.token_delay_ms = 30
    world.cluster.worker(concurrency=20)
    texts = prompts(30, "sampled")
    job_ids = [world.enqueue(p) for p in texts]
    wait_for(lambda: len(running(world, job_ids)) == 20, timeout_s=30, what="20 attempts running")
    for _ in range(8):
        time.sleep(0.3)
        with world.store.redis.pipeline(transaction=True) as pipe:  # one moment for both
            pipe.zrange(
                StartedJobRegistry(queue=rq_queue("resumeq", world.store.redis)).key,
                0,
                -1,  # type: ignore[no-untyped-call]
            )
            for j in job_ids:
                pipe.hmget(keys.job(j), "state", "attempt")
            reply = pipe.execute()
        in_registry = {m.decode().split(":")[0] for m in reply[0]}
        in_flight = {
            attempt_rq_id(j, int(attempt))
            for j, (state, attempt) in zip(job_ids, reply[1:], strict=True)
            if state == b"running"
        }
        assert len(in_flight) == 20
        assert in_registry == in_flight
    world.fake.token_delay_ms = 0  # the ten still queued start after the first ones end
    assert all(world.wait_state(j, TERMINAL, timeout_s=60).state.value == "done" for j in job_ids)


@pytest.mark.parametrize("how", ["process", "group"])
def test_sigterm_hands_every_stream_on_at_once(world: World, how: str) -> None:
    first, texts, job_ids = start_streams(world, 50, f"handed off ({how})", tokens=600)
    signalled = time.monotonic()
    if how == "process":  # Kubernetes, `kill PID`
        os.kill(first.pid, signal.SIGTERM)
    else:  # systemd's control group, Ctrl-C in a terminal
        os.killpg(first.pid, signal.SIGTERM)
    assert first.wait(timeout=10) == 0, first.output()[-3000:]
    assert time.monotonic() - signalled <= 3.0, first.output()[-3000:]
    # handed back at once: queued, not running with a lease left to expire (a short
    # canonical completion may have ended first)
    states = {j: world.store.get(j).state.value for j in job_ids}
    assert set(states.values()) <= {"queued", "done"}, states
    handed = [j for j in job_ids if states[j] == "queued"]
    assert len(handed) >= 40, states
    finish_elsewhere(world, job_ids, texts)
    extra = []
    for job_id, prompt in zip(job_ids, texts, strict=True):
        if job_id not in handed:
            continue
        ledger = world.store.ledger(job_id)
        assert ledger[0]["outcome"] == "handoff" and ledger[0]["cut"] == "handoff", ledger[0]
        assert ledger[1]["worker"] != ledger[0]["worker"]
        extra.append(lost_at_first_cut(world, job_id, prompt))
    # Nothing paid twice: every token received was made durable and the continuation
    # started from it. Paid for and lost: only what the provider sent before it saw the
    # connection close (on the wire, or not yet read by a busy process — the bound allows
    # for a loaded machine; test_worker_context.py holds one stream to a token).
    print("tokens sent and not kept, per handed-off stream:", sorted(extra))
    assert sum(extra) <= FLUSH_TOKENS * len(extra), sorted(extra)
    assert max(extra) <= 3 * FLUSH_TOKENS, sorted(extra)


def test_sigterm_beside_two_cpu_burners_exits_within_three_seconds(world: World) -> None:
    """A busy machine (two processes burning the two cores): once the handoff is durable,
    nothing stands between the worker and its exit (interpreter teardown, a collection
    of every object the streams made, took seconds more)."""
    burners = [
        world.cluster.spawn(f"burner-{i}", [sys.executable, "-c", "while True: pass"])
        for i in range(2)
    ]
    try:
        first, texts, job_ids = start_streams(world, 40, "handed off when busy", tokens=600)
        signalled = time.monotonic()
        os.kill(first.pid, signal.SIGTERM)
        assert first.wait(timeout=15) == 0, first.output()[-3000:]
        took = time.monotonic() - signalled
    finally:
        for burner in burners:
            burner.kill()
    print(f"exit {took:.2f} s after the SIGTERM, beside two CPU burners")
    assert took <= 3.0, first.output()[-3000:]
    states = {j: world.store.get(j).state.value for j in job_ids}
    assert set(states.values()) <= {"queued", "done"}, states
    # RQ heard of the death before the exit: rq info no longer lists the worker.
    assert not world.store.redis.smembers("rq:workers")
    finish_elsewhere(world, job_ids, texts)


def test_a_second_signal_is_a_cold_stop(world: World) -> None:
    worker, texts, job_ids = start_streams(world, 5, "stopped cold", tokens=300, at_least=8)
    # Redis busy for 3 s: the handoff cannot finish before the second signal comes
    sleeper = threading.Thread(target=world.store.redis.execute_command, args=("DEBUG", "SLEEP", 3))
    sleeper.start()
    time.sleep(0.2)
    os.kill(worker.pid, signal.SIGTERM)
    time.sleep(0.3)
    os.kill(worker.pid, signal.SIGTERM)
    assert worker.wait(timeout=15) == 1
    sleeper.join()
    assert "cold shut down: 5 lease(s) left to expire" in worker.output()
    finish_elsewhere(world, job_ids, texts, janitor=True)
    firsts = [world.store.ledger(j)[0] for j in job_ids]
    assert all(f["cut"] == "worker_died" for f in firsts), [
        (f["cut"], f["outcome"], f["detail"]) for f in firsts
    ]


def test_sigkill_of_fifty_streams_costs_at_most_a_flush_each(world: World) -> None:
    victim, texts, job_ids = start_streams(world, 50, "killed", tokens=1000)
    victim.kill()
    finish_elsewhere(world, job_ids, texts, janitor=True)
    extra = []
    for job_id, prompt in zip(job_ids, texts, strict=True):
        assert world.store.ledger(job_id)[0]["cut"] == "worker_died"
        extra.append(lost_at_first_cut(world, job_id, prompt))
    # What arrived after a stream's last flush was lost with the process: at most a flush
    # interval (8 tokens), plus what was on the wire or not yet read by a busy process (on
    # average about half an interval, and up to one more under load: a suite beside it
    # measured 8.6 a stream).
    print("tokens sent and not kept, per killed stream:", sorted(extra))
    assert sum(extra) <= 1.5 * FLUSH_TOKENS * len(extra), sorted(extra)
    assert max(extra) <= 2 * FLUSH_TOKENS, sorted(extra)


def test_cancel_stops_exactly_one_stream_among_fifty(world: World) -> None:
    _, texts, job_ids = start_streams(world, 50, "one cancelled", tokens=300)
    victim = job_ids[17]
    world.store.cancel(victim)  # as a producer does (the command line's is tested elsewhere)
    cancelled_at = time.monotonic()
    record = world.wait_state(victim, TERMINAL, timeout_s=10)
    assert record.state.value == "cancelled"
    # its stream is closed within a flush interval; the provider saw the client go
    wait_for(
        lambda: world.requests_for(texts[17])[-1]["outcome"] == "client_gone",
        timeout_s=5,
        what="the cancelled stream closed",
    )
    assert time.monotonic() - cancelled_at < 5
    others = [j for j in job_ids if j != victim]
    for job_id in others:
        world.wait_state(job_id, TERMINAL, timeout_s=60)
    assert_canonical(world, others, [t for t in texts if t != texts[17]])


def test_concurrency_must_be_positive(world: World) -> None:
    for bad in ("0", "-3"):
        out = subprocess.run(
            [sys.executable, "-m", "resumeq", "worker", "--concurrency", bad],
            env=world.cluster.env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert out.returncode != 0
        lines = out.stderr.strip().splitlines()
        assert lines == [f"resumeq: --concurrency must be at least 1, not {bad}"], out.stderr


@pytest.mark.skipif(
    not hasattr(os, "confstr") or os.confstr("CS_GNU_LIBC_VERSION") is None,
    reason="glibc's allocator only",
)
def test_a_worker_started_as_a_user_starts_it_runs_without_thread_caches(
    world: World, tmp_path: Path
) -> None:
    """The console script starts itself again with glibc's thread caches off (resumeq.worker.heap),
    under the PID its supervisor knows: the job runs there and a SIGTERM to that PID stops
    it cleanly."""
    env = {k: v for k, v in world.cluster.env.items() if k not in ("GLIBC_TUNABLES", heap._MARK)}
    proc = Proc(
        [sys.executable, "-m", "resumeq", "worker", "--concurrency", "4"],
        env=env,
        log=tmp_path / "user-worker.log",
    )
    world.cluster.procs.append(proc)  # stopped with the cluster if the test fails
    prompt = "Started as a user starts it: a short answer."
    job_id = world.enqueue(prompt)
    assert world.wait_state(job_id, TERMINAL, timeout_s=30).state.value == "done"
    assert world.store.text(job_id) == world.canonical(prompt)
    environ = Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")
    assert f"GLIBC_TUNABLES={heap.TCACHE_OFF}".encode() in environ, environ
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=10) == 0, proc.output()[-3000:]
