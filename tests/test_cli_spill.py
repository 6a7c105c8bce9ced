"""The spill lane from a shell: filters, bulk requeue and drop, a larger budget on purpose,
the conversation in ``show`` and ``export``, and ``jobs --state`` from the state indexes —
all through the console script as a real process."""

from __future__ import annotations

import json
import time
from typing import Any

import redis
from rq import Worker
from test_cli import run

from resumeq.store import Store, audit, keys
from resumeq.testing import RedisServer

CONVERSATION = [
    {"role": "system", "content": "Answer as a table."},
    {"role": "user", "content": "Compare «Lua» and Python ✓ — 表格 🙂 for scripting Redis."},
]


def spill_one(
    store: Store,
    *,
    reason: str,
    provider: str = "local",
    queue: str = "default",
    text: str = "partial answer",
    budget: int = 100,
) -> str:
    spec = {"messages": CONVERSATION, "provider": provider, "model": "m", "budget_tokens": budget}
    job_id = store.create(spec, queue=queue).id
    got = store.acquire(job_id, worker="w", ttl_ms=5000)
    store.flush(got.lease, expected_revision=1, delta=text, tokens=3)
    store.release(got.lease, to="spilled", reason=reason)
    time.sleep(0.002)  # the next one spills a millisecond later: the index orders by time
    return job_id


def age(client: redis.Redis, job_id: str, seconds: float) -> None:
    """Pretend the job spilled ``seconds`` ago (the field the filter reads)."""
    spilled_ms = int(client.hget(keys.job(job_id), "spilled_ms") or 0)
    client.hset(keys.job(job_id), "spilled_ms", spilled_ms - int(seconds * 1000))


def listed(url: str, *filters: str) -> list[dict[str, Any]]:
    out = run("spill", "list", *filters, "--json", url=url)
    assert out.returncode == 0, out.stderr
    entries: list[dict[str, Any]] = json.loads(out.stdout)
    return entries


def test_list_filters_by_reason_provider_queue_and_age(
    redis_server: RedisServer, real_store: Store, redis_client: redis.Redis
) -> None:
    url = redis_server.url
    a = spill_one(real_store, reason="provider answered 503 for 300 s")
    b = spill_one(real_store, reason="below the floor", provider="paid")
    c = spill_one(real_store, reason="Provider answered 529", queue="bulk")
    age(redis_client, a, 15 * 60)
    assert [e["id"] for e in listed(url)] == [a, b, c]
    assert [e["id"] for e in listed(url, "--reason", "PROVIDER ANSWERED")] == [a, c]
    assert [e["id"] for e in listed(url, "--provider", "paid")] == [b]
    assert [e["id"] for e in listed(url, "--queue", "bulk")] == [c]
    assert [e["id"] for e in listed(url, "--older-than", "10m")] == [a]
    assert [e["id"] for e in listed(url, "--reason", "answered", "--older-than", "10m")] == [a]
    assert listed(url, "--reason", "answered", "--queue", "nope") == []
    assert [e["id"] for e in listed(url, "--limit", "2")] == [a, b]
    human = run("spill", "list", "--provider", "paid", url=url)
    assert human.returncode == 0 and b in human.stdout and "below the floor" in human.stdout
    assert human.stdout.rstrip().endswith("1 spilled")


def test_a_bad_age_is_named(redis_server: RedisServer) -> None:
    out = run("spill", "list", "--older-than", "ten minutes", url=redis_server.url)
    assert out.returncode == 2
    assert "'ten minutes'" in out.stderr and "like 10m" in out.stderr
    assert "Traceback" not in out.stderr


def test_requeue_all_asks_with_the_count_and_touches_nothing_on_no(
    redis_server: RedisServer, real_store: Store
) -> None:
    url = redis_server.url
    ids = [spill_one(real_store, reason="provider answered 503") for _ in range(3)]
    other = spill_one(real_store, reason="below the floor")
    asked = run("spill", "requeue", "--all", "--reason", "503", url=url, input="n\n")
    assert asked.returncode == 1, asked.stderr
    assert "requeue 3 spilled job(s)?" in asked.stderr and "not confirmed" in asked.stderr
    unanswered = run("spill", "drop", "--all", url=url, input="")
    assert unanswered.returncode == 1 and "drop 4 spilled job(s)?" in unanswered.stderr
    assert {e["id"] for e in listed(url)} == {*ids, other}


def test_requeue_all_with_yes_moves_only_what_matches(
    redis_server: RedisServer, real_store: Store
) -> None:
    url = redis_server.url
    ids = [spill_one(real_store, reason="provider answered 503") for _ in range(3)]
    other = spill_one(real_store, reason="below the floor")
    out = run(
        "spill", "requeue", "--all", "--reason", "503", "--to", "retry", "--yes", "--json",
        url=url,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert sorted(result["done"]) == sorted(ids) and result["skipped"] == {}
    assert [e["id"] for e in listed(url)] == [other]
    for job_id in ids:
        record = real_store.get(job_id)
        assert (record.state.value, record.queue) == ("queued", "retry")
    none_left = run("spill", "requeue", "--all", "--reason", "503", "--yes", url=url)
    assert none_left.returncode == 0 and "no spilled job matches" in none_left.stdout


def test_drop_all_by_provider(redis_server: RedisServer, real_store: Store) -> None:
    url = redis_server.url
    paid = [spill_one(real_store, reason="r", provider="paid") for _ in range(2)]
    kept = spill_one(real_store, reason="r", provider="local")
    out = run(
        "spill", "drop", "--all", "--provider", "paid", "--why", "budget cut", "--yes", url=url
    )
    assert out.returncode == 0, out.stderr
    assert "dropped 2" in out.stdout
    for job_id in paid:
        record = real_store.get(job_id)
        assert (record.state.value, record.reason) == ("dropped", "budget cut")
        assert real_store.text(job_id) == "partial answer"  # still readable
    assert [e["id"] for e in listed(url)] == [kept]
    # The audit log has it, as the login name that ran it.
    entries, _ = audit.page(real_store.redis)
    assert [(e.action, sorted(e.jobs), e.via) for e in entries] == [("drop", sorted(paid), "cli")]
    assert "budget cut" in entries[0].detail and "@" in entries[0].who


def test_bulk_needs_all_or_an_id_never_both(redis_server: RedisServer, real_store: Store) -> None:
    url = redis_server.url
    job_id = spill_one(real_store, reason="r")
    neither = run("spill", "drop", url=url)
    assert neither.returncode == 2 and "give a job id, or --all" in neither.stderr
    both = run("spill", "requeue", job_id, "--all", "--yes", url=url)
    assert both.returncode == 2 and "not both" in both.stderr
    assert [e["id"] for e in listed(url)] == [job_id]


def test_requeue_with_a_larger_budget(redis_server: RedisServer, real_store: Store) -> None:
    url = redis_server.url
    job_id = spill_one(real_store, reason="budget nearly spent", budget=40)
    out = run("spill", "requeue", job_id, "--budget", "400", "--json", url=url)
    assert out.returncode == 0, out.stderr
    record = real_store.get(job_id)
    assert record.state.value == "queued"
    assert (record.budget_tokens, record.spec.budget_tokens) == (400, 400)
    assert record.spent_output_tokens == 3
    assert real_store.text(job_id) == "partial answer"


def test_a_budget_below_what_was_spent_is_refused(
    redis_server: RedisServer, real_store: Store
) -> None:
    url = redis_server.url
    job_id = spill_one(real_store, reason="r", budget=40)
    out = run("spill", "requeue", job_id, "--budget", "3", url=url)
    assert out.returncode == 1
    assert "budget_tokens: 3 leaves nothing past the 3 tokens already spent" in out.stderr
    assert out.stderr.count("\n") == 1
    record = real_store.get(job_id)
    assert (record.state.value, record.budget_tokens) == ("spilled", 40)  # nothing written


def test_show_and_export_carry_the_conversation(
    redis_server: RedisServer, real_store: Store
) -> None:
    url = redis_server.url
    job_id = spill_one(real_store, reason="provider answered 503", provider="paid")
    shown = json.loads(run("spill", "show", job_id, "--json", url=url).stdout)
    assert shown["messages"] == CONVERSATION
    assert (shown["provider"], shown["model"], shown["text"]) == ("paid", "m", "partial answer")
    human = run("spill", "show", job_id, url=url)
    assert human.returncode == 0
    assert "[user] Compare «Lua» and Python ✓ — 表格 🙂 for scripting Redis." in human.stdout
    assert "provider answered 503" in human.stdout
    spill_one(real_store, reason="other", provider="local")
    lines = run("spill", "export", "--provider", "paid", url=url).stdout.splitlines()
    exported = [json.loads(line) for line in lines]
    assert [e["id"] for e in exported] == [job_id]
    assert exported[0]["messages"] == CONVERSATION


def test_a_requeued_job_starts_a_new_run_of_failures(
    redis_server: RedisServer, real_store: Store, redis_client: redis.Redis
) -> None:
    job_id = spill_one(real_store, reason="provider answered 503 for 300 s")
    redis_client.hset(keys.job(job_id), mapping={"failures": 7, "failing_since_ms": 1})
    assert run("spill", "requeue", job_id, url=redis_server.url).returncode == 0
    record = real_store.get(job_id)
    assert (record.failures, record.failing_since_ms) == (0, None)


def test_a_requeue_warns_when_no_live_worker_listens_on_the_queue(
    redis_server: RedisServer, real_store: Store, redis_client: redis.Redis
) -> None:
    url = redis_server.url
    lonely, served, bulk = (spill_one(real_store, reason="provider answered 503") for _ in range(3))
    # An RQ worker's own registration, as `resumeq worker --queues served` writes it.
    listener = Worker(["served"], connection=redis_client, name="listener-1")
    listener.register_birth()
    try:
        out = run("spill", "requeue", lonely, "--to", "night-shift", "--json", url=url)
        assert out.returncode == 0, out.stderr
        [warning] = json.loads(out.stdout)["warnings"]
        assert "'night-shift'" in warning and "no live worker" in warning
        assert out.stderr == f"warning: {warning}\n"
        assert real_store.get(lonely).queue == "night-shift"  # done all the same
        quiet = run("spill", "requeue", served, "--to", "served", "--json", url=url)
        assert quiet.returncode == 0 and quiet.stderr == ""
        assert json.loads(quiet.stdout)["warnings"] == []
    finally:
        listener.register_death()
    # Its death recorded, the worker listens no more; a bulk requeue warns once a queue.
    out = run("spill", "requeue", "--all", "--to", "served", "--yes", url=url)
    assert out.returncode == 0 and out.stdout.startswith("requeued 1")
    assert out.stderr.count("warning: ") == 1 and "'served'" in out.stderr
    assert real_store.get(bulk).queue == "served"


def test_jobs_by_state_from_the_indexes(redis_server: RedisServer, real_store: Store) -> None:
    url = redis_server.url
    spec = {"prompt": "hi", "provider": "local", "model": "m", "budget_tokens": 100}
    queued = []
    for q in ("default", "bulk", "bulk"):  # a millisecond apart: the index orders by time
        queued.append(real_store.create(spec, queue=q).id)
        time.sleep(0.002)
    running = real_store.create(spec).id
    real_store.acquire(running, worker="w1", ttl_ms=5000)
    spilled = spill_one(real_store, reason="r")
    ended = real_store.create(spec).id
    real_store.cancel(ended)

    def ids(*args: str) -> list[str]:
        out = run("jobs", *args, "--json", url=url)
        assert out.returncode == 0, out.stderr
        return [e["id"] for e in json.loads(out.stdout)["jobs"]]

    assert ids("--state", "queued") == queued
    assert ids("--state", "queued", "--queue", "bulk") == queued[1:]
    assert ids("--state", "queued", "--queue", "bulk", "--limit", "1") == queued[1:2]
    assert ids("--state", "running") == [running]
    assert ids("--state", "spilled") == [spilled]
    assert ids("--state", "stalled") == []
    human = run("jobs", "--state", "running", url=url)
    assert human.returncode == 0 and running in human.stdout
    assert ids("--state", "cancelled") == [ended]
    bad = run("jobs", "--state", "finished", url=url)
    assert bad.returncode == 2 and "Invalid value for '--state'" in bad.stderr
    live_since = run("jobs", "--state", "queued", "--since", "1h", url=url)
    assert live_since.returncode == 2 and "'--since'" in live_since.stderr
    assert "ended states" in live_since.stderr


def test_ended_jobs_newest_first_bounded_and_since(
    redis_server: RedisServer, real_store: Store, redis_client: redis.Redis
) -> None:
    url = redis_server.url
    spec = {"prompt": "hi", "provider": "local", "model": "m", "budget_tokens": 100}

    def ended(how: str, queue: str = "default") -> str:
        job_id = real_store.create(spec, queue=queue).id
        got = real_store.acquire(job_id, worker="w", ttl_ms=5000)
        if how == "done":
            real_store.flush(got.lease, expected_revision=1, delta="ok", tokens=1)
            real_store.finish(got.lease, state="done", finish_reason="stop")
        else:
            real_store.finish(got.lease, state="failed", error="HTTP 401")
        time.sleep(0.002)  # the index orders by creation time
        return job_id

    old_failure = ended("failed")
    # it failed three hours ago (the field the filter reads)
    finished_ms = int(redis_client.hget(keys.job(old_failure), "finished_ms") or 0)
    redis_client.hset(keys.job(old_failure), "finished_ms", finished_ms - 3 * 3600 * 1000)
    done = [ended("done"), ended("done", queue="bulk"), ended("done")]
    failed = ended("failed", queue="bulk")

    def listing(*args: str) -> dict[str, Any]:
        out = run("jobs", *args, "--json", url=url)
        assert out.returncode == 0, out.stderr
        answer: dict[str, Any] = json.loads(out.stdout)
        return answer

    everything = listing("--state", "done")
    assert [j["id"] for j in everything["jobs"]] == done[::-1]  # newest first
    assert everything["examined"] == 5 and everything["more"] is False
    assert (
        everything["jobs"][0]["state"] == "done"
        and everything["jobs"][0]["spent_output_tokens"] == 1
    )
    assert [j["id"] for j in listing("--state", "done", "--queue", "bulk")["jobs"]] == [done[1]]
    assert [j["id"] for j in listing("--state", "failed")["jobs"]] == [failed, old_failure]
    last_hour = listing("--state", "failed", "--since", "1h")
    assert [j["id"] for j in last_hour["jobs"]] == [failed] and last_hour["since"] == "1h"
    bounded = listing("--state", "done", "--scan", "2")
    assert bounded["examined"] == 2 and bounded["more"] is True
    assert [j["id"] for j in bounded["jobs"]] == [done[2]]  # the newest two: a failure, a done
    limited = listing("--state", "done", "--limit", "1")
    assert [j["id"] for j in limited["jobs"]] == [done[2]] and limited["examined"] == 2
    human = run("jobs", "--state", "done", "--scan", "2", url=url)
    assert human.returncode == 0 and done[2] in human.stdout
    assert human.stdout.rstrip().endswith(
        "1 done (2 of the newest jobs read; older ones not read (--scan 2))"
    )
    bad_age = run("jobs", "--state", "failed", "--since", "an hour", url=url)
    assert bad_age.returncode == 2 and "'an hour'" in bad_age.stderr


def test_filters_beside_a_job_id_are_refused(redis_server: RedisServer, real_store: Store) -> None:
    url = redis_server.url
    job_id = spill_one(real_store, reason="r")
    out = run("spill", "drop", job_id, "--reason", "r", url=url)
    assert out.returncode == 2
    assert "--reason: filters choose jobs for --all, not with a job id" in out.stderr
    out = run("spill", "requeue", job_id, "--from-provider", "local", "--queue", "q", url=url)
    assert out.returncode == 2 and "--from-provider, --queue: filters choose" in out.stderr
    assert [e["id"] for e in listed(url)] == [job_id]  # nothing touched


def test_bulk_json_when_nothing_matches_and_the_question_names_the_target(
    redis_server: RedisServer, real_store: Store
) -> None:
    url = redis_server.url
    out = run("spill", "drop", "--all", "--reason", "nothing like it", "--yes", "--json", url=url)
    assert out.returncode == 0 and json.loads(out.stdout) == {"done": [], "count": 0, "skipped": {}}
    spill_one(real_store, reason="r")
    asked = run(
        "spill", "requeue", "--all", "--provider", "paid", "--to", "vip", url=url, input="n\n"
    )  # fmt: skip
    assert "requeue 1 spilled job(s) to queue vip to provider paid?" in asked.stderr
