"""schemathesis, a third-party API fuzzer, against a live ``resumeq serve`` (a worker and
the fake provider beside it, so the jobs it creates run and end): every check on, with an
operator's token and with a producer's, seeds fixed so a failure repeats. What the OpenAPI
document says is what the server does: a request valid by the document is accepted, one
invalid by it refused, every answer is documented and matches its schema (event streams
event by event)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from serve_support import console_up, fake_profile, token_entries

from resumeq.fake import FakeProvider
from resumeq.testing import RedisServer
from resumeq.testing.processes import Cluster, wait_for, write_config
from resumeq.testing.redis_server import free_port

HERE = Path(__file__).resolve().parent
TOKENS = {"ops": "operator", "web": "producer"}
#: Where ``st`` is: beside this interpreter, in the virtual environment.
ST = Path(sys.executable).with_name("st")


def bearer(who: str) -> str:
    return f"fuzz-test-token-{who}"


@dataclass
class Served:
    base: str
    tmp: Path


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("fuzz")
    with RedisServer() as redis_server, FakeProvider(completion_tokens=40) as fake:
        profile = fake_profile(fake)
        tokens = token_entries(TOKENS, bearer)
        port = free_port()
        config = write_config(
            tmp / "resumeq.toml",
            {
                "providers": {"fake": profile, "spare": profile},
                "worker": {"queues": ["resumeq", "bulk"], "flush_tokens": 8},
                "janitor": {"interval_s": 0.5},
                "server": {"port": port, "tokens": tokens, "keepalive_s": 1.0,
                           "secret_env": "RESUMEQ_FUZZ_SECRET"},
            },
        )  # fmt: skip
        cluster = Cluster(tmp, redis_url=redis_server.url, config=config)
        cluster.env["RESUMEQ_FUZZ_SECRET"] = "a secret the fuzz test's serve signs with"
        try:
            cluster.worker(concurrency=8)
            cluster.command("serve")
            base = f"http://127.0.0.1:{port}"
            wait_for(lambda: console_up(base), timeout_s=30, what="resumeq serve")
            yield Served(base, tmp)
        finally:
            cluster.stop()


def fuzz(served: Served, who: str, *, seed: int, examples: int) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "SCHEMATHESIS_HOOKS": "resumeq_hooks",
        "PYTHONPATH": os.pathsep.join([str(HERE / "fuzz"), os.environ.get("PYTHONPATH", "")]),
    }
    # One worker: with two, hypothesis describing a filter in two threads at once trips
    # CPython 3.11's ast module ("AST constructor recursion depth mismatch", a race).
    args = [
        str(ST), "run", f"{served.base}/openapi.json",
        "--header", f"Authorization: Bearer {bearer(who)}",
        "--checks", "all", "--seed", str(seed), "--max-examples", str(examples),
        "--workers", "1", "--request-timeout", "10", "--max-failures", "20",
        "--suppress-health-check", "too_slow",
        "--report", "junit", "--report-dir", str(served.tmp / f"report-{who}-{seed}"),
    ]  # fmt: skip
    # In a directory of its own: schemathesis keeps the crashes it found there and replays
    # them first, which would make a run depend on an earlier one.
    cwd = served.tmp / f"run-{who}-{seed}"
    cwd.mkdir()
    return subprocess.run(
        args, check=False, cwd=cwd, env=env, capture_output=True, text=True, timeout=240
    )


@pytest.mark.timeout(300)
@pytest.mark.parametrize("who", ["ops", "web"])
def test_schemathesis_finds_no_failure(served: Served, who: str) -> None:
    # Fixed, so a failure repeats; RESUMEQ_FUZZ_SEED and RESUMEQ_FUZZ_EXAMPLES fuzz further.
    seed = int(os.environ.get("RESUMEQ_FUZZ_SEED", "20261202"))
    run = fuzz(served, who, seed=seed, examples=int(os.environ.get("RESUMEQ_FUZZ_EXAMPLES", "25")))
    assert run.returncode == 0, run.stdout[-12000:] + run.stderr[-3000:]
    assert "passed" in run.stdout, run.stdout[-3000:]
