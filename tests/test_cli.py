"""The console script, run as a real process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import redis

from resumeq.store import Store
from resumeq.testing import RedisServer, free_port

RESUMEQ = [sys.executable, "-m", "resumeq"]


def run(*args: str, url: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RESUMEQ_REDIS_URL": url}
    env.pop("RESUMEQ_CONFIG", None)
    return subprocess.run(
        [*RESUMEQ, *args], input=input, capture_output=True, text=True, env=env, timeout=30,
        check=False,
    )  # fmt: skip


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
    assert again.returncode == 0 and "had already ended (cancelled" in again.stdout


@pytest.mark.parametrize(
    ("args", "message", "code"),
    [
        (("status", "nosuchjob"), "no job nosuchjob", 3),
        (("status", "bad{id}"), "malformed job id", 1),
        (("enqueue", "--on-cut", "bogus"), "Invalid value for '--on-cut'", 2),
        (("nosuchcommand",), "No such command", 2),
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


def write_profiles(tmp_path: Path) -> Path:
    path = tmp_path / "resumeq.toml"
    path.write_text('[providers.local]\nkind = "openai"\nbase_url = "http://127.0.0.1:9/v1"\n')
    return path


def test_enqueue_json_then_status_and_stats(
    redis_server: RedisServer, redis_client: redis.Redis, tmp_path: Path
) -> None:
    config = write_profiles(tmp_path)
    out = run(
        "--config", str(config), "enqueue", "--provider", "local", "--model", "m",
        "--budget", "300", "--prompt", "Hello", "--floor", "16", "--on-cut", "spill",
        "--no-droppable", "--max-attempts", "3", "--idempotency-key", "cli-1", "--json",
        url=redis_server.url,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    created = json.loads(out.stdout)
    assert created["created"] and created["queue"] == "resumeq"
    again = json.loads(
        run(
            "--config",
            str(config),
            "enqueue",
            "--provider",
            "local",
            "--model",
            "m",
            "--budget",
            "300",
            "--prompt",
            "Hello",
            "--idempotency-key",
            "cli-1",
            "--json",
            url=redis_server.url,
        ).stdout
    )
    assert again["id"] == created["id"] and not again["created"]
    status = json.loads(run("status", created["id"], "--json", url=redis_server.url).stdout)
    assert status["state"] == "queued" and status["floor_tokens"] == 16
    stats = json.loads(run("stats", "--json", url=redis_server.url).stdout)
    assert stats["jobs"] == 1 and stats["states"]["queued"] == 1
    for key in ("output_tokens_billed", "output_tokens_persisted", "naive_output_tokens_billed"):
        assert key in stats


def test_messages_file(
    redis_server: RedisServer, redis_client: redis.Redis, tmp_path: Path
) -> None:
    messages = tmp_path / "m.json"
    messages.write_text(json.dumps([{"role": "user", "content": "From a file"}]))
    out = run(
        "enqueue", "--provider", "local", "--model", "m", "--budget", "50",
        "--messages", str(messages), "--json", url=redis_server.url,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr


CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": CITY}}


def test_tools_tool_choice_and_response_format_from_files(
    redis_server: RedisServer, real_store: Store, tmp_path: Path
) -> None:
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([WEATHER_TOOL]))
    fmt = tmp_path / "format.json"
    fmt.write_text(json.dumps({"type": "json_object"}))
    out = run(
        "enqueue", "--provider", "local", "--model", "m", "--budget", "50", "--prompt", "Lyon?",
        "--tools", str(tools), "--tool-choice", "get_weather", "--on-invalid", "fail",
        url=redis_server.url,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    spec = real_store.get(out.stdout.strip()).spec
    assert spec.tools is not None and spec.tools[0].function.name == "get_weather"
    assert spec.tool_choice is not None and spec.tool_choice.function.name == "get_weather"  # type: ignore[union-attr]
    assert spec.exit.on_invalid == "fail"
    doc = run(
        "enqueue", "--provider", "local", "--model", "m", "--budget", "50", "--prompt", "Lyon?",
        "--tools", str(tools), "--tool-choice", "auto", "--response-format", str(fmt),
        url=redis_server.url,
    )  # fmt: skip
    assert doc.returncode == 0, doc.stderr
    shaped = real_store.get(doc.stdout.strip()).spec
    assert shaped.tool_choice == "auto" and shaped.response_format is not None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--budget", "0", "--prompt", "x"), "budget_tokens"),
        (("--budget", "10", "--prompt", "x", "--tools", "/nonexistent.json"), "--tools"),
        (("--budget", "10", "--prompt", "x", "--tool-choice", "get_news"), "tool_choice"),
        (("--budget", "10", "--prompt", "x", "--response-format", "/no.json"), "--response-format"),
        (("--budget", "10", "--prompt", "x", "--floor", "20"), "floor_tokens"),
        (("--budget", "10"), "give --prompt TEXT or --messages FILE"),
        (("--budget", "10", "--messages", "/nonexistent.json"), "--messages"),
        (("--budget", "10", "--prompt", "x", "--provider", "https://evil.example"), "provider"),
    ],
)
def test_enqueue_errors_are_one_line(
    redis_server: RedisServer, redis_client: redis.Redis, args: tuple[str, ...], message: str
) -> None:
    base = ["enqueue", "--model", "m"]
    if "--provider" not in args:
        base += ["--provider", "local"]
    out = run(*base, *args, url=redis_server.url)
    assert out.returncode != 0 and message in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    assert list(redis_client.scan_iter("*")) == []


def test_enqueue_with_a_small_budget_and_no_floor(redis_server: RedisServer) -> None:
    out = run(
        "enqueue", "--provider", "local", "--model", "m", "--budget", "10", "--prompt", "x",
        "--json", url=redis_server.url,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    status = run("status", json.loads(out.stdout)["id"], "--json", url=redis_server.url)
    assert json.loads(status.stdout)["floor_tokens"] == 5


def test_unknown_profile_is_refused_when_profiles_are_configured(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    out = run(
        "--config", str(write_profiles(tmp_path)), "enqueue", "--provider", "nope",
        "--model", "m", "--budget", "10", "--prompt", "x", url=redis_server.url,
    )  # fmt: skip
    assert out.returncode == 1
    assert "unknown provider profile 'nope' (known: local)" in out.stderr


def test_spill_commands_json_and_errors(redis_server: RedisServer, real_store: Store) -> None:
    assert json.loads(run("spill", "list", "--json", url=redis_server.url).stdout) == []
    spec = {"prompt": "hi", "provider": "local", "model": "m", "budget_tokens": 100}
    job_id = real_store.create(spec).id
    got = real_store.acquire(job_id, worker="w", ttl_ms=5000)
    real_store.flush(got.lease, expected_revision=1, delta="partial", tokens=1)
    real_store.release(got.lease, to="spilled", reason="below floor")
    listed = json.loads(run("spill", "list", "--json", url=redis_server.url).stdout)
    assert listed[0]["id"] == job_id and listed[0]["prefix_chars"] == len("partial")
    shown = json.loads(run("spill", "show", job_id, "--json", url=redis_server.url).stdout)
    assert shown["state"] == "spilled" and shown["text"] == "partial"
    exported = run("spill", "export", url=redis_server.url).stdout.splitlines()
    assert [json.loads(line)["id"] for line in exported] == [job_id]
    assert run("spill", "drop", job_id, "--json", url=redis_server.url).returncode == 0
    again = run("spill", "drop", job_id, url=redis_server.url)
    assert again.returncode == 1 and "is dropped" in again.stderr
    missing = run("spill", "requeue", "nosuchjob", url=redis_server.url)
    assert missing.returncode == 3 and "no job nosuchjob" in missing.stderr


def test_tail_prints_the_text_of_an_ended_job(redis_server: RedisServer, real_store: Store) -> None:
    spec = {"prompt": "hi", "provider": "local", "model": "m", "budget_tokens": 100}
    job_id = real_store.create(spec).id
    got = real_store.acquire(job_id, worker="w", ttl_ms=5000)
    rev = real_store.flush(got.lease, expected_revision=1, delta="Hello, ", tokens=2).revision
    real_store.flush(got.lease, expected_revision=rev, delta="world.", tokens=2)
    real_store.finish(got.lease, state="done", finish_reason="stop")
    out = run("tail", job_id, url=redis_server.url)
    assert out.returncode == 0 and out.stdout == "Hello, world.\n"
    assert "[done: stop]" in out.stderr


def test_stats_forgets_a_provider_and_refuses_one_it_does_not_know(
    redis_server: RedisServer, real_store: Store
) -> None:
    spec = {"prompt": "hi", "provider": "old-profile", "model": "m", "budget_tokens": 100}
    job_id = real_store.create(spec).id
    got = real_store.acquire(job_id, worker="w1", ttl_ms=5000)
    entry = {"attempt": 1, "kind": "fresh", "worker": "w1", "outcome": "done",
             "provider": "old-profile", "output_tokens_persisted": 3}  # fmt: skip
    real_store.finish(got.lease, state="done", finish_reason="stop", ledger=entry)
    listed = json.loads(run("stats", "--json", url=redis_server.url).stdout)
    assert listed["providers"] == ["old-profile"]
    out = run("stats", "--forget-provider", "old-profile", "--json", url=redis_server.url)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"forgotten": "old-profile"}
    assert json.loads(run("stats", "--json", url=redis_server.url).stdout)["providers"] == []
    assert real_store.totals()["attempts"] == 1  # all providers' totals keep what it counted
    again = run("stats", "--forget-provider", "old-profile", url=redis_server.url)
    assert again.returncode == 2 and "no provider 'old-profile' has totals" in again.stderr
    bad = run("stats", "--forget-provider", "bad name", url=redis_server.url)
    assert bad.returncode == 2 and "malformed provider profile name" in bad.stderr
