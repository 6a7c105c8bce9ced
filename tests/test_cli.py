"""The console script, run as a real process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import httpx
import pytest

from resumeq.store import Store
from resumeq.testing import RedisServer, free_port

RESUMEQ = [sys.executable, "-m", "resumeq"]


def run(*args: str, url: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RESUMEQ_REDIS_URL": url}
    env.pop("RESUMEQ_CONFIG", None)
    return subprocess.run(
        [*RESUMEQ, *args], capture_output=True, text=True, env=env, timeout=30, check=False
    )


def test_status_json(redis_server: RedisServer, real_store: Store) -> None:
    spec = {"prompt": "hi", "provider": "local", "model": "m", "budget_tokens": 100}
    job_id = real_store.create(spec).id
    got = real_store.acquire(job_id, worker="w1", ttl_ms=5000)
    real_store.flush(got.lease, expected_revision=1, delta="Hello", tokens=1)
    out = run("status", job_id, "--json", url=redis_server.url)
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    for field in (
        "id", "state", "text", "budget_tokens", "spent_output_tokens", "counts_exact",
        "revision", "attempts", "finish_reason", "error", "spill_count",
    ):  # fmt: skip
        assert field in info, field
    assert (info["state"], info["text"], info["revision"]) == ("running", "Hello", 2)


def test_cancel(redis_server: RedisServer, real_store: Store) -> None:
    spec = {"prompt": "hi", "provider": "local", "model": "m", "budget_tokens": 100}
    job_id = real_store.create(spec).id
    out = run("cancel", job_id, "--json", url=redis_server.url)
    assert out.returncode == 0 and json.loads(out.stdout)["state"] == "cancelled"
    again = run("cancel", job_id, url=redis_server.url)
    assert again.returncode != 0 and "is cancelled" in again.stderr


@pytest.mark.parametrize(
    ("args", "message", "code"),
    [
        (("status", "nosuchjob"), "no job nosuchjob", 3),
        (("status", "bad{id}"), "malformed job id", 1),
    ],
)
def test_errors_are_one_line(
    redis_server: RedisServer, args: tuple[str, ...], message: str, code: int
) -> None:
    out = run(*args, url=redis_server.url)
    assert out.returncode == code
    assert message in out.stderr and out.stderr.count("\n") == 1
    assert "Traceback" not in out.stderr


def test_unreachable_redis_is_one_line() -> None:
    out = run("status", "abc", url=f"redis://127.0.0.1:{free_port()}/0")
    assert out.returncode == 1
    assert "Redis unreachable" in out.stderr and out.stderr.count("\n") == 1


@pytest.mark.timeout(30)
def test_fake_provider_serves_until_terminated() -> None:
    port = free_port()
    proc = subprocess.Popen(
        [*RESUMEQ, "fake-provider", "--port", str(port), "--completion-tokens", "12"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert f"127.0.0.1:{port}" in proc.stdout.readline()
        body = {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        with httpx.Client(timeout=10) as http:
            text = http.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body).text
        assert '"completion_tokens":12' in text and text.rstrip().endswith("data: [DONE]")
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.communicate(timeout=10)
    assert proc.returncode == 0


def test_fake_provider_refuses_a_bad_port() -> None:
    out = run("fake-provider", "--port", "70000", url="redis://127.0.0.1:1/0")
    assert out.returncode == 2 and "70000" in out.stderr
