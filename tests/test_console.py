"""The operator console in a real Chromium (the system's, driven by Playwright), against a
real ``resumeq serve``, real workers, a real Redis and the fake provider over loopback.

The screenshots the tests take go to ``build/screenshots/`` (the copies in ``docs/`` are
these, refreshed by hand when the pages change).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from browser_support import StaticSite, chromium, shot
from serve_support import console_up

from resumeq.fake import FakeProvider
from resumeq.store import Store, keys
from resumeq.testing import RedisServer
from resumeq.testing.processes import Cluster, wait_for, write_config
from resumeq.testing.redis_server import free_port

TOKENS = {"ops": "operator", "dash": "viewer", "web": "producer"}
#: How often a condition in the page is checked: every animation frame (Playwright's
#: default) keeps a core busy, and the suite's timing tests run beside these.
POLL_MS = 100
RESERVED = "reserved"


def secret(who: str) -> str:
    return f"console-test-token-{who}"


@dataclass
class Site:
    base: str
    store: Store
    fake: FakeProvider
    cluster: Cluster
    api: httpx.Client  # as the operator

    def create(self, prompt: str, **over: Any) -> str:
        spec = {"prompt": prompt, "provider": "fake", "model": "m", "budget_tokens": 3000}
        response = self.api.post("/v1/jobs", json={**spec, **over})
        assert response.status_code == 201, response.text
        return str(response.json()["id"])

    def canonical(self, prompt: str) -> str:
        return self.fake.canonical_text([{"role": "user", "content": prompt}])

    def state(self, job_id: str) -> str:
        return self.store.get(job_id).state.value

    def wait_state(self, job_id: str, *states: str, timeout_s: float = 40) -> str:
        return str(
            wait_for(
                lambda: (s := self.state(job_id)) in states and s,
                timeout_s=timeout_s,
                what=f"{job_id} in {states}",
            )
        )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    tmp = tmp_path_factory.mktemp("console")
    with RedisServer() as redis_server, FakeProvider(completion_tokens=240) as fake:
        profile = {"kind": "openai", "base_url": fake.openai_base_url, "counting": "usage"}
        tokens = [
            {"sha256": hashlib.sha256(secret(w).encode()).hexdigest(), "role": r, "name": w}
            for w, r in TOKENS.items()
        ]
        port = free_port()
        config = write_config(
            tmp / "resumeq.toml",
            {
                "providers": {"fake": profile, "fake-spill": profile, "fake-paid": profile},
                "worker": {"flush_tokens": 8, "flush_ms": 50, "queues": ["resumeq", RESERVED]},
                "janitor": {"interval_s": 0.3},
                "server": {"port": port, "tokens": tokens, "keepalive_s": 1.0},
            },
        )
        cluster = Cluster(tmp, redis_url=redis_server.url, config=config)
        try:
            cluster.worker("resumeq", concurrency=8)
            cluster.worker(RESERVED, concurrency=4)
            cluster.janitor(interval_s=0.3)
            cluster.command("serve")
            base = f"http://127.0.0.1:{port}"
            wait_for(lambda: console_up(base), timeout_s=30, what="resumeq serve")
            headers = {"Authorization": f"Bearer {secret('ops')}"}
            with httpx.Client(base_url=base, headers=headers, timeout=30) as api:
                yield Site(base, Store.from_url(redis_server.url), fake, cluster, api)
        finally:
            cluster.stop()


@pytest.fixture(autouse=True)
def clean(site: Site) -> None:
    site.fake.reset()
    site.fake.token_delay_ms = 0


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as launched:
        yield launched


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    # The pages' own policy forbids eval, which waiting on a condition needs; escaping is
    # what keeps a text inert here (the policy is checked apart).
    context = browser.new_context(viewport={"width": 1280, "height": 860}, bypass_csp=True)
    page = context.new_page()
    page.set_default_timeout(20_000)
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.dialogs = dialogs
    try:
        yield page
    finally:
        context.close()


def login(page: Any, site: Site, who: str = "ops") -> None:
    page.goto(f"{site.base}/console/login")
    page.fill("input[name=token]", secret(who))
    page.click("button[type=submit]")
    page.wait_for_url(f"{site.base}/console")


def shown_text(page: Any) -> str:
    """The job page's text without its splice marks."""
    return str(page.eval_on_selector("pre.text", "e => [...e.querySelectorAll('span.seg')]"
                                     ".map(s => s.textContent).join('')"))  # fmt: skip


# -- logging in --------------------------------------------------------------------------------


def test_login_refuses_a_bad_token_and_opens_the_overview(site: Site, page: Any) -> None:
    page.goto(f"{site.base}/console")
    assert page.url.startswith(f"{site.base}/console/login")  # no session: the login page
    page.fill("input[name=token]", "not-a-token")
    page.click("button[type=submit]")
    assert "not valid" in page.inner_text("main")
    page.fill("input[name=token]", secret("web"))
    page.click("button[type=submit]")
    assert "producer" in page.inner_text("main")  # a producer's token does not open it
    login(page, site)
    cookie = next(c for c in page.context.cookies() if c["name"] == "resumeq_console")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    done = site.create("An answer before the overview is looked at.")
    site.wait_state(done, "done")
    page.reload()
    text = page.inner_text("main")
    for part in ("Queues", "resumeq-spill", RESERVED, "Jobs by state", "Saved", "Spill lane"):
        assert part in text
    # The overview refreshes by itself: a job created now shows up in its counts.
    before = int(page.inner_text("[data-state-count=done]").replace(",", ""))
    site.wait_state(site.create("Counted while the overview is open."), "done")
    page.wait_for_function(
        f"Number(document.querySelector('[data-state-count=done]').textContent"
        f".replace(/,/g, '')) > {before}",
        polling=POLL_MS,
    )
    shot(page, "console-overview")


# -- a job's page --------------------------------------------------------------------------------


def test_a_job_page_shows_the_text_growing_through_a_cut_and_marks_the_splice(
    site: Site, page: Any
) -> None:
    prompt = "Explain how a canal lock raises a boat, step by step."
    site.fake.add_faults([{"kind": "disconnect", "after_tokens": 90, "match": prompt}])
    site.fake.token_delay_ms = 25
    login(page, site)
    job_id = site.create(prompt)
    wait_for(lambda: site.store.get(job_id).spent_output_tokens > 0, timeout_s=20)
    page.goto(f"{site.base}/console/jobs/{job_id}")
    first = len(shown_text(page))
    page.wait_for_function(
        f"document.querySelector('pre.text').textContent.length > {first + 40}",
        polling=POLL_MS,
    )  # it grows in place, over the event stream
    page.wait_for_selector("pre.text mark.splice")  # the cut, and where the resume went on
    if site.state(job_id) == "running":
        shot(page, "console-job")
    page.wait_for_selector("pre.text[data-ended=done]", timeout=40_000)
    assert shown_text(page) == site.canonical(prompt)
    assert page.locator("pre.text mark.splice").count() == 1  # one cut, one mark, live
    page.reload()  # the page drawn from the ledger marks the same splice
    assert page.locator("pre.text mark.splice").count() == 1
    assert shown_text(page) == site.canonical(prompt)
    ledger = page.inner_text("table.ledger")
    assert "resume" in ledger and "fresh" in ledger and "disconnect" in ledger


def test_an_operator_cancels_a_running_job_from_its_page(site: Site, page: Any) -> None:
    site.fake.token_delay_ms = 40
    job_id = site.create("A long answer someone will stop: the river's tributaries.")
    site.wait_state(job_id, "running")
    login(page, site)
    page.goto(f"{site.base}/console/jobs/{job_id}")
    page.click("button[data-action=cancel]")
    assert "Cancelled." in page.inner_text(".flash")
    assert site.state(job_id) == "cancelled"
    assert page.locator("[data-action=cancel]").count() == 0  # nothing left to cancel
    assert (
        "cancel"
        in httpx.get(
            f"{site.base}/console/audit",
            cookies={c["name"]: c["value"] for c in page.context.cookies()},
        ).text
    )


def test_an_answer_full_of_markup_is_shown_as_text(site: Site, page: Any) -> None:
    prompt = 'Write me a web page. [fake:html] <img src=x onerror="alert(7)">'
    job_id = site.create(prompt)
    site.wait_state(job_id, "done")
    text = site.store.text(job_id)
    assert "<script>" in text and "onerror=" in text  # the fake wrote real markup
    login(page, site)
    page.goto(f"{site.base}/console/jobs/{job_id}")
    assert shown_text(page) == text
    assert page.locator("main script, main img").count() == 0  # nothing became an element
    page.goto(f"{site.base}/console/jobs?q=web+page")
    assert page.locator(f"tr[data-job-id='{job_id}']").count() == 1
    assert page.locator("main img").count() == 0
    page.wait_for_timeout(300)
    assert page.dialogs == []  # no alert() ran anywhere


def test_unknown_and_malformed_ids_and_filters_get_a_message(site: Site, page: Any) -> None:
    login(page, site)
    for path, status, words in (
        ("/console/jobs/0123456789abcdef", 404, "No job 0123456789abcdef"),
        ("/console/jobs/bad%20id%3Cx%3E", 404, "not a job id"),
        ("/console/jobs?state=%3Cscript%3E", 400, "No such state"),
        ("/console/jobs?before=nonsense", 400, "Not a page position"),
        ("/console/spill?older_than=soon", 400, "Age 'soon'"),
        ("/console/audit?before=xyz", 400, "Not a position"),
    ):
        response = page.goto(site.base + path)
        assert response.status == status, path
        assert words in page.inner_text("main"), path
        assert page.locator("main script").count() == 0
    # A page past the end says so.
    for path in ("/console/jobs?before=1.a", "/console/spill?cursor=9999999999999.zz",
                 "/console/audit?before=1-0"):  # fmt: skip
        page.goto(site.base + path)
        assert "past the last page" in page.inner_text("main"), path
    # The banner says only what an action's code means: a link cannot write in it.
    page.goto(f"{site.base}/console/jobs?msg=Re-enter+your+token+at+evil&done=evil")
    assert "evil" not in page.inner_text("main") and page.locator(".flash").count() == 0


# -- the spill lane --------------------------------------------------------------------------------


def spill(site: Site, prompts: list[str], provider: str = "fake-spill") -> list[str]:
    site.fake.add_faults([{"kind": "disconnect", "after_tokens": 30, "match": p} for p in prompts])
    ids = [site.create(p, provider=provider, exit={"on_cut": "spill"}) for p in prompts]
    for job_id in ids:
        site.wait_state(job_id, "spilled")
    return ids


def test_spill_lane_filter_bulk_requeue_to_a_reserved_lane_and_drop(site: Site, page: Any) -> None:
    prompts = [f"Spilled case {n}: the harbour pilot's log." for n in range(3)]
    ids = spill(site, prompts)
    lone = spill(site, ["Spilled alone: the ferry timetable."], provider="fake")[0]
    login(page, site)
    page.goto(f"{site.base}/console/spill")
    shot(page, "console-spill")
    page.fill("form.filters input[name=provider]", "fake-spill")
    page.click("form.filters button[type=submit]")
    rows = page.locator("tr[data-job-id]")
    assert sorted(rows.evaluate_all("rs => rs.map(r => r.dataset.jobId)")) == sorted(ids)
    # What matches, exported as JSON lines: each with its prompt and ledger.
    with page.expect_download() as download:
        page.click("[data-action=export]")
    lines = Path(download.value.path()).read_text().splitlines()
    exported = [json.loads(line) for line in lines]
    assert sorted(e["id"] for e in exported) == sorted(ids)
    assert all(e["messages"] and e["attempts"] for e in exported)
    # All that match, to the reserved lane and another provider: confirmed with the count.
    page.check("input[name=select][value=all]")
    page.fill("input[name=to]", RESERVED)
    page.select_option("fieldset.bulk select[name=provider]", "fake-paid")
    page.click("button[data-action=requeue]")
    assert page.inner_text("[data-count]") == "3"
    assert "This will requeue 3" in page.inner_text("#confirm-text")
    page.click("button[data-action=requeue]")
    assert "Requeued 3 job(s)." in page.inner_text(".flash")
    for job_id in ids:
        assert site.wait_state(job_id, "done") == "done"
        record = site.store.get(job_id)
        assert record.queue == RESERVED and record.spec.provider == "fake-paid"
        assert site.store.text(job_id) == site.canonical(prompts[ids.index(job_id)])
    # The job list finds them by provider, state and a piece of their prompt.
    page.goto(f"{site.base}/console/jobs?state=done&provider=fake-paid&q=HARBOUR+pilot")
    found = page.locator("tr[data-job-id]").evaluate_all("rs => rs.map(r => r.dataset.jobId)")
    assert sorted(found) == sorted(ids)
    page.goto(f"{site.base}/console/jobs?state=spilled&queue=resumeq&q=harbour")
    assert page.locator("tr[data-job-id]").count() == 0
    # Drop one row, chosen by its checkbox.
    page.goto(f"{site.base}/console/spill")
    page.check(f"tr[data-job-id='{lone}'] input[name=ids]")
    page.click("button[data-action=drop]")
    assert "Dropped 1 job(s)." in page.inner_text(".flash")
    assert site.state(lone) == "dropped"
    # The audit log says who did what to which jobs.
    page.goto(f"{site.base}/console/audit")
    requeue = page.locator("tr[data-audit-action=requeue]").first.inner_text()
    assert "ops" in requeue and "3" in requeue and "to=reserved" in requeue
    assert "provider=fake-paid" in requeue
    drop = page.locator("tr[data-audit-action=drop]").first.inner_text()
    assert lone[:12] in drop


def test_edit_and_requeue_one_job_and_bad_values_change_nothing(site: Site, page: Any) -> None:
    job_id = spill(site, ["Spilled for an edit: the lighthouse keeper's list."])[0]
    record = site.store.get(job_id)
    login(page, site)
    page.goto(f"{site.base}/console/spill/{job_id}/edit")
    for field, value, words in (
        ("budget_tokens", str(record.spent_output_tokens), "leaves nothing past"),
        ("budget_tokens", "lots", "a whole number"),
        ("floor_tokens", "999999", "floor_tokens"),
        ("to", "not a queue!", "not a valid queue name"),
    ):
        page.goto(f"{site.base}/console/spill/{job_id}/edit")
        page.fill(f"input[name={field}]", value)
        page.click("button[data-action=requeue]")
        assert words in page.inner_text("main"), field
        assert site.store.get(job_id).revision == record.revision  # nothing changed
    page.goto(f"{site.base}/console/spill/{job_id}/edit")
    page.fill("input[name=budget_tokens]", "2500")
    page.fill("input[name=floor_tokens]", "40")
    page.select_option("select[name=provider]", "fake-paid")
    page.click("button[data-action=requeue]")
    assert "Edited and requeued." in page.inner_text(".flash")
    site.wait_state(job_id, "done")
    edited = site.store.get(job_id)
    assert (edited.budget_tokens, edited.floor_tokens) == (2500, 40)
    assert edited.spec.provider == "fake-paid" and edited.prompt_hash != record.prompt_hash
    page.goto(f"{site.base}/console/audit")
    assert "budget=2500" in page.locator("tr[data-audit-action='edit+requeue']").first.inner_text()


def test_a_requeue_to_a_queue_no_worker_listens_on_says_so(site: Site, page: Any) -> None:
    job_id = spill(site, ["Spilled for the night shift: the bakery's orders."])[0]
    login(page, site)
    page.goto(f"{site.base}/console/spill/{job_id}/edit")
    page.fill("input[name=to]", "night-shift")
    page.click("button[data-action=requeue]")
    flash = page.inner_text(".flash")
    assert "Edited and requeued." in flash
    assert "No live worker listens on queue 'night-shift'" in flash
    assert site.store.get(job_id).queue == "night-shift"  # done, as warned
    # A link can name only queues in the banner, nothing else.
    page.goto(f"{site.base}/console/jobs/{job_id}?done=edited&n=0&idle=<b>x</b>,ok-queue")
    flash = page.inner_text(".flash")
    assert "'ok-queue'" in flash and "<b>" not in flash and "x</b>" not in flash
    site.store.cancel(job_id)


# -- roles and requests from elsewhere ------------------------------------------------------------


def test_a_viewer_sees_no_action_and_a_forged_post_is_refused(
    site: Site, browser: Any, page: Any
) -> None:
    spilled = spill(site, ["Spilled for a viewer: the canal's tolls."])[0]
    site.fake.token_delay_ms = 40
    running = site.create("A long answer a viewer watches: the canal's locks, one by one.")
    site.wait_state(running, "running")
    pages = ("/console/spill", f"/console/jobs/{running}")
    login(page, site)  # an operator sees the controls on these pages...
    for path in pages:
        page.goto(site.base + path)
        assert page.locator("[data-action]").count() > 0, path
    viewer = browser.new_context(bypass_csp=True).new_page()
    try:
        login(viewer, site, "dash")  # ...a viewer sees none
        for path in pages:
            viewer.goto(site.base + path)
            assert viewer.locator("[data-action]").count() == 0, path
            assert spilled[:12] in viewer.inner_text("main") or path != "/console/spill"
        csrf = viewer.get_attribute("input[name=csrf]", "value")  # the logout form's
        for target, form in (
            ("/console/spill/action", {"csrf": csrf, "action": "drop", "ids": spilled}),
            (f"/console/jobs/{running}/cancel", {"csrf": csrf}),
        ):
            forged = viewer.request.post(
                site.base + target, form=form, headers={"Origin": site.base}
            )
            assert forged.status == 403 and "viewer role may not act" in forged.text()
    finally:
        viewer.context.close()
    assert site.state(spilled) == "spilled" and site.state(running) == "running"
    site.api.post(f"/v1/spill/{spilled}/drop")
    site.api.post(f"/v1/jobs/{running}/cancel")


def test_a_cross_site_post_and_a_stale_form_are_refused(site: Site, page: Any) -> None:
    job_id = spill(site, ["Spilled while another site tries: the weir."])[0]
    login(page, site)
    # Another site (another origin, a real page) posts the drop form to the console.
    evil = _evil_site(f"{site.base}/console/spill/action", job_id)
    with evil:
        page.goto(evil.url)
        page.wait_for_url(f"{site.base}/console/spill/action")  # the browser followed it
    assert "another site" in page.inner_text("main")
    assert site.state(job_id) == "spilled"
    # The session's own cookie, with its right token, but sent from elsewhere.
    page.goto(f"{site.base}/console/spill")
    csrf = page.get_attribute("input[name=csrf]", "value")
    cookie = next(c["value"] for c in page.context.cookies() if c["name"] == "resumeq_console")
    form = {"csrf": csrf, "action": "drop", "ids": job_id}
    jar = {"resumeq_console": cookie}
    for headers in ({"Origin": "http://evil.example"}, {"Sec-Fetch-Site": "cross-site"}):
        refused = httpx.post(
            f"{site.base}/console/spill/action", data=form, cookies=jar, headers=headers
        )
        assert refused.status_code == 403 and "another site" in refused.text, headers
    # One bad id among good ones: refused whole, nothing done.
    mixed = httpx.post(
        f"{site.base}/console/spill/action",
        data={**form, "action": "requeue", "ids": [job_id, "bad<id>"]},
        cookies=jar,
    )
    assert mixed.status_code == 400 and "not a job id" in mixed.text
    assert "bad&lt;id&gt;" in mixed.text and "bad<id>" not in mixed.text
    stale = httpx.post(
        f"{site.base}/console/spill/action", data={**form, "csrf": "old"}, cookies=jar
    )
    assert stale.status_code == 403 and "stale" in stale.text
    assert site.state(job_id) == "spilled"
    # An expired session: back to the login page, told why.
    site.store.redis.delete(*site.store.redis.keys(f"{keys.CONSOLE_SESSION}:*"))
    page.goto(f"{site.base}/console/spill")
    assert "/console/login" in page.url and "expired" in page.inner_text("main")
    expired = httpx.post(f"{site.base}/console/spill/action", data=form, cookies=jar)
    assert expired.status_code == 401 and "expired" in expired.text
    assert site.state(job_id) == "spilled"
    site.api.post(f"/v1/spill/{job_id}/drop")


def _evil_site(action: str, job_id: str) -> StaticSite:
    """A page on another site that submits a form to the console as soon as it loads
    ("localhost" is another site than "127.0.0.1" for the browser)."""
    body = (
        f'<form id="f" method="post" action="{action}">'
        f'<input name="action" value="drop"><input name="ids" value="{job_id}">'
        '<input name="csrf" value="guess"></form>'
        "<script>document.getElementById('f').submit()</script>"
    ).encode()
    return StaticSite(body, host="localhost")


def test_pages_fit_a_phone_screen(site: Site, browser: Any) -> None:
    """Nothing wider than a phone's screen but the tables, which scroll in their own box."""
    context = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True)
    try:
        page = context.new_page()
        login(page, site)
        for path in ("/console", "/console/jobs", "/console/spill", "/console/audit"):
            page.goto(site.base + path)
            width = page.evaluate("document.documentElement.scrollWidth")
            assert width <= 390, f"{path}: {width} px wide"
        page.goto(f"{site.base}/console")
        shot(page, "console-overview-phone")
    finally:
        context.close()


def test_console_pages_carry_their_protections(site: Site) -> None:
    login_page = httpx.get(f"{site.base}/console/login")
    assert 'name="token"' in login_page.text
    policy = login_page.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert re.search(r"<script src=\"/console/static/console.js\"", login_page.text)
    assert httpx.get(f"{site.base}/console/static/console.js").status_code == 200
