"""``resumeq serve`` behind Debian's nginx, configured with docs/http-api.md's ``location`` block
(SPEC §21): event streams arrive as they are written, and the console's login and a spill
requeue work through the proxy in a real browser, its same-site checks taking the host and
scheme nginx forwards — while a cross-site POST is still refused.

Screenshots go to ``build/screenshots/`` (``nginx-*.png``).
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
from browser_support import chromium, shot
from serve_support import console_up, fake_profile, token_entries

from resumeq.fake import FakeProvider
from resumeq.store import Store
from resumeq.testing import RedisServer
from resumeq.testing.nginx import Nginx, documented_location
from resumeq.testing.processes import Cluster, wait_for, write_config
from resumeq.testing.redis_server import free_port

pytestmark = pytest.mark.timeout(120)

#: The page whose nginx example the proxy runs.
HTTP_API = Path(__file__).resolve().parent.parent / "docs" / "http-api.md"
TOKENS = {"ops": "operator", "web": "producer"}


def bearer(who: str) -> str:
    return f"nginx-test-token-{who}"


@dataclass
class Proxied:
    proxy: str  # nginx's URL
    direct: str  # resumeq serve's own
    store: Store
    fake: FakeProvider

    def create(self, prompt: str, **over: Any) -> str:
        spec = {"prompt": prompt, "provider": "fake", "model": "m", "budget_tokens": 3000}
        headers = {"Authorization": f"Bearer {bearer('web')}"}
        response = httpx.post(f"{self.proxy}/v1/jobs", json={**spec, **over}, headers=headers)
        assert response.status_code == 201, response.text
        return str(response.json()["id"])

    def wait_state(self, job_id: str, state: str) -> None:
        wait_for(lambda: self.store.get(job_id).state.value == state, timeout_s=40,
                 what=f"{job_id} {state}")  # fmt: skip


@pytest.fixture(scope="module")
def proxied(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxied]:
    tmp = tmp_path_factory.mktemp("nginx")
    with RedisServer() as redis_server, FakeProvider(completion_tokens=200) as fake:
        profile = fake_profile(fake)
        tokens = token_entries(TOKENS, bearer)
        port = free_port()
        config = write_config(
            tmp / "resumeq.toml",
            {
                "providers": {"fake": profile},
                "worker": {"flush_tokens": 4, "flush_ms": 50},
                "janitor": {"interval_s": 0.3},
                "server": {
                    "port": port,
                    "tokens": tokens,
                    "keepalive_s": 1.0,
                    "forwarded_allow_ips": ["127.0.0.1"],
                },
            },
        )
        cluster = Cluster(tmp, redis_url=redis_server.url, config=config)
        try:
            cluster.worker(concurrency=4)
            cluster.janitor(interval_s=0.3)
            cluster.command("serve")
            direct = f"http://127.0.0.1:{port}"
            wait_for(lambda: console_up(direct), timeout_s=30, what="resumeq serve")
            with Nginx(f"127.0.0.1:{port}", documented_location(HTTP_API)) as nginx:
                yield Proxied(nginx.url, direct, Store.from_url(redis_server.url), fake)
        finally:
            cluster.stop()


def test_event_streams_arrive_through_nginx_as_they_are_written(proxied: Proxied) -> None:
    proxied.fake.token_delay_ms = 15  # 200 tokens: three seconds of writing
    job_id = proxied.create("Streamed through a proxy")
    arrivals: list[tuple[float, int]] = []
    headers = {"Authorization": f"Bearer {bearer('web')}"}
    with (
        httpx.Client(timeout=30) as http,
        http.stream("GET", f"{proxied.proxy}/v1/jobs/{job_id}/events", headers=headers) as got,
    ):
        assert got.status_code == 200
        assert got.headers["content-type"].startswith("text/event-stream")
        first = True
        for line in got.iter_lines():
            if first:
                assert line == "retry: 1000"
                first = False
            if line.startswith("data: ") and '"revision"' in line:
                arrivals.append((time.monotonic(), json.loads(line[6:])["revision"]))
            if line.startswith("event: end"):
                break
    ended_at = time.monotonic()
    proxied.wait_state(job_id, "done")
    assert len(arrivals) >= 10
    # Not held back until the end: the first deltas came seconds before the last.
    assert ended_at - arrivals[0][0] > 1.5, arrivals
    spread = {round(at - arrivals[0][0], 1) for at, _ in arrivals}
    assert len(spread) >= 5, arrivals
    proxied.fake.token_delay_ms = 0


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as launched:
        yield launched


def test_the_console_logs_in_and_requeues_a_spilled_job_through_nginx(
    proxied: Proxied, browser: Any
) -> None:
    prompt = "Spilled, then requeued through the proxy"
    proxied.fake.add_faults([{"kind": "disconnect", "after_tokens": 30, "match": prompt}])
    job_id = proxied.create(prompt, exit={"on_cut": "spill"})
    proxied.wait_state(job_id, "spilled")
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    try:
        page = context.new_page()
        page.set_default_timeout(20_000)
        page.goto(f"{proxied.proxy}/console/login")
        page.fill("input[name=token]", bearer("ops"))
        page.click("button[type=submit]")
        page.wait_for_url(f"{proxied.proxy}/console")  # the redirect stayed on the proxy
        page.goto(f"{proxied.proxy}/console/spill")
        page.check(f"tr[data-job-id='{job_id}'] input[name=ids]")
        page.click("button[data-action=requeue]")
        assert "Requeued 1 job(s)." in page.inner_text(".flash")
        shot(page, "nginx-console-requeued")
        proxied.wait_state(job_id, "done")
        assert proxied.store.text(job_id) == proxied.fake.canonical_text(
            [{"role": "user", "content": prompt}]
        )
        cookies = {c["name"]: c["value"] for c in context.cookies()}
    finally:
        context.close()
    # A cross-site POST through the same proxy is refused still.
    with httpx.Client(base_url=proxied.proxy, cookies=cookies, timeout=10) as http:
        refused = http.post(
            "/console/spill/action",
            data={"action": "drop", "ids": job_id, "csrf": "x"},
            headers={"Origin": "http://evil.example"},
        )
        assert refused.status_code == 403
