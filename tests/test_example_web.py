"""The README's web example works: enqueue over HTTP, stream the text back as SSE."""

from __future__ import annotations

import importlib.util
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from wsgiref.simple_server import WSGIRequestHandler, make_server

import httpx
import pytest

from resumeq.testing import RedisServer

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "web.py"


class QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def web(
    redis_server: RedisServer, redis_client: object, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, ModuleType]]:
    monkeypatch.setenv("RESUMEQ_REDIS_URL", redis_server.url)
    spec = importlib.util.spec_from_file_location("resumeq_web_example", EXAMPLE)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    server = make_server("127.0.0.1", 0, module.app, handler_class=QuietHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", module
    finally:
        server.shutdown()
        server.server_close()
        module.client.redis.close()


@pytest.mark.timeout(30)
def test_enqueue_and_stream(web: tuple[str, ModuleType]) -> None:
    base, module = web
    spec = {"prompt": "Hi", "provider": "local", "model": "m", "budget_tokens": 100}
    with httpx.Client(base_url=base, timeout=10) as http:
        created = http.post("/jobs", json=spec)
        assert created.status_code == 201
        job_id = created.json()["id"]
        bad = http.post("/jobs", json={**spec, "budget_tokens": 0})
        assert bad.status_code == 422 and "budget_tokens" in bad.json()["error"]
        assert http.get("/jobs/nope").status_code == 404

        # Play the worker: two checkpoints, then done.
        store = module.client.store
        got = store.acquire(job_id, worker="w", ttl_ms=5000)
        r1 = store.flush(got.lease, expected_revision=1, delta="Hello, ", tokens=2).revision
        store.flush(got.lease, expected_revision=r1, delta="browser.", tokens=2)
        store.finish(got.lease, state="done", finish_reason="stop")

        stream = http.get(f"/jobs/{job_id}/stream").text
        texts = [json.loads(line[6:]) for line in stream.splitlines() if line.startswith("data: ")]
        assert "".join(texts[:-1]) == "Hello, browser." and texts[-1] == "done"
        resumed = http.get(f"/jobs/{job_id}/stream", headers={"Last-Event-ID": str(r1)}).text
        assert '"browser."' in resumed and '"Hello, "' not in resumed
        assert http.get(f"/jobs/{job_id}").json()["state"] == "done"
