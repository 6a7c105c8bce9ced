"""A browser follows a job (SPEC §21): a page on another origin opens ``EventSource`` with a
follow token its backend asked for, in Debian's chromium through Playwright, across a cut
and its resume; the token opens no other job and no write, and expires. CORS answers only
the listed origin; bad tokens are 401 problems, never a 500.

Screenshots go to ``build/screenshots/`` (``browser-follow*.png``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from browser_support import StaticSite, chromium, shot
from serve_support import fake_profile, token_entries

from resumeq.fake import FakeProvider
from resumeq.store import Store
from resumeq.testing import RedisServer
from resumeq.testing.processes import Cluster, wait_for, write_config
from resumeq.testing.redis_server import free_port

pytestmark = pytest.mark.timeout(120)

SECRET_ENV = "RESUMEQ_TEST_FOLLOW_SECRET"
TOKENS = {"web-app": "producer", "other-app": "producer", "ops": "operator"}

#: The page a web app would serve: its backend put the API's address, the job and a
#: follow token in the query (an app's own template would); it follows the job with
#: EventSource and shows the text as it grows.
PAGE = b"""<!doctype html>
<html><head><meta charset="utf-8"><title>Following a job</title>
<style>body{font:15px system-ui;margin:2em} pre{white-space:pre-wrap;background:#f4f4f4;
padding:1em;border-radius:6px} #state{font-weight:bold}</style></head>
<body><h1>An answer, as it is written</h1><p>state: <span id="state">connecting</span></p>
<pre id="text"></pre>
<script>
const q = new URLSearchParams(location.search);
const api = q.get("api"), job = q.get("job"), token = q.get("token");
window.out = {text: "", deltas: 0, state: null, errors: 0, opened: 0};
function follow(id, tok) {
  const source = new EventSource(`${api}/v1/jobs/${id}/events?token=${encodeURIComponent(tok)}`);
  source.onopen = () => { window.out.opened++; };
  source.addEventListener("delta", (e) => {
    const d = JSON.parse(e.data);
    window.out.text += d.text; window.out.deltas++;
    document.getElementById("text").textContent = window.out.text;
  });
  source.addEventListener("state", (e) => {
    document.getElementById("state").textContent = JSON.parse(e.data).state;
  });
  source.addEventListener("end", (e) => {
    window.out.state = JSON.parse(e.data).state;
    document.getElementById("state").textContent = window.out.state + " (ended)";
    source.close();
  });
  source.onerror = () => { window.out.errors++; window.out.ready = source.readyState; };
  return source;
}
if (job) follow(job, token);
window.follow = follow;
window.statusOf = async (path, init) => (await fetch(api + path, init)).status;
</script></body></html>
"""


def bearer(who: str) -> str:
    return f"browser-test-token-{who}"


@dataclass
class Api:
    base: str
    store: Store
    fake: FakeProvider
    page_site: StaticSite

    def client(self, who: str | None = "web-app") -> httpx.Client:
        headers = {"Authorization": f"Bearer {bearer(who)}"} if who else {}
        return httpx.Client(base_url=self.base, headers=headers, timeout=30)

    def create(self, prompt: str, who: str = "web-app", **over: Any) -> str:
        spec = {"prompt": prompt, "provider": "fake", "model": "m", "budget_tokens": 3000}
        with self.client(who) as http:
            response = http.post("/v1/jobs", json={**spec, **over})
        assert response.status_code == 201, response.text
        return str(response.json()["id"])

    def follow_token(self, job_id: str, who: str = "web-app", **body: Any) -> dict[str, Any]:
        with self.client(who) as http:
            response = http.post(f"/v1/jobs/{job_id}/follow-token", json=body)
        assert response.status_code == 200, response.text
        return dict(response.json())

    def wait_done(self, job_id: str) -> None:
        wait_for(lambda: self.store.get(job_id).state.value == "done", timeout_s=40,
                 what=f"{job_id} done")  # fmt: skip


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    tmp: Path = tmp_path_factory.mktemp("browser")
    with (
        RedisServer() as redis_server,
        FakeProvider(completion_tokens=400) as fake,
        StaticSite(PAGE) as page_site,
    ):
        profile = fake_profile(fake)
        tokens = token_entries(TOKENS, bearer)
        port = free_port()
        config = write_config(
            tmp / "resumeq.toml",
            {
                "providers": {"fake": profile},
                "worker": {"flush_tokens": 8, "flush_ms": 50},
                "janitor": {"interval_s": 0.3},
                "server": {
                    "port": port,
                    "tokens": tokens,
                    "keepalive_s": 1.0,
                    "secret_env": SECRET_ENV,
                    "cors_origins": [page_site.origin],
                },
            },
        )
        cluster = Cluster(tmp, redis_url=redis_server.url, config=config)
        cluster.env[SECRET_ENV] = "a-secret-every-serve-process-shares-" + "x" * 16
        try:
            cluster.worker(concurrency=8)
            cluster.janitor(interval_s=0.3)
            cluster.command("serve")
            base = f"http://127.0.0.1:{port}"
            wait_for(lambda: _up(base), timeout_s=30, what="resumeq serve")
            yield Api(base, Store.from_url(redis_server.url), fake, page_site)
        finally:
            cluster.stop()


def _up(base: str) -> bool:
    try:
        return httpx.get(f"{base}/healthz", timeout=1).status_code in (200, 401)
    except httpx.HTTPError:
        return False


@pytest.fixture(autouse=True)
def clean(api: Api) -> None:
    api.fake.reset()
    api.fake.token_delay_ms = 0


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as launched:
        yield launched


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1100, "height": 900})
    page = context.new_page()
    page.set_default_timeout(30_000)
    try:
        yield page
    finally:
        context.close()


def open_page(page: Any, api: Api, job_id: str = "", token: str = "") -> None:
    query = httpx.QueryParams({"api": api.base, "job": job_id, "token": token})
    page.goto(f"{api.page_site.url}?{query}")


def test_a_page_on_another_origin_follows_a_job_through_a_cut_byte_for_byte(
    api: Api, page: Any
) -> None:
    prompt = "A page follows this answer [fake:unicode]"
    api.fake.token_delay_ms = 8
    api.fake.add_faults([{"kind": "disconnect", "after_tokens": 120, "match": prompt}])
    job_id = api.create(prompt)
    issued = api.follow_token(job_id)
    assert issued["events"] == f"/v1/jobs/{job_id}/events?token={issued['token']}"
    assert 3500_000 <= issued["expires_at"] - time.time() * 1000 <= 3600_000  # an hour
    open_page(page, api, job_id, issued["token"])
    page.wait_for_function("window.out.deltas > 3")
    shot(page, "browser-follow-live")
    page.wait_for_function("window.out.state !== null")
    shot(page, "browser-follow-done")
    out = page.evaluate("window.out")
    assert out["state"] == "done" and out["errors"] == 0
    api.wait_done(job_id)
    stored = api.store.text(job_id)
    assert out["text"] == stored == api.fake.canonical_text([{"role": "user", "content": prompt}])
    assert out["text"].encode("utf-8") == stored.encode("utf-8")  # byte for byte
    assert [a["kind"] for a in api.store.ledger(job_id)] == ["fresh", "resume"]


def test_the_token_opens_no_other_job_and_no_write(api: Api, page: Any) -> None:
    mine = api.create("Mine to follow")
    theirs = api.create("Another app's job", who="other-app")
    token = api.follow_token(mine)["token"]
    api.wait_done(mine)
    open_page(page, api)
    quoted = json.dumps(token)
    # Listed origin: the page can read every answer, refusals included.
    assert page.evaluate(f"statusOf('/v1/jobs/{mine}/events?token=' + {quoted})") == 200
    assert page.evaluate(f"statusOf('/v1/jobs/{theirs}/events?token=' + {quoted})") == 404
    assert page.evaluate(f"statusOf('/v1/jobs/{mine}?token=' + {quoted})") == 401
    cancel = f"statusOf('/v1/jobs/{mine}/cancel?token=' + {quoted}, {{method: 'POST'}})"
    assert page.evaluate(cancel) == 401
    bearer_follow = (
        f"statusOf('/v1/jobs/{mine}', {{headers: {{Authorization: 'Bearer ' + {quoted}}}}})"
    )
    assert page.evaluate(bearer_follow) == 401  # a follow token is no bearer token
    assert page.evaluate(f"statusOf('/v1/jobs/{theirs}/follow-token', {{method: 'POST'}})") == 401
    # The other app's job, through EventSource: refused, and EventSource gives up.
    page.evaluate(f"window.theirs = follow('{theirs}', {quoted})")
    page.wait_for_function("window.theirs.readyState === 2")
    assert api.store.get(theirs).state.value in ("running", "done", "queued")


def test_an_expired_token_is_refused_and_an_open_stream_goes_on(api: Api, page: Any) -> None:
    api.fake.token_delay_ms = 10
    job_id = api.create("Followed past its token's expiry")
    issued = api.follow_token(job_id, ttl_s=1.5)
    open_page(page, api, job_id, issued["token"])
    page.wait_for_function("window.out.deltas > 0")
    time.sleep(max(0.0, issued["expires_at"] / 1000 - time.time()) + 0.2)
    # The open stream goes on to its end; a new connection is refused, and gives up.
    page.wait_for_function("window.out.state !== null")
    assert page.evaluate("window.out.state") == "done"
    quoted = json.dumps(issued["token"])
    assert page.evaluate(f"statusOf('/v1/jobs/{job_id}/events?token=' + {quoted})") == 401
    page.evaluate(f"window.late = follow('{job_id}', {quoted})")
    page.wait_for_function("window.late.readyState === 2")
    shot(page, "browser-follow-expired")


def test_bad_tokens_are_401_problems_never_a_500(api: Api) -> None:
    job_id = api.create("A job whose events bad tokens knock on")
    good = api.follow_token(job_id)["token"]
    forged = good[:-4] + ("AAAA" if not good.endswith("AAAA") else "BBBB")
    other_job = good.replace(job_id, "0" * 32)
    for bad in ["", "x", "rqf1.", "rqf1..1.", good + "x", forged, other_job, "ü" * 60,
                "rqf1." + job_id + ".99999999999999." + "A" * 43]:  # fmt: skip
        with api.client(None) as http:
            response = http.get(f"/v1/jobs/{job_id}/events", params={"token": bad})
        assert response.status_code == 401, (bad, response.text)
        assert response.headers["content-type"] == "application/problem+json"
        assert response.json()["errors"][0]["field"] == "token"
    with api.client() as http:
        for body, field in (({"ttl_s": 0}, "ttl_s"), ({"ttl_s": 10**9}, "ttl_s"),
                            ({"ttl_s": "60"}, "ttl_s"), ({"ttl": 5}, "body")):  # fmt: skip
            response = http.post(f"/v1/jobs/{job_id}/follow-token", json=body)
            assert response.status_code == 422, response.text
            assert response.json()["errors"][0]["field"] == field
    # Another producer asks for a token of a job it does not own: as if there were none.
    with api.client("other-app") as http:
        assert http.post(f"/v1/jobs/{job_id}/follow-token").status_code == 404


def test_cors_answers_the_listed_origin_only(api: Api) -> None:
    listed, unlisted = api.page_site.origin, "http://evil.example"
    preflight = {"Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization, content-type"}  # fmt: skip
    with api.client(None) as http:
        answer = http.options("/v1/jobs", headers={"Origin": listed, **preflight})
        assert answer.status_code == 204
        assert answer.headers["access-control-allow-origin"] == listed
        assert "POST" in answer.headers["access-control-allow-methods"]
        assert "Authorization" in answer.headers["access-control-allow-headers"]
        assert "access-control-allow-credentials" not in answer.headers
        refused = http.options("/v1/jobs", headers={"Origin": unlisted, **preflight})
        assert refused.status_code == 204 and "access-control-allow-origin" not in refused.headers
        plain = http.options("/v1/jobs/abc/events")
        assert plain.status_code == 204 and plain.headers["allow"] == "GET, OPTIONS"
        got = http.get("/v1/stats", headers={"Origin": listed})
        assert got.status_code == 401  # no token: refused, and the page may read why
        assert got.headers["access-control-allow-origin"] == listed
        assert "Origin" in got.headers["vary"]
        other = http.get("/v1/stats", headers={"Origin": unlisted})
        assert "access-control-allow-origin" not in other.headers
        # The console is no part of it.
        console = http.get("/console/login", headers={"Origin": listed})
        assert "access-control-allow-origin" not in console.headers
