"""What the console's pages read: the job list's pages, its filters, the splice points of a
job's text, and the overview's counts — against a real Redis."""

from __future__ import annotations

import hashlib
import time
from typing import Any

from resumeq.core.settings import ServerToken
from resumeq.server.auth import LOCAL, Principal, Tokens
from resumeq.server.console import data, session
from resumeq.store import Store, audit, keys


def spec(n: int, **over: Any) -> dict[str, Any]:
    base = {"prompt": f"Job {n}: the tides of the harbour.", "provider": "local",
            "model": "m", "budget_tokens": 200}  # fmt: skip
    return {**base, **over}


def test_job_list_pages_newest_first_without_a_repeat_or_a_gap(real_store: Store) -> None:
    ids = [real_store.create(spec(n)).id for n in range(130)]
    seen: list[str] = []
    before = None
    while True:
        page = data.jobs_page(real_store, data.JobFilter(), before=before, limit=50)
        seen += [row["id"] for row in page.rows]
        if page.next is None:
            break
        before = page.next
    assert len(seen) == len(set(seen)) and set(seen) == set(ids)  # each once
    order = [(real_store.redis.zscore(keys.JOBS, job_id), job_id) for job_id in seen]
    assert order == sorted(order, reverse=True)  # newest first; ties in a ms, by id
    # A state with an index of its own is read from it.
    queued = data.jobs_page(real_store, data.JobFilter(state="queued"), limit=500)
    assert len(queued.rows) == 130 and queued.next is None


def test_job_list_pages_through_jobs_created_in_the_same_millisecond(real_store: Store) -> None:
    ids = [real_store.create(spec(n)).id for n in range(90)]
    for n, job_id in enumerate(ids):  # three milliseconds, thirty jobs each
        real_store.redis.zadd(keys.JOBS, {job_id: 1_000 + n // 30})
    for limit in (7, 30, 31):
        seen: list[str] = []
        before = None
        while True:
            page = data.jobs_page(real_store, data.JobFilter(), before=before, limit=limit)
            seen += [row["id"] for row in page.rows]
            if page.next is None:
                break
            before = page.next
        assert sorted(seen) == sorted(ids) and len(seen) == len(ids), limit


def test_job_list_filters_and_reads_at_most_its_bound(real_store: Store) -> None:
    for n in range(40):
        prompt = f"Job {n}: the lighthouse." if n % 10 == 0 else f"Job {n}: the ferry."
        real_store.create(spec(n, prompt=prompt, provider="paid" if n % 2 else "local"))
    found = data.jobs_page(real_store, data.JobFilter(text="LIGHTHOUSE"), limit=50)
    assert len(found.rows) == 4 and all("lighthouse" in r["prompt"] for r in found.rows)
    paid = data.jobs_page(real_store, data.JobFilter(provider="paid", text="ferry"), limit=50)
    assert len(paid.rows) == 20
    assert data.jobs_page(real_store, data.JobFilter(state="done"), limit=50).rows == []
    # A search that matches nothing stops at its bound, and says where to go on.
    many = [real_store.create(spec(n)).id for n in range(data.SCAN_MAX + 10)]
    nothing = data.jobs_page(real_store, data.JobFilter(text="no such words"), limit=50)
    assert nothing.rows == [] and nothing.examined == data.SCAN_MAX
    assert nothing.next is not None and nothing.next[1] in many


def test_an_expired_job_is_forgotten_by_the_list(real_store: Store) -> None:
    kept = real_store.create(spec(1)).id
    gone = real_store.create(spec(2)).id
    real_store.redis.delete(keys.job(gone))  # as its retention running out does
    page = data.jobs_page(real_store, data.JobFilter(), limit=50)
    assert [r["id"] for r in page.rows] == [kept]
    assert real_store.redis.zscore(keys.JOBS, gone) is None


def test_segments_cut_the_text_where_each_attempt_began() -> None:
    text = "héllo wörld, and then the rest"
    first = len("héllo wörld, ".encode())
    ledger = [
        {"attempt": 2, "kind": "resume", "bytes_persisted": len(text.encode()) - first},
        {"attempt": 1, "kind": "fresh", "bytes_persisted": first},
    ]
    segments = data.segments(text, ledger)
    assert [s["text"] for s in segments] == ["héllo wörld, ", "and then the rest"]
    assert [s["splice"] for s in segments] == [False, True]
    # Text past the ledger: an attempt in flight, after a splice of its own.
    more = data.segments(text + " and more", ledger)
    assert more[-1] == {"attempt": None, "kind": "in flight", "text": " and more", "splice": True}


def test_overview_counts_and_audit_pages(real_store: Store) -> None:
    for n in range(3):
        real_store.create(spec(n))
    info = data.overview(real_store, ["resumeq"])
    assert info["states"]["queued"] == 3 and info["spill_depth"] == 0
    assert [q["name"] for q in info["queues"]] == ["resumeq", "resumeq-spill"]
    assert info["tokens"]["all_time"]["saved"] == 0
    for n in range(7):
        audit.record(real_store.redis, who="ops", role="operator", action="drop",
                     jobs=[f"j{n}"], via="console")  # fmt: skip
    first, more = audit.page(real_store.redis, limit=5)
    assert [e.jobs for e in first] == [[f"j{n}"] for n in range(6, 1, -1)] and more
    rest, more = audit.page(real_store.redis, before=more, limit=5)
    assert [e.jobs for e in rest] == [["j1"], ["j0"]] and more is None


def test_a_session_ends_with_its_age_or_its_token(real_store: Store, monkeypatch: Any) -> None:
    ops = Principal("ops", "operator")
    session_id = session.open_session(real_store.redis, ops)
    found = session.load(real_store.redis, session_id)
    assert found is not None and found.principal == ops and found.csrf_ok(found.csrf)
    assert not found.csrf_ok("stale") and not found.csrf_ok(None)
    assert session.load(real_store.redis, "not-a-session") is None
    # Used all along, it still ends after MAX_AGE_S.
    later = time.time() + session.MAX_AGE_S + 1
    monkeypatch.setattr(time, "time", lambda: later)
    assert session.load(real_store.redis, session_id) is None
    assert not list(real_store.redis.scan_iter(f"{keys.CONSOLE_SESSION}:*"))
    # A token revoked, or its role changed, no longer grants its principal.
    digest = hashlib.sha256(b"t").hexdigest()
    tokens = Tokens((ServerToken(sha256=digest, role="operator", name="ops"),))
    assert tokens.grants(ops)
    assert not tokens.grants(Principal("ops", "viewer")) and not tokens.grants(LOCAL)
    assert Tokens(()).grants(LOCAL) and not Tokens(()).grants(ops)
