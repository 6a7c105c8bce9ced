"""End to end: after-completion hooks run once, as their own RQ job, only when the text is
final (SPEC §11); a cancelled job's worker stops streaming at once."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_support import World, make_world, tokens

from resumeq.fake import FakeProvider
from resumeq.producer.client import Client, Delta
from resumeq.queue.outbox_hooks import enqueue_hooks
from resumeq.queue.queueing import hook_rq_id
from resumeq.store import Store
from resumeq.testing import RedisServer
from resumeq.testing.processes import wait_for

pytestmark = pytest.mark.timeout(90)

HOOKS = """
import os
import redis
from resumeq.worker.hooks import HookCall, hook


@hook("record")
def record(call: HookCall) -> None:
    client = redis.Redis.from_url(os.environ["RESUMEQ_REDIS_URL"])
    client.rpush(
        "test:hook-calls",
        f"{call.job_id}|{call.idempotency_key}|{call.record.state}|{len(call.text)}",
    )
"""


@pytest.fixture
def world(
    tmp_path: Path, real_store: Store, fake: FakeProvider, redis_server: RedisServer
) -> Iterator[World]:
    (tmp_path / "hooks_mod").mkdir()
    (tmp_path / "hooks_mod" / "resumeq_test_hooks.py").write_text(HOOKS)
    for w in make_world(
        tmp_path, real_store, fake, redis_server.url, hook_modules=["resumeq_test_hooks"]
    ):
        w.cluster.env["PYTHONPATH"] = str(tmp_path / "hooks_mod")
        yield w


def test_hooks_run_once_after_the_text_is_final(world: World) -> None:
    world.cluster.worker()
    world.cluster.janitor()
    world.fake.completion_tokens = 80
    world.fake.add_faults([{"kind": "disconnect", "after_tokens": 20}])
    prompt = "A message worth forwarding."
    job_id = world.enqueue(prompt, hooks=["record"])
    assert world.wait_state(job_id, {"done", "failed"}).state.value == "done"
    calls = wait_for(
        lambda: world.store.redis.lrange("test:hook-calls", 0, -1), timeout_s=15, what="hook"
    )
    text = world.canonical(prompt)
    assert [c.decode() for c in calls] == [f"{job_id}|{job_id}:record|done|{len(text)}"]
    # Enqueueing the hook again (a retried exit) is recognised: no second run.
    assert enqueue_hooks(world.store.redis, world.store.get(job_id)) == 0
    time.sleep(1)
    assert world.store.redis.llen("test:hook-calls") == 1
    assert hook_rq_id(job_id, "record").startswith(job_id)


def test_cancel_stops_the_stream(world: World) -> None:
    world.cluster.worker()
    world.fake.completion_tokens = 1000
    world.fake.token_delay_ms = 10
    prompt = "A long essay nobody will read."
    job_id = world.enqueue(prompt)
    world.wait_spent(job_id, 30)
    out = subprocess.run(
        [sys.executable, "-m", "resumeq", "cancel", job_id, "--json"],
        env=world.cluster.env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    # Counted from when the cancel was written (the command's start-up is slow on a busy
    # machine, and the stream goes on meanwhile).
    at_cancel = world.requests_for(prompt)[-1]["tokens_emitted"]
    wait_for(
        lambda: world.requests_for(prompt)[-1]["outcome"] != "in_progress",
        timeout_s=10,
        what="the stream to be closed",
    )
    billed = world.requests_for(prompt)[-1]["output_tokens_billed"]
    # Closed within a flush or a heartbeat (a second here, with room for a busy machine),
    # not run to the end.
    assert billed - at_cancel < 200 and billed < 1000, (at_cancel, billed)
    record = world.store.get(job_id)
    assert record.state.value == "cancelled"
    assert world.canonical(prompt).startswith(world.store.text(job_id))


def test_a_worker_pool_on_the_spill_lane_drains_it(world: World) -> None:
    world.cluster.worker()
    world.cluster.worker("resumeq-spill")
    world.cluster.janitor()
    world.fake.completion_tokens = 200
    world.fake.add_faults([{"kind": "disconnect", "after_tokens": 40}])
    prompt = "Budget too small to resume."
    job_id = world.enqueue(prompt, budget_tokens=60)
    record = world.wait_state(job_id, {"done", "failed"})
    assert record.state.value == "done" and record.spill_count == 1
    assert record.queue == "resumeq-spill" and record.finish_reason == "length"
    text = world.store.text(job_id)
    assert world.canonical(prompt).startswith(text) and tokens(text) == 60
    assert [a["outcome"] for a in world.store.ledger(job_id)] == ["spill", "done"]


def test_followers_of_a_job_cut_twice_see_the_canonical_text_once(world: World) -> None:
    world.fake.completion_tokens = 150
    world.fake.token_delay_ms = 5
    world.fake.add_faults(
        [{"kind": "disconnect", "after_tokens": 30}, {"kind": "truncate", "after_tokens": 40}]
    )
    client = Client(world.store.redis)
    prompt = "Follow this answer through two cuts."
    job_id = world.enqueue(prompt)  # no worker yet: the first follower starts before
    seen: dict[str, list[Delta]] = {}

    def follow(name: str) -> None:
        seen[name] = list(client.follow(job_id, timeout=60))

    before = threading.Thread(target=follow, args=("before",))
    before.start()
    world.cluster.worker()
    world.cluster.janitor()
    world.wait_spent(job_id, 50)
    during = threading.Thread(target=follow, args=("during",))
    during.start()
    before.join(timeout=60)
    during.join(timeout=60)
    follow("after")
    want = world.canonical(prompt)
    assert client.get(job_id).state.value == "done"
    assert len(world.store.ledger(job_id)) == 3  # cut twice
    for name, deltas in seen.items():
        assert "".join(d.text for d in deltas) == want, name
    deltas = seen["after"]
    for i in (0, len(deltas) // 2, len(deltas) - 1):
        rest = "".join(d.text for d in client.follow(job_id, after=deltas[i].revision))
        assert rest == "".join(d.text for d in deltas[i + 1 :])
