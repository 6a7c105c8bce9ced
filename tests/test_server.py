"""``resumeq serve`` end to end: a real uvicorn process on loopback, real workers, the fake
provider over HTTP, a real redis-server. Followers read the event stream as a browser's
EventSource does, over real sockets (an in-process transport would buffer the stream)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from starlette.routing import Route
from test_cli import run

from resumeq.core import names
from resumeq.core.ledger import AttemptRecord
from resumeq.core.settings import Settings
from resumeq.core.spec import JobSpec
from resumeq.fake import FakeProvider
from resumeq.producer.enqueue import enqueue_job
from resumeq.server import create_app, gateway
from resumeq.store import Store, keys
from resumeq.testing import RedisServer
from resumeq.testing.processes import Cluster, Proc, wait_for, write_config
from resumeq.testing.redis_server import free_port

pytestmark = pytest.mark.timeout(120)

TOKENS = {
    "web": ("producer", "web-app"),
    "other": ("producer", "other-app"),
    "ops": ("operator", "ops"),
    "dash": ("viewer", "dash"),
}


def secret(who: str) -> str:
    return f"rq_test_token_for_{who}"


def token_entries() -> list[dict[str, str]]:
    """``[server] tokens`` for :data:`TOKENS`."""
    return [
        {"sha256": hashlib.sha256(secret(w).encode()).hexdigest(), "role": r, "name": n}
        for w, (r, n) in TOKENS.items()
    ]


def auth(who: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret(who)}"} if who else {}


@dataclass
class Api:
    base: str
    store: Store
    fake: FakeProvider
    cluster: Cluster
    server: Proc
    clients: dict[str, httpx.Client] = field(default_factory=dict)

    def as_(self, who: str | None) -> httpx.Client:
        key = who or ""
        if key not in self.clients:
            self.clients[key] = httpx.Client(base_url=self.base, headers=auth(who), timeout=30)
        return self.clients[key]

    def create(self, prompt: str, who: str = "web", **over: Any) -> dict[str, Any]:
        spec = {"prompt": prompt, "provider": "fake", "model": "m", "budget_tokens": 2000}
        response = self.as_(who).post("/v1/jobs", json={**spec, **over})
        assert response.status_code == 201, response.text
        job: dict[str, Any] = response.json()
        return job

    def canonical(self, prompt: str) -> str:
        return self.fake.canonical_text([{"role": "user", "content": prompt}])

    def wait_state(self, job_id: str, states: set[str], timeout_s: float = 30) -> str:
        def reached() -> str | None:
            state = self.store.get(job_id).state.value
            return state if state in states else None

        return str(wait_for(reached, timeout_s=timeout_s, what=f"{job_id} in {states}"))


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    tmp = tmp_path_factory.mktemp("serve")
    with RedisServer() as redis_server, FakeProvider(completion_tokens=300) as fake:
        profile = {
            "kind": "openai",
            "base_url": fake.openai_base_url,
            "continue_mode": "instruction",
            "counting": "usage",
            "stall_timeout_s": 5.0,
        }
        tokens = token_entries()
        port = free_port()
        config = write_config(
            tmp / "resumeq.toml",
            {
                "providers": {"fake": profile, "fake-reserved": profile},
                "worker": {"flush_tokens": 8, "flush_ms": 100, "lease_ttl_ms": 2000},
                "janitor": {"interval_s": 0.3},
                "server": {
                    "port": port,
                    "tokens": tokens,
                    "max_body_bytes": 65536,
                    "keepalive_s": 0.5,
                },
            },
        )
        cluster = Cluster(tmp, redis_url=redis_server.url, config=config)
        try:
            cluster.worker(concurrency=8)
            cluster.worker(concurrency=8)
            cluster.janitor(interval_s=0.3)
            server = cluster.command("serve")
            base = f"http://127.0.0.1:{port}"
            wait_for(lambda: _up(base), timeout_s=30, what="resumeq serve")
            api = Api(base, Store.from_url(redis_server.url), fake, cluster, server)
            yield api
            for client in api.clients.values():
                client.close()
        finally:
            cluster.stop()


def _up(base: str) -> bool:
    try:
        return httpx.get(f"{base}/healthz", headers=auth("dash"), timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@contextmanager
def another_server(
    tmp_path: Path,
    redis_url: str,
    *args: str,
    api: Api | None = None,
    wait: bool = True,
    **server: Any,
) -> Iterator[str]:
    """A second ``resumeq serve`` (``args``, ``[server]`` settings) on its own port, with
    the module's fake provider as its profile ``fake``; answers its base URL."""
    port = free_port()
    providers = {"fake": {"kind": "openai", "base_url": api.fake.openai_base_url}} if api else {}
    config = write_config(
        tmp_path / "another.toml", {"providers": providers, "server": {"port": port, **server}}
    )
    cluster = Cluster(tmp_path, redis_url=redis_url, config=config)
    try:
        cluster.command("serve", *args)
        base = f"http://127.0.0.1:{port}"
        if wait:
            wait_for(lambda: _up(base), timeout_s=60, what="another resumeq serve")
        yield base
    finally:
        cluster.stop()


@pytest.fixture(autouse=True)
def clean(api: Api) -> None:
    api.fake.reset()
    api.fake.token_delay_ms = 0


# -- an EventSource, over a real socket ---------------------------------------------------


@dataclass
class Event:
    id: str | None
    event: str
    data: dict[str, Any]


def read_events(
    api: Api,
    job_id: str,
    who: str = "web",
    *,
    last_event_id: str | None = None,
    stop_after: int | None = None,
    timeout_s: float = 30,
) -> tuple[list[Event], bool]:
    """Read the job's stream as EventSource does: answers the events and whether the
    stream ended with ``end``; drops the connection after ``stop_after`` deltas."""
    headers = {**auth(who), "Accept": "text/event-stream"}
    if last_event_id is not None:
        headers["Last-Event-ID"] = last_event_id
    events: list[Event] = []
    deltas = 0
    with (
        httpx.Client(base_url=api.base, timeout=timeout_s) as client,
        client.stream("GET", f"/v1/jobs/{job_id}/events", headers=headers) as response,
    ):
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["x-accel-buffering"] == "no"
        current: dict[str, str] = {}
        for line in response.iter_lines():
            if line.startswith(":"):
                continue
            if line:
                name, _, value = line.partition(":")
                current[name] = value.removeprefix(" ")
                continue
            if "data" not in current:  # as EventSource: no data, no event (retry: first)
                assert not events and set(current) <= {"retry"}, current
                current = {}
                continue
            events.append(Event(current.get("id"), current["event"], json.loads(current["data"])))
            current = {}
            if events[-1].event == "end":
                return events, True
            if events[-1].event == "delta":
                deltas += 1
                if stop_after is not None and deltas >= stop_after:
                    return events, False
    return events, False


def text_of(events: list[Event]) -> str:
    return "".join(e.data["text"] for e in events if e.event == "delta")


# -- jobs ----------------------------------------------------------------------------------


def test_create_get_and_follow_a_job_to_its_end(api: Api) -> None:
    prompt = "Describe the harbour's cranes at dusk."
    response = api.as_("web").post(
        "/v1/jobs", json={"prompt": prompt, "provider": "fake", "model": "m", "budget_tokens": 900}
    )
    assert response.status_code == 201
    job = response.json()
    assert response.headers["location"] == f"/v1/jobs/{job['id']}" == job["links"]["self"]
    assert job["owner"] == "web-app" and job["state"] in ("queued", "running", "done")
    events, ended = read_events(api, job["id"])
    assert ended and events[-1].data == {"state": "done"}
    assert text_of(events) == api.canonical(prompt)
    revisions = [int(e.id) for e in events if e.id is not None]
    assert revisions == sorted(revisions)
    got = api.as_("web").get(f"/v1/jobs/{job['id']}").json()
    assert got["state"] == "done" and got["text"] == api.canonical(prompt)
    assert got["attempts"] and got["summary"]["output_tokens_billed"] > 0


def test_a_follower_that_drops_three_times_gets_the_text_exactly_once(api: Api) -> None:
    prompt = "Write the long log of a ship that loses its way twice."
    api.fake.token_delay_ms = 4
    api.fake.add_faults(
        [
            {"kind": "disconnect", "after_tokens": 90, "match": prompt},
            {"kind": "disconnect", "after_tokens": 80, "match": prompt},
        ]
    )
    job = api.create(prompt)
    seen: list[Event] = []
    last: str | None = None
    for _ in range(3):  # drop the connection mid-stream, three times
        events, ended = read_events(api, job["id"], last_event_id=last, stop_after=4)
        assert not ended
        seen += events
        last = next(e.id for e in reversed(seen) if e.id is not None)
    events, ended = read_events(api, job["id"], last_event_id=last)
    seen += events
    assert ended
    assert text_of(seen) == api.canonical(prompt)  # every byte once, nothing repeated
    record = api.store.get(job["id"])
    assert record.attempt == 3  # the job itself was cut twice and resumed


def test_followers_before_during_and_after_a_job_agree(api: Api) -> None:
    prompt = "Recount the storm that cut the ferry's radio twice."
    api.fake.token_delay_ms = 3
    api.fake.add_faults(
        [
            {"kind": "disconnect", "after_tokens": 60, "match": prompt},
            {"kind": "truncate", "after_tokens": 70, "match": prompt},
        ]
    )
    job = api.create(prompt)
    texts: dict[str, str] = {}

    def follow(name: str, delay_s: float) -> None:
        time.sleep(delay_s)
        events, ended = read_events(api, job["id"])
        assert ended
        texts[name] = text_of(events)

    threads = [
        threading.Thread(target=follow, args=(name, delay))
        for name, delay in (("before", 0.0), ("during", 0.5))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    api.wait_state(job["id"], {"done"})
    follow("after", 0.0)
    assert texts == dict.fromkeys(("before", "during", "after"), api.canonical(prompt))
    # From ?after=REV: exactly the text after that revision.
    whole, _ = read_events(api, job["id"])
    middle = whole[len(whole) // 2]
    assert middle.id is not None
    rest, ended = read_events(api, job["id"], last_event_id=middle.id)
    assert ended
    before = [e for e in whole if e.id is not None and int(e.id) <= int(middle.id)]
    assert text_of(before) + text_of(rest) == api.canonical(prompt)


def test_idempotency_key_same_body_same_job_other_body_422(api: Api) -> None:
    spec = {"prompt": "Name three lighthouses.", "provider": "fake", "model": "m",
            "budget_tokens": 300}  # fmt: skip
    headers = {"Idempotency-Key": "order-1842"}
    first = api.as_("web").post("/v1/jobs", json=spec, headers=headers)
    again = api.as_("web").post("/v1/jobs", json=spec, headers=headers)
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"]
    other = api.as_("web").post("/v1/jobs", json={**spec, "budget_tokens": 301}, headers=headers)
    assert other.status_code == 422
    assert other.headers["content-type"] == "application/problem+json"
    assert other.json()["errors"][0]["field"] == "Idempotency-Key"
    # The draft's quoted string is the same key.
    quoted = api.as_("web").post("/v1/jobs", json=spec, headers={"Idempotency-Key": '"order-1842"'})
    assert quoted.status_code == 200 and quoted.json()["id"] == first.json()["id"]
    # Another producer's same key is its own: a new job, never the first one's.
    theirs = api.as_("other").post("/v1/jobs", json=spec, headers=headers)
    assert theirs.status_code == 201 and theirs.json()["id"] != first.json()["id"]


def test_cancel_and_purge(api: Api) -> None:
    api.fake.token_delay_ms = 20
    job = api.create("A very long answer nobody will wait for.")
    wait_for(lambda: api.store.get(job["id"]).spent_output_tokens > 0, timeout_s=20)
    cancelled = api.as_("web").post(f"/v1/jobs/{job['id']}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
    assert cancelled.json()["already_ended"] is False
    again = api.as_("web").post(f"/v1/jobs/{job['id']}/cancel")
    assert again.status_code == 200 and again.json()["already_ended"] is True
    assert again.json()["revision"] == cancelled.json()["revision"]  # nothing written
    assert api.as_("web").delete(f"/v1/jobs/{job['id']}").status_code == 403
    assert api.as_("ops").delete(f"/v1/jobs/{job['id']}").status_code == 204
    assert api.as_("ops").get(f"/v1/jobs/{job['id']}").status_code == 404


def test_cancelling_an_ended_job_answers_alike_over_http_and_in_the_cli(api: Api) -> None:
    job = api.create("Done before anyone cancels it.", budget_tokens=40)
    api.wait_state(job["id"], {"done"})
    over_http = api.as_("ops").post(f"/v1/jobs/{job['id']}/cancel")
    assert over_http.status_code == 200, over_http.text
    cli = run("cancel", job["id"], "--json", url=api.cluster.env["RESUMEQ_REDIS_URL"])
    assert cli.returncode == 0, cli.stderr
    from_cli = json.loads(cli.stdout)
    for answer in (over_http.json(), from_cli):
        assert answer["already_ended"] is True and answer["state"] == "done"
    assert {k: v for k, v in over_http.json().items() if k != "links"} == from_cli  # HTTP links
    assert api.store.get(job["id"]).state.value == "done"


# -- who may do what -------------------------------------------------------------------------


def test_the_role_matrix(api: Api) -> None:
    job = api.create("Whose job is this?", budget_tokens=50)
    api.wait_state(job["id"], {"done"})
    jid = job["id"]
    expected = {
        # what:                            web  other  ops  dash  none  bad
        ("GET", f"/v1/jobs/{jid}"): (200, 404, 200, 200, 401, 401),
        ("GET", f"/v1/jobs/{jid}/events"): (200, 404, 200, 200, 401, 401),
        ("POST", f"/v1/jobs/{jid}/cancel"): (200, 404, 200, 403, 401, 401),
        ("GET", "/v1/stats"): (403, 403, 200, 200, 401, 401),
        ("GET", "/healthz"): (403, 403, 200, 200, 401, 401),
        ("POST", "/v1/jobs"): (201, 201, 201, 403, 401, 401),
        ("DELETE", "/v1/jobs/no-such-job"): (403, 403, 404, 403, 401, 401),
        ("GET", "/v1/spill"): (403, 403, 200, 200, 401, 401),
        ("GET", "/v1/spill/export"): (403, 403, 200, 403, 401, 401),
        ("POST", f"/v1/spill/{jid}/requeue"): (403, 403, 409, 403, 401, 401),
        ("POST", f"/v1/spill/{jid}/drop"): (403, 403, 409, 403, 401, 401),
    }
    body = {"prompt": "Matrix.", "provider": "fake", "model": "m", "budget_tokens": 20}
    for (method, path), statuses in expected.items():
        got = []
        for who in ("web", "other", "ops", "dash", None, "bad"):
            headers = auth(who) if who != "bad" else {"Authorization": "Bearer rq_wrong"}
            kwargs: dict[str, Any] = {"json": body} if path == "/v1/jobs" else {}
            with httpx.Client(base_url=api.base, timeout=30) as client:
                response = client.request(method, path, headers=headers, **kwargs)
            got.append(response.status_code)
            if response.status_code >= 400:
                assert response.headers["content-type"] == "application/problem+json", path
        assert tuple(got) == statuses, (method, path, got)


# -- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "status", "field_"),
    [
        (b"{not json", 400, "body"),
        (b"[1, 2]", 422, "body"),
        (b'{"prompt": "x", "provider": "fake", "model": "m", "budget_tokens": NaN}', 400, "body"),
        (b'{"prompt": "x", "provider": "nope", "model": "m", "budget_tokens": 5}', 422, "provider"),
        (
            b'{"prompt": "x", "provider": "fake", "model": "m", "budget_tokens": -5}',
            422,
            "budget_tokens",
        ),
        (
            b'{"prompt": "x", "provider": "fake", "model": "m", "budget_tokens": "800"}',
            422,
            "budget_tokens",
        ),
        (
            b'{"prompt": "x", "provider": "fake", "model": "m", "budget_tokens": 1e30}',
            422,
            "budget_tokens",
        ),
        (
            b'{"prompt": "x", "provider": "fake", "model": "m", "budget_tokens": 5,'
            b' "base_url": "http://evil"}',
            422,
            "base_url",
        ),
        (
            b'{"prompt": "x", "provider": "fake", "model": "m", "budget_tokens": 5,'
            b' "headers": {"x": "y"}}',
            422,
            "headers",
        ),
    ],
)
def test_a_bad_body_is_a_problem_naming_the_field_and_nothing_is_written(
    api: Api, body: bytes, status: int, field_: str
) -> None:
    before = records(api)
    response = api.as_("web").post(
        "/v1/jobs", content=body, headers={"Content-Type": "application/json"}
    )
    assert response.status_code == status, response.text
    problem = response.json()
    assert response.headers["content-type"] == "application/problem+json"
    assert problem["status"] == status and field_ in problem["detail"]
    assert records(api) == before


def records(api: Api) -> set[bytes]:
    """What creating a job writes first: its record, and its idempotency key if it has one
    (not every key: the module's other jobs' workers and janitor write beside the test)."""
    redis = api.store.redis
    jobs = {k for k in redis.scan_iter(match="resumeq:job:*", count=1000) if k.endswith(b"}")}
    return jobs | set(redis.scan_iter(match="resumeq:idem:*", count=1000))


def test_sizes_ids_revisions_and_media_types(api: Api) -> None:
    web = api.as_("web")
    huge = {"prompt": "x" * 70_000, "provider": "fake", "model": "m", "budget_tokens": 5}
    assert web.post("/v1/jobs", json=huge).status_code == 413
    assert web.post("/v1/jobs", content=b"prompt=x",
                    headers={"Content-Type": "text/plain"}).status_code == 415  # fmt: skip
    odd = web.get("/v1/jobs/a%20b%7Bc")
    assert odd.status_code == 404 and odd.json()["errors"][0]["field"] == "id"
    assert web.get("/v1/jobs/nosuchjob").status_code == 404
    job = api.create("Revisions.", budget_tokens=30)
    api.wait_state(job["id"], {"done"})
    revision = api.store.get(job["id"]).revision
    for headers, params, name, status in (
        ({"Last-Event-ID": "abc"}, {}, "Last-Event-ID", 400),
        ({"Last-Event-ID": "7.0"}, {}, "Last-Event-ID", 400),
        ({}, {"after": "-1"}, "after", 400),
        ({}, {"after": " 3"}, "after", 400),
        # well formed, but past the job's last revision: its state does not allow it
        ({"Last-Event-ID": str(revision + 5)}, {}, "Last-Event-ID", 409),
        ({}, {"after": str(revision + 1)}, "after", 409),
    ):
        response = web.get(f"/v1/jobs/{job['id']}/events", headers=headers, params=params)
        assert response.status_code == status, (headers, params)
        assert response.json()["errors"][0]["field"] == name
    # An empty Last-Event-ID is none (the SSE standard's reset): the whole text again.
    whole, ended = read_events(api, job["id"], last_event_id="")
    assert ended and text_of(whole) == api.store.snapshot(job["id"])[1] != ""
    for key in ("sp ace", '"unclosed', "sk-aaaaaaaaaaaaaaaaaaaa", "//host/path", '""'):
        refused = web.post("/v1/jobs", json={}, headers={"Idempotency-Key": key})
        assert refused.status_code == 400, key
        assert refused.json()["errors"][0]["field"] == "Idempotency-Key", key
    wrong = web.put(f"/v1/jobs/{job['id']}")
    assert wrong.status_code == 405 and set(wrong.headers["allow"].split(", ")) >= {"GET", "DELETE"}
    assert wrong.headers["content-type"] == "application/problem+json"


def test_a_server_on_a_public_address_with_no_tokens_refuses_to_start(
    api: Api, tmp_path: Path
) -> None:
    config = write_config(tmp_path / "open.toml", {"server": {"host": "0.0.0.0"}})
    cluster = Cluster(tmp_path, redis_url=api.cluster.env["RESUMEQ_REDIS_URL"], config=config)
    try:
        proc = cluster.command("serve", "--port", str(free_port()))
        assert proc.wait(timeout=30) == 1
        assert "refusing to serve on 0.0.0.0 with no [server] tokens" in proc.output()
    finally:
        cluster.stop()


def test_redis_down_is_a_503_with_retry_after_not_a_hung_request(api: Api, tmp_path: Path) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    with another_server(tmp_path, dead, api=api, wait=False) as base:

        def answers() -> httpx.Response | None:
            try:
                return httpx.get(f"{base}/healthz", timeout=10)
            except httpx.TransportError:
                return None

        health = wait_for(answers, timeout_s=30, what="the server")
        assert health.status_code == 503 and health.headers["retry-after"] == "1"
        assert health.json()["detail"].startswith("Redis is unreachable")
        spec = {"prompt": "x", "provider": "fake", "model": "m", "budget_tokens": 5}
        began = time.monotonic()
        for method, path, kwargs in (
            ("POST", "/v1/jobs", {"json": spec}),
            ("GET", "/v1/jobs/abc", {}),
            ("GET", "/v1/jobs/abc/events", {}),
        ):
            response = httpx.request(method, f"{base}{path}", timeout=20, **kwargs)
            assert response.status_code == 503, (path, response.text)
            assert response.headers["content-type"] == "application/problem+json"
        assert time.monotonic() - began < 20


scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)
SPEC_FIELDS = ["prompt", "messages", "provider", "model", "budget_tokens", "floor_tokens",
               "exit", "params", "metadata", "hooks", "idempotency_key", "system"]  # fmt: skip
bodies = st.dictionaries(st.sampled_from(SPEC_FIELDS) | st.text(max_size=10), json_values,
                         max_size=7)  # fmt: skip


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(body=bodies | json_values)
def test_any_body_is_answered_never_a_500(api: Api, body: Any) -> None:
    response = api.as_("web").post("/v1/jobs", json=body)
    assert response.status_code in (200, 201, 400, 413, 422), response.text
    if response.status_code >= 400:
        assert response.headers["content-type"] == "application/problem+json"
        assert response.json()["detail"]


# -- the spill lane ----------------------------------------------------------------------------


def test_the_spill_lane_pages_exports_requeues_and_drops(api: Api) -> None:
    prompts = [f"Spill lane case {n}: describe the quay." for n in range(3)]
    api.fake.add_faults([{"kind": "disconnect", "after_tokens": 20, "match": p} for p in prompts])
    jobs = [api.create(p, exit={"on_cut": "spill"}) for p in prompts]
    for job in jobs:
        api.wait_state(job["id"], {"spilled"})
    ours = {job["id"] for job in jobs}
    where = {"reason": "on_cut is spill", "provider": "fake"}
    first = api.as_("dash").get("/v1/spill", params={**where, "limit": 2})
    assert first.status_code == 200
    page = first.json()
    assert len(page["items"]) == 2 and page["next_cursor"]
    rest = api.as_("dash").get(
        "/v1/spill", params={**where, "limit": 2, "cursor": page["next_cursor"]}
    )
    listed = page["items"] + rest.json()["items"]
    assert {item["id"] for item in listed} >= ours and rest.json()["next_cursor"] is None
    assert len({item["id"] for item in listed}) == len(listed)  # no job twice across pages
    entry = next(item for item in listed if item["id"] == jobs[0]["id"])
    assert set(entry) >= {"id", "reason", "spilled_at", "prefix_chars", "provider", "queue"}
    assert entry["prefix_chars"] > 0

    export = api.as_("ops").get("/v1/spill/export", params=where)
    assert export.status_code == 200
    assert export.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(line) for line in export.text.splitlines()]
    exported = {line["id"]: line for line in lines}
    assert ours <= set(exported)
    assert exported[jobs[0]["id"]]["messages"][0]["content"] == prompts[0]

    # Bad requeues: named, nothing changed.
    spilled = jobs[0]["id"]
    for body, name in (
        ({"provider": "nope"}, "provider"),
        ({"to": "resumeq-spill"}, "to"),
        ({"to": "bad queue"}, "to"),
        ({"budget": 9}, "budget"),
    ):
        response = api.as_("ops").post(f"/v1/spill/{spilled}/requeue", json=body)
        assert response.status_code == 422 and response.json()["errors"][0]["field"] == name
    assert api.store.get(spilled).state.value == "spilled"
    assert api.as_("dash").post(f"/v1/spill/{spilled}/requeue").status_code == 403
    assert api.as_("web").get("/v1/spill").status_code == 403

    requeued = api.as_("ops").post(f"/v1/spill/{spilled}/requeue", json={"to": "resumeq"})
    # queued — or already taken by a worker, which may be quicker than the answer
    assert requeued.status_code == 200 and requeued.json()["state"] in {"queued", "running"}
    api.wait_state(spilled, {"done"})
    assert api.store.text(spilled) == api.canonical(prompts[0])
    assert api.as_("ops").post(f"/v1/spill/{spilled}/requeue").status_code == 409  # done

    dropped = api.as_("ops").post(f"/v1/spill/{jobs[1]['id']}/drop")
    assert dropped.status_code == 200 and dropped.json()["state"] == "dropped"
    for params in ({"limit": "0"}, {"limit": "x"}, {"cursor": "nonsense"}):
        response = api.as_("dash").get("/v1/spill", params=params)
        assert response.status_code == 400, params


# -- metrics ----------------------------------------------------------------------------------


def scrape(api: Api, who: str = "dash") -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    response = api.as_(who).get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            labels = tuple(sorted(sample.labels.items()))
            samples.setdefault(sample.name, {})[labels] = sample.value
    return samples


def unsettled(api: Api) -> list[str]:
    """The jobs still in flight, or ended with an attempt not yet recorded. A job cancelled
    mid-stream ends at once; its attempt's record (and its tokens in the totals) comes when
    the worker sees the cancel, a flush later."""
    pending = []
    for key in api.store.redis.scan_iter(match=f"{names.PREFIX}:job:{{*}}", count=1000):
        job_id = key.decode().split("{", 1)[1].rstrip("}")
        record = api.store.get(job_id)
        in_flight = record.state.value in ("queued", "running", "stalled")
        if in_flight or len(api.store.ledger(job_id)) < record.attempt:
            pending.append(f"{job_id} ({record.state.value}, attempt {record.attempt})")
    return pending


def test_metrics_parse_and_their_token_totals_equal_the_ledgers(api: Api) -> None:
    wait_for(lambda: not unsettled(api), timeout_s=60, what="every attempt recorded")
    before = scrape(api)
    prompts = [f"Metrics case {n}: the tides of the estuary." for n in range(4)]
    api.fake.token_delay_ms = 1
    api.fake.add_faults(
        [{"kind": "disconnect", "after_tokens": 25 + 10 * n, "match": p} for n, p in
         enumerate(prompts)]
    )  # fmt: skip
    jobs = [api.create(p) for p in prompts]
    for job in jobs:
        api.wait_state(job["id"], {"done"})
    after = scrape(api)

    def delta(name: str, **labels: str) -> float:
        key = tuple(sorted(labels.items()))
        return after.get(name, {}).get(key, 0.0) - before.get(name, {}).get(key, 0.0)

    ledgers = [a for job in jobs for a in api.store.ledger(job["id"])]
    billed_out = sum(a["output_tokens"] or a["output_tokens_persisted"] for a in ledgers)
    billed_in = sum(a["input_tokens"] or 0 for a in ledgers)
    cached = sum(a["cached_input_tokens"] or 0 for a in ledgers)
    tokens = "resumeq_tokens_billed_total"
    assert delta(tokens, provider="fake", type="output") == billed_out
    assert delta(tokens, provider="fake", type="input") == billed_in - cached
    assert delta(tokens, provider="fake", type="cached_input") == cached
    assert delta("resumeq_output_tokens_needed_total", provider="fake") == sum(
        a["output_tokens_persisted"] for a in ledgers
    )
    assert delta("resumeq_output_tokens_saved_total", provider="fake") > 0  # four cuts
    cuts = [(a["kind"], a["cut"], a["detail"]) for a in ledgers]
    assert delta("resumeq_cuts_total", provider="fake", cause="stream_cut") == 4, cuts
    assert delta("resumeq_attempts_total", provider="fake", kind="resume", outcome="done") == 4
    assert delta("resumeq_jobs", queue="resumeq", state="done") == 4
    assert delta("resumeq_resume_latency_seconds_count") == 4
    assert delta("resumeq_flush_latency_seconds_count") >= 8
    buckets = after["resumeq_flush_latency_seconds_bucket"]
    counts = [buckets[k] for k in sorted(buckets, key=lambda k: float(dict(k)["le"]))]
    assert counts == sorted(counts)  # cumulative
    assert set(after["resumeq_spill_depth"]) >= {(("reason", "on_cut"),), (("reason", "floor"),)}
    text = api.as_("dash").get("/metrics").text
    assert all(job["id"] not in text for job in jobs)  # no job id, as a name or a label
    assert api.as_("web").get("/metrics").status_code == 403


def test_metrics_count_every_provider_redis_holds_not_those_the_config_names(api: Api) -> None:
    """A profile the serving process does not name (another deployment's, or one removed
    from the config) keeps its series: the attempts the metrics count are those ``stats``
    counts."""
    wait_for(lambda: not unsettled(api), timeout_s=60, what="every attempt recorded")
    store = api.store
    created = store.create(
        {"prompt": "Counted elsewhere", "provider": "retired", "model": "m", "budget_tokens": 50}
    )
    got = store.acquire(created.id, worker="elsewhere", ttl_ms=5000)
    entry = AttemptRecord(attempt=1, kind="fresh", worker="elsewhere", outcome="done",
                          cut="finished", provider="retired", output_tokens=7,
                          output_tokens_persisted=7, counts_exact=True)  # fmt: skip
    store.finish(got.lease, state="done", finish_reason="stop", ledger=entry.to_json_dict())
    samples = scrape(api)
    attempts = samples["resumeq_attempts_total"]
    assert attempts[(("kind", "fresh"), ("outcome", "done"), ("provider", "retired"))] == 1
    stats = api.as_("dash").get("/v1/stats").json()
    assert sum(attempts.values()) == stats["attempts"]
    assert "retired" in stats["providers"]
    billed = samples["resumeq_tokens_billed_total"]
    assert billed[(("provider", "retired"), ("type", "output"))] == 7
    # Retired on purpose, its series go (the totals of all providers keep what it counted).
    assert store.forget_provider("retired")
    after = scrape(api).get("resumeq_attempts_total", {})  # no series at all, maybe
    assert not any(dict(k).get("provider") == "retired" for k in after)


def test_followers_of_several_jobs_share_one_read_and_leave_nothing_running(api: Api) -> None:
    """Five followers of two jobs: two feeds, one blocking XREAD on one connection; all of
    it gone once they go."""
    api.fake.token_delay_ms = 30
    jobs = [api.create(f"A slow answer for many followers at once, number {n}.") for n in (1, 2)]
    for job in jobs:
        wait_for(lambda j=job: api.store.get(j["id"]).spent_output_tokens > 0, timeout_s=20)
    streams, readers = [], []
    clients = [httpx.Client(base_url=api.base, timeout=30) for _ in range(5)]

    def gauges() -> tuple[float, float, float]:
        samples = scrape(api)
        return (
            samples["resumeq_server_followers"][()],
            samples["resumeq_server_feeds"][()],
            samples["resumeq_server_readers"][()],
        )

    def blocked_reads() -> int:
        clients = api.store.redis.client_list()
        return sum(1 for c in clients if c["cmd"] == "xread" and "b" in c["flags"])

    try:
        for n, client in enumerate(clients):
            job = jobs[n % 2]
            stream = client.stream("GET", f"/v1/jobs/{job['id']}/events", headers=auth("web"))
            response = stream.__enter__()
            assert response.status_code == 200
            lines = response.iter_lines()  # kept: a reader dropped closes its connection
            assert [next(lines), next(lines)] == ["retry: 1000", ": following"]
            streams.append(stream)
            readers.append(lines)
        wait_for(lambda: gauges() == (5, 2, 1), timeout_s=10, what="5 followers, 2 feeds, 1 read")
        wait_for(lambda: blocked_reads() == 1, timeout_s=5, what="one blocking read")
        assert max(blocked_reads() for _ in range(20)) == 1
        for stream in streams:
            stream.__exit__(None, None, None)  # the followers go away mid-stream
    finally:
        for client in clients:
            client.close()
    wait_for(lambda: gauges() == (0, 0, 0), timeout_s=10, what="no follower, feed or read left")
    wait_for(lambda: blocked_reads() == 0, timeout_s=5, what="no blocking read left")
    for job in jobs:
        assert api.store.get(job["id"]).state.value == "running"  # the job itself goes on
        api.as_("web").post(f"/v1/jobs/{job['id']}/cancel")


def test_a_server_following_its_most_jobs_answers_503_for_one_more(
    api: Api, tmp_path: Path
) -> None:
    spec = {"prompt": "Waiting on a queue nobody serves.", "provider": "fake", "model": "m",
            "budget_tokens": 20}  # fmt: skip
    first, second = (
        enqueue_job(api.store, api.store.redis, spec, queue="nobody").id,
        enqueue_job(api.store, api.store.redis, {**spec, "prompt": "Another."}, queue="nobody").id,
    )
    redis_url = api.cluster.env["RESUMEQ_REDIS_URL"]
    try:
        with (
            another_server(tmp_path, redis_url, api=api, max_followed_jobs=1) as base,
            httpx.Client(base_url=base, timeout=30) as client,
            client.stream("GET", f"/v1/jobs/{first}/events") as held,
        ):
            lines = held.iter_lines()
            assert [next(lines), next(lines)] == ["retry: 1000", ": following"]
            refused = httpx.get(f"{base}/v1/jobs/{second}/events", timeout=10)
            assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
            assert "max_followed_jobs" in refused.json()["detail"]
    finally:
        api.store.cancel(first)
        api.store.cancel(second)


def test_a_job_followed_while_the_read_blocks_is_read_at_once(api: Api) -> None:
    """One job followed keeps the process's read blocked (for up to a second at a time); a
    second job followed meanwhile unblocks it, so the second job's events arrive at once,
    not at the next read. Four times: a read that only waited its second out would miss
    the bound in most of them."""
    spec = {"prompt": "Waiting on a queue nobody serves.", "provider": "fake", "model": "m",
            "budget_tokens": 20}  # fmt: skip

    def quiet_job(n: int) -> str:
        job_id = enqueue_job(
            api.store, api.store.redis, {**spec, "prompt": f"Quiet {n}."}, queue="nobody"
        ).id
        api.store.redis.hset(keys.job(job_id), "owner", TOKENS["web"][1])
        return job_id

    held_id = quiet_job(0)
    with (
        httpx.Client(base_url=api.base, timeout=30) as client,
        client.stream("GET", f"/v1/jobs/{held_id}/events", headers=auth("web")) as held,
    ):
        held_lines = held.iter_lines()
        assert [next(held_lines), next(held_lines)] == ["retry: 1000", ": following"]
        for n in range(1, 5):
            job_id = quiet_job(n)
            with client.stream("GET", f"/v1/jobs/{job_id}/events", headers=auth("web")) as r:
                lines = r.iter_lines()
                assert [next(lines), next(lines)] == ["retry: 1000", ": following"]
                time.sleep(0.05)  # the unblock, if any, has landed
                cancelled = time.monotonic()
                api.store.cancel(job_id)
                for line in lines:
                    if line == "event: end":
                        break
                waited = time.monotonic() - cancelled
            assert waited < 0.35, f"job {n}: its end came {waited:.3f} s after the cancel"
    api.store.cancel(held_id)


def test_concurrent_followers_never_pass_the_limits_together(api: Api, tmp_path: Path) -> None:
    """Twelve followers of six jobs at once, on a server that follows at most three jobs
    and lets a producer hold at most four streams: the checks and the join are one step,
    so no burst slips past either; an operator is not counted against a producer."""
    spec = {"prompt": "Waiting on a queue nobody serves.", "provider": "fake", "model": "m",
            "budget_tokens": 20}  # fmt: skip
    ids = [
        enqueue_job(api.store, api.store.redis, {**spec, "prompt": f"Job {n}."}, queue="nobody").id
        for n in range(6)
    ]
    for job_id in ids:  # the API's producer owns them (enqueued here without an owner)
        api.store.redis.hset(keys.job(job_id), "owner", TOKENS["web"][1])
    redis_url = api.cluster.env["RESUMEQ_REDIS_URL"]
    limits = {"max_followed_jobs": 3, "max_streams_per_producer": 4, "tokens": token_entries()}
    held: list[Any] = []
    try:
        with (
            another_server(tmp_path, redis_url, api=api, **limits) as base,
            httpx.Client(base_url=base, timeout=30) as client,
        ):

            def open_one(job_id: str, who: str) -> int:
                stream = client.stream("GET", f"/v1/jobs/{job_id}/events", headers=auth(who))
                response = stream.__enter__()
                if response.status_code == 200:
                    lines = response.iter_lines()  # kept: a reader dropped closes its stream
                    held.append((stream, lines))
                    next(lines)
                else:
                    response.read()
                    stream.__exit__(None, None, None)
                return response.status_code

            with ThreadPoolExecutor(12) as pool:
                codes = list(pool.map(open_one, ids + ids, ["web"] * 12))
            assert codes.count(200) == 4, codes  # the producer's cap
            assert set(codes) <= {200, 429, 503}, codes
            followed = {j for j, c in zip(ids + ids, codes, strict=True) if c == 200}
            assert len(followed) <= 3  # the server's cap on jobs
            assert open_one(next(iter(followed)), "ops") == 200  # an operator: not capped
            refused = client.get(f"/v1/jobs/{next(iter(followed))}/events", headers=auth("web"))
            assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
            assert "max_streams_per_producer" in refused.json()["detail"]
            for stream, _ in held:
                stream.__exit__(None, None, None)
            held.clear()
            # Freed as the server sees them go: the producer follows again.
            wait_for(lambda: open_one(ids[0], "web") == 200, timeout_s=10, what="a stream freed")
    finally:
        for stream, _ in held:
            stream.__exit__(None, None, None)
        for job_id in ids:
            api.store.cancel(job_id)


def test_openapi_names_every_route_and_the_job_spec(api: Api) -> None:
    response = api.as_("dash").get("/openapi.json")
    assert response.status_code == 200
    doc = response.json()
    assert doc["openapi"] == "3.1.0"
    app = create_app(Settings())
    served = {
        (route.path, method.lower())
        for route in app.routes
        if isinstance(route, Route) and not route.path.startswith("/console")  # pages
        for method in (route.methods or ()) - {"HEAD", "OPTIONS"}  # implicit, both
    }
    documented = {
        (path, method)
        for path, item in doc["paths"].items()
        for method in item
        if method != "parameters"
    }
    # The drop-in endpoints (issue 34) speak the OpenAI and Anthropic wires, tested with
    # their official SDKs; their entries in this document are still to come.
    drop_in = {(path, m.lower()) for path, _, methods in gateway.ROUTES for m in methods}
    assert served - drop_in == documented
    spec = doc["components"]["schemas"]["JobSpec"]
    # every field of the model, and no other
    assert set(spec["properties"]) == set(JobSpec.model_fields)
    # what this server creates jobs for: its configured profiles, its queues
    assert spec["properties"]["provider"]["enum"] == ["fake", "fake-reserved"]
    create = doc["paths"]["/v1/jobs"]["post"]
    (queue,) = [p for p in create["parameters"] if p["name"] == "queue"]
    assert queue["schema"]["enum"] == ["resumeq"]
    limits = Settings().file.limits
    assert spec["properties"]["budget_tokens"]["maximum"] == limits.max_budget_tokens
    events = doc["paths"]["/v1/jobs/{job_id}/events"]["get"]["responses"]["200"]
    assert set(events["content"]) == {"text/event-stream"}
    ids = [op["operationId"] for item in doc["paths"].values() for m, op in item.items()
           if m != "parameters"]  # fmt: skip
    assert len(ids) == len(set(ids)) == len(documented)
    links = create["responses"]["201"]["links"]
    assert {link["operationId"] for link in links.values()} <= set(ids)
    missing = api.as_(None).get("/openapi.json")
    assert missing.status_code == 401 and "401" in doc["paths"]["/openapi.json"]["get"]["responses"]
    # every role reads it: a producer's developer with the token it was given
    for who in ("web", "ops"):
        assert api.as_(who).get("/openapi.json").json() == doc, who


def test_serve_with_several_processes_answers_from_each(api: Api, tmp_path: Path) -> None:
    """``--workers 2``: uvicorn's processes build the app from the environment; followers
    on either get the job's text, each process with its own readers."""
    redis_url = api.cluster.env["RESUMEQ_REDIS_URL"]
    with another_server(tmp_path, redis_url, "--workers", "2", api=api) as base:
        prompt = "Two server processes, one answer."
        created = httpx.post(f"{base}/v1/jobs", timeout=30, json={
            "prompt": prompt, "provider": "fake", "model": "m", "budget_tokens": 400})  # fmt: skip
        assert created.status_code == 201
        job_id = created.json()["id"]
        texts = []
        for _ in range(4):  # new connections: the kernel spreads them over both processes
            with httpx.stream("GET", f"{base}/v1/jobs/{job_id}/events", timeout=30) as r:
                texts.append(text_of(list(sse_frames(r.iter_lines()))))
        assert texts == [api.canonical(prompt)] * 4


def sse_frames(lines: Iterator[str]) -> Iterator[Event]:
    """SSE events from a stream's lines, as they come (comments skipped)."""
    current: dict[str, str] = {}
    for line in lines:
        if line.startswith(":"):
            continue
        if line:
            name, _, value = line.partition(":")
            current[name] = value.removeprefix(" ")
        elif "data" in current:  # a block without data is no event (the opening retry:)
            yield Event(current.get("id"), current["event"], json.loads(current["data"]))
            current = {}
        else:
            current = {}


def test_a_redis_outage_mid_stream_ends_the_stream_and_the_reconnect_resumes(
    tmp_path: Path,
) -> None:
    with RedisServer(appendonly=True, directory=tmp_path / "redis") as redis_server:
        port = free_port()
        config = write_config(tmp_path / "r.toml", {"server": {"port": port}})
        cluster = Cluster(tmp_path, redis_url=redis_server.url, config=config)
        store = Store.from_url(redis_server.url)
        try:
            cluster.command("serve")
            base = f"http://127.0.0.1:{port}"
            wait_for(lambda: _up(base), timeout_s=30, what="resumeq serve")
            spec = {"prompt": "Outage.", "provider": "p", "model": "m", "budget_tokens": 50}
            job_id = store.create(spec, queue="nobody").id  # written by hand: no worker
            got = store.acquire(job_id, worker="w1", ttl_ms=120_000)
            revision = store.flush(
                got.lease, expected_revision=got.record.revision, delta="Hello, ", tokens=2
            ).revision
            with httpx.stream("GET", f"{base}/v1/jobs/{job_id}/events", timeout=30) as r:
                events = sse_frames(r.iter_lines())
                first = next(e for e in events if e.event == "delta")
                assert first.data == {"text": "Hello, ", "revision": revision}
                began = time.monotonic()
                redis_server.stop()
                assert list(events) == []  # the stream ends, with no end event
                assert time.monotonic() - began < 15
            redis_server.start()
            wait_for(lambda: _up(base), timeout_s=30, what="Redis back")
            lease = got.lease
            revision = store.flush(lease, expected_revision=revision, delta="world.", tokens=2)
            store.finish(lease, state="done", expected_revision=revision.revision)
            headers = {"Last-Event-ID": first.id or ""}
            with httpx.stream(
                "GET", f"{base}/v1/jobs/{job_id}/events", headers=headers, timeout=30
            ) as r:
                rest = list(sse_frames(r.iter_lines()))
            assert text_of(rest) == "world." and rest[-1].event == "end"
        finally:
            cluster.stop()
            store.redis.close()


def test_a_requeue_to_a_queue_no_worker_listens_on_is_done_with_a_warning(api: Api) -> None:
    prompts = [f"Requeued where nobody listens, case {n}: the night ferry." for n in range(2)]
    api.fake.add_faults([{"kind": "disconnect", "after_tokens": 10, "match": p} for p in prompts])
    jobs = [api.create(p, exit={"on_cut": "spill"})["id"] for p in prompts]
    for job_id in jobs:
        api.wait_state(job_id, {"spilled"})
    lonely = api.as_("ops").post(f"/v1/spill/{jobs[0]}/requeue", json={"to": "night-shift"})
    assert lonely.status_code == 200, lonely.text
    assert lonely.json()["queue"] == "night-shift" and lonely.json()["state"] == "queued"
    [warning] = lonely.json()["warnings"]
    assert "'night-shift'" in warning and "no live worker" in warning
    served = api.as_("ops").post(f"/v1/spill/{jobs[1]}/requeue", json={"to": "resumeq"})
    assert served.status_code == 200 and served.json()["warnings"] == []
    api.wait_state(jobs[1], {"done"})
    assert api.store.get(jobs[0]).state.value == "queued"  # waiting, as warned
    assert api.as_("ops").post(f"/v1/jobs/{jobs[0]}/cancel").status_code == 200


def test_a_follower_of_a_spilled_job_is_told_end_and_after_a_requeue_reads_on(api: Api) -> None:
    """Before: a feed stopped at the first spill, so after a requeue every follower was
    told the job had spilled and never saw the rest."""
    prompt = "Spilled, then requeued: the lock keeper's night."
    api.fake.add_faults([{"kind": "disconnect", "after_tokens": 30, "match": prompt}])
    job = api.create(prompt, exit={"on_cut": "spill"})
    api.wait_state(job["id"], {"spilled"})
    events, ended = read_events(api, job["id"])
    assert ended and events[-1].data == {"state": "spilled"}
    spill_id = events[-1].id
    requeued = api.as_("ops").post(f"/v1/spill/{job['id']}/requeue")
    assert requeued.status_code == 200
    events, ended = read_events(api, job["id"])  # from the start, after the requeue
    assert ended and events[-1].data == {"state": "done"}
    assert text_of(events) == api.canonical(prompt)
    states = [e.data["state"] for e in events if e.event == "state"]
    assert "spilled" in states and states[-1] == "done"
    rest, ended = read_events(api, job["id"], last_event_id=spill_id)
    assert ended and text_of(events).endswith(text_of(rest))
    # Reconnecting after the last event still gets the end, at once.
    last = next(e.id for e in reversed(events) if e.id is not None)
    tail, ended = read_events(api, job["id"], last_event_id=last)
    assert ended and [e.event for e in tail] == ["end"] and tail[0].data == {"state": "done"}


def test_more_bad_input_found_in_review_is_a_4xx(api: Api) -> None:
    web = api.as_("web")
    job = api.create("Review inputs.", budget_tokens=20)
    for params in ({"after": "²"}, {"after": "1" * 30}):
        response = web.get(f"/v1/jobs/{job['id']}/events", params=params)
        assert response.status_code == 400, params
    assert api.as_("dash").get("/v1/spill", params={"limit": "²"}).status_code == 400
    deep = b"[" * 20_000  # under the test's 64 KB limit: the parser's recursion, not the size
    response = web.post("/v1/jobs", content=deep, headers={"Content-Type": "application/json"})
    assert response.status_code == 400 and "nested too deeply" in response.json()["detail"]
    elsewhere = web.post(
        "/v1/jobs",
        params={"queue": "paid-lane"},
        json={"prompt": "x", "provider": "fake", "model": "m", "budget_tokens": 5},
    )
    assert elsewhere.status_code == 422 and elsewhere.json()["errors"][0]["field"] == "queue"


def test_idempotency_ignores_the_order_of_a_bodys_keys(api: Api) -> None:
    headers = {"Idempotency-Key": "order-keys-1"}
    body = {"prompt": "Key order.", "provider": "fake", "model": "m", "budget_tokens": 30,
            "metadata": {"a": 1, "b": 2}}  # fmt: skip
    reordered = {**body, "metadata": {"b": 2, "a": 1}}
    first = api.as_("web").post("/v1/jobs", json=body, headers=headers)
    again = api.as_("web").post("/v1/jobs", json=reordered, headers=headers)
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"]


def test_a_stalled_redis_is_a_503_within_seconds_not_a_hung_request(tmp_path: Path) -> None:
    redis_server = RedisServer(directory=tmp_path / "redis")
    with redis_server, another_server(tmp_path, redis_server.url) as base:
        assert redis_server.process is not None
        os.kill(redis_server.process.pid, signal.SIGSTOP)  # alive, answering nothing
        try:
            began = time.monotonic()
            with ThreadPoolExecutor(1) as pool:
                # A request that needs Redis waits its own timeout, twice, then is a 503.
                stats = pool.submit(httpx.get, f"{base}/v1/stats", timeout=30)
                time.sleep(0.2)
                probed = time.monotonic()
                health = httpx.get(f"{base}/healthz", timeout=30)
                assert health.status_code == 503, health.text
                # The probe, meanwhile, within a load balancer's timeout: one ping, on a
                # connection of its own.
                assert time.monotonic() - probed < 2.0
                assert not stats.done()
                assert stats.result().status_code == 503, stats.result().text
            assert time.monotonic() - began < 15
        finally:
            os.kill(redis_server.process.pid, signal.SIGCONT)


def test_an_idempotent_repeat_answers_the_job_after_an_operator_changed_it(api: Api) -> None:
    """The request that created a job is what a repeat is compared with: a requeue to
    another provider since then does not make the producer's retry a 422."""
    prompt = "Idempotent across a requeue: the pilot boat's log."
    api.fake.add_faults([{"kind": "disconnect", "after_tokens": 20, "match": prompt}])
    body = {"prompt": prompt, "provider": "fake", "model": "m", "budget_tokens": 600,
            "exit": {"on_cut": "spill"}}  # fmt: skip
    headers = {"Idempotency-Key": "pilot-boat-1"}
    first = api.as_("web").post("/v1/jobs", json=body, headers=headers)
    assert first.status_code == 201
    job_id = first.json()["id"]
    api.wait_state(job_id, {"spilled"})
    moved = api.as_("ops").post(f"/v1/spill/{job_id}/requeue", json={"provider": "fake-reserved"})
    assert moved.status_code == 200 and moved.json()["provider"] == "fake-reserved"
    api.wait_state(job_id, {"done"})
    again = api.as_("web").post("/v1/jobs", json=body, headers=headers)
    assert again.status_code == 200 and again.json()["id"] == job_id
    other = api.as_("web").post("/v1/jobs", json={**body, "budget_tokens": 601}, headers=headers)
    assert other.status_code == 422
