"""What a new user sees when something is wrong: one line naming the cause, never a
traceback; and the human views saying only what is known (the console script, run as a
real process)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from resumeq.core.ledger import AttemptRecord
from resumeq.store import Store
from resumeq.testing import RedisServer, free_port

RESUMEQ = [sys.executable, "-m", "resumeq"]
SPEC = {"prompt": "hi", "provider": "local", "model": "m", "budget_tokens": 100}


def run(
    *args: str, url: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "RESUMEQ_REDIS_URL": url, **(env or {})}
    full.pop("RESUMEQ_CONFIG", None)
    return subprocess.run(
        [*RESUMEQ, *args], capture_output=True, text=True, env=full, timeout=30, check=False
    )


def one_line(out: subprocess.CompletedProcess[str], *needles: str) -> str:
    """The error line, after checking it is the only thing on stderr."""
    assert out.returncode == 1, (out.returncode, out.stderr)
    assert "Traceback" not in out.stderr, out.stderr
    assert out.stderr.count("\n") == 1, out.stderr
    for needle in needles:
        assert needle in out.stderr, out.stderr
    return out.stderr


@pytest.fixture(scope="module")
def locked_redis() -> Iterator[RedisServer]:
    """A redis-server that requires a password."""
    server = RedisServer(password="right-password")
    server.start()
    try:
        yield server
    finally:
        server.close()


def with_password(server: RedisServer, password: str | None) -> str:
    auth = f":{password}@" if password is not None else ""
    return f"redis://{auth}127.0.0.1:{server.port}/0"


# -- Redis that cannot be reached or refuses the login -------------------------------------


def test_stats_with_an_unknown_host_is_one_line() -> None:
    out = run("--redis-url", "redis://no-such-host.invalid:6379/0", "stats", url="redis://x")
    one_line(out, "Redis unreachable", "no-such-host.invalid")


def test_stats_with_nothing_listening_is_one_line() -> None:
    one_line(run("stats", url=f"redis://127.0.0.1:{free_port()}/0"), "Redis unreachable")


@pytest.mark.parametrize("command", [("stats",), ("status", "abc"), ("spill", "list")])
@pytest.mark.parametrize("password", ["wrong-password", None], ids=["wrong", "none"])
def test_a_refused_login_says_so(
    locked_redis: RedisServer, command: tuple[str, ...], password: str | None
) -> None:
    line = one_line(
        run(*command, url=with_password(locked_redis, password)),
        "Redis refused the credentials",
    )
    assert "unreachable" not in line and "wrong-password" not in line


def test_worker_with_nothing_listening_is_one_line() -> None:
    out = run("worker", "--burst", url=f"redis://127.0.0.1:{free_port()}/0")
    one_line(out, "Redis unreachable")


def test_worker_with_a_bad_url_is_one_line() -> None:
    one_line(run("worker", "--burst", url="nosuchscheme://host"), "Redis URL")


@pytest.mark.parametrize("password", ["wrong-password", None], ids=["wrong", "none"])
def test_worker_with_a_refused_login_is_one_line(
    locked_redis: RedisServer, password: str | None
) -> None:
    out = run("worker", "--burst", url=with_password(locked_redis, password))
    one_line(out, "Redis refused the credentials")


def test_janitor_once_with_redis_down_is_one_line() -> None:
    one_line(
        run("janitor", "--once", url=f"redis://127.0.0.1:{free_port()}/0"), "Redis unreachable"
    )


@pytest.mark.timeout(30)
def test_janitor_with_redis_down_logs_one_line_per_sweep_and_backs_off() -> None:
    env = {**os.environ, "RESUMEQ_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}
    env.pop("RESUMEQ_CONFIG", None)
    proc = subprocess.Popen(
        [*RESUMEQ, "janitor", "--interval", "0.2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        time.sleep(4)
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if "sweeping every" not in line]
    assert all("sweep failed" in line and "Redis unreachable" in line for line in lines), err
    # 0.2 s apart without backoff: about 15 sweeps in 4 s; doubling: 0.4, 0.8, 1.6, 3.2 s.
    assert 2 <= len(lines) <= 5, err
    assert re.search(r"next sweep in 0\.8 s", err), err


# -- cancel --------------------------------------------------------------------------------


def test_cancel_of_an_ended_job_shows_the_job(redis_server: RedisServer, real_store: Store) -> None:
    job_id = real_store.create(SPEC).id
    got = real_store.acquire(job_id, worker="w1", ttl_ms=5000)
    real_store.flush(got.lease, expected_revision=1, delta="Hello", tokens=1)
    real_store.finish(got.lease, state="done", finish_reason="stop")
    out = run("cancel", job_id, "--json", url=redis_server.url)
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert info["already_ended"] is True
    assert (info["id"], info["state"], info["text"], info["revision"]) == (
        job_id,
        "done",
        "Hello",
        3,
    )
    human = run("cancel", job_id, url=redis_server.url)
    assert human.returncode == 0, human.stderr
    assert f"{job_id} had already ended (done" in human.stdout
    assert real_store.get(job_id).state.value == "done"


def test_cancel_json_prints_the_cancelled_job(redis_server: RedisServer, real_store: Store) -> None:
    job_id = real_store.create(SPEC).id
    out = run("cancel", job_id, "--json", url=redis_server.url)
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert info["state"] == "cancelled" and info["already_ended"] is False
    assert info["reason"] == "cancelled by operator"


# -- the worker's start ----------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_worker_warns_of_each_missing_api_key_variable(
    redis_server: RedisServer, redis_client: redis.Redis, tmp_path: Path
) -> None:
    config = tmp_path / "resumeq.toml"
    config.write_text(
        '[providers.present]\nkind = "openai"\nbase_url = "http://127.0.0.1:9/v1"\n'
        'api_key_env = "RESUMEQ_TEST_KEY_PRESENT"\n'
        '[providers.absent]\nkind = "openai"\nbase_url = "http://127.0.0.1:9/v1"\n'
        'api_key_env = "RESUMEQ_TEST_KEY_ABSENT"\n'
        '[providers.empty]\nkind = "anthropic"\nbase_url = "http://127.0.0.1:9"\n'
        'api_key_env = "RESUMEQ_TEST_KEY_EMPTY"\n'
        '[providers.keyless]\nkind = "fake"\nbase_url = "http://127.0.0.1:9/v1"\n'
    )
    env = {"RESUMEQ_TEST_KEY_PRESENT": "k", "RESUMEQ_TEST_KEY_EMPTY": ""}
    os.environ.pop("RESUMEQ_TEST_KEY_ABSENT", None)
    out = run("--config", str(config), "worker", "--burst", url=redis_server.url, env=env)
    assert out.returncode == 0, out.stderr
    warnings = [line for line in out.stderr.splitlines() if line.startswith("resumeq: warning")]
    assert len(warnings) == 2, out.stderr
    assert "profile 'absent'" in warnings[0] and "RESUMEQ_TEST_KEY_ABSENT" in warnings[0]
    assert "profile 'empty'" in warnings[1] and "RESUMEQ_TEST_KEY_EMPTY" in warnings[1]
    assert "present" not in out.stderr.replace("RESUMEQ_TEST_KEY_PRESENT", "")


# -- status, as a person reads it ------------------------------------------------------------


def status_lines(job_id: str, url: str) -> dict[str, list[str]]:
    out = run("status", job_id, url=url)
    assert out.returncode == 0, out.stderr
    lines: dict[str, list[str]] = {}
    for line in out.stdout.splitlines():
        key, sep, value = line.partition(": ")
        if sep and key.strip() and key == key.rjust(12):
            lines.setdefault(key.strip(), []).append(value)
    assert "None" not in out.stdout.split(" text: ")[0], out.stdout
    return lines


def test_status_of_a_job_that_failed_after_a_spill(
    redis_server: RedisServer, real_store: Store
) -> None:
    job_id = real_store.create(SPEC).id
    got = real_store.acquire(job_id, worker="w1", ttl_ms=5000)
    real_store.flush(got.lease, expected_revision=1, delta="partial", tokens=3)
    first = AttemptRecord(
        attempt=1, kind="fresh", worker="w1", outcome="spill", cut="disconnected",
        output_tokens_persisted=3, chars_persisted=7, bytes_persisted=7,
        input_tokens=12, output_tokens=4, counts_exact=True, count_source="usage",
    )  # fmt: skip
    real_store.release(
        got.lease, to="spilled", reason="below the floor", ledger=first.to_json_dict()
    )
    real_store.requeue(job_id)
    got = real_store.acquire(job_id, worker="w2", ttl_ms=5000)
    second = AttemptRecord(attempt=2, kind="resume", worker="w2", outcome="failed", cut="fatal")
    error = "provider refused the request: 401 unauthorized"
    real_store.finish(got.lease, state="failed", error=error, ledger=second.to_json_dict())

    lines = status_lines(job_id, redis_server.url)
    assert lines["error"] == [error]
    assert "reason" not in lines and "finish" not in lines  # not "requeued from spill"
    one, two = lines["attempt"][1:]
    assert "in 12" in one and "out 4" in one and "7 chars" in one and "7 bytes" in one
    assert "in " not in two and "out " not in two  # the provider said nothing: not shown


def test_status_of_a_reaped_attempt_says_its_chars_are_unknown(
    redis_server: RedisServer, real_store: Store
) -> None:
    job_id = real_store.create(SPEC).id
    got = real_store.acquire(job_id, worker="w1", ttl_ms=5000)
    real_store.flush(got.lease, expected_revision=1, delta="x" * 1501, tokens=60)
    # A record as janitors wrote it before they counted characters.
    reaped = AttemptRecord(
        attempt=1, kind="fresh", worker="w1", outcome="resume", cut="worker_died",
        output_tokens_persisted=60, bytes_persisted=1501,
    )  # fmt: skip
    real_store.release(got.lease, to="queued", reason="worker_died", ledger=reaped.to_json_dict())
    lines = status_lines(job_id, redis_server.url)
    (attempt,) = lines["attempt"][1:]
    assert "1501 bytes" in attempt and "chars unknown" in attempt and "0 chars" not in attempt
    assert lines["reason"] == ["worker_died"]


def test_status_of_a_running_job_shows_its_lease(
    redis_server: RedisServer, real_store: Store
) -> None:
    job_id = real_store.create(SPEC).id
    got = real_store.acquire(job_id, worker="worker-7", ttl_ms=60_000)
    real_store.flush(got.lease, expected_revision=1, delta="Hello", tokens=1)
    lines = status_lines(job_id, redis_server.url)
    assert "reason" not in lines
    (lease,) = lines["lease"]
    m = re.fullmatch(r"held by worker-7 \(attempt 1\), expires in (\d+\.\d) s", lease)
    assert m and 40 < float(m.group(1)) <= 60, lease  # a loaded machine starts the CLI slowly

    info = json.loads(run("status", job_id, "--json", url=redis_server.url).stdout)
    assert info["lease"]["holder"] == "worker-7" and info["lease"]["attempt"] == 1
    assert 40_000 < info["lease"]["expires_in_ms"] <= 60_000
    real_store.finish(got.lease, state="done", finish_reason="stop")
    info = json.loads(run("status", job_id, "--json", url=redis_server.url).stdout)
    assert info["lease"] is None
    lines = status_lines(job_id, redis_server.url)
    assert lines["finish"] == ["stop"] and "lease" not in lines and "error" not in lines


def test_a_config_file_with_several_problems_reports_each(tmp_path: Path) -> None:
    config = tmp_path / "resumeq.toml"
    config.write_text("[worker]\nflush_tokens = 0\nlease_ttl_ms = 1\n[janitor]\ninterval_s = 0\n")
    out = run("--config", str(config), "stats", url=f"redis://127.0.0.1:{free_port()}/0")
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.splitlines()
    assert [line.split(": ")[2] for line in lines] == [
        "worker.flush_tokens",
        "worker.lease_ttl_ms",
        "janitor.interval_s",
    ], lines
    assert all(line.startswith(f"resumeq: config file {config}: ") for line in lines)
