"""Helpers shared by the end-to-end tests (real redis-server, worker processes, fake
provider over HTTP)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from resumeq.core.models import JobRecord
from resumeq.fake import FakeProvider, count_tokens
from resumeq.producer.enqueue import enqueue_job
from resumeq.store import Store
from resumeq.testing.processes import Cluster, wait_for, write_config

TERMINAL = {"done", "failed", "cancelled", "abandoned", "dropped", "spilled"}


@dataclass
class World:
    store: Store
    fake: FakeProvider
    cluster: Cluster
    config: Path

    def enqueue(self, prompt: str, **over: Any) -> str:
        spec = {"prompt": prompt, "provider": "fake", "model": "fake-model", "budget_tokens": 2000}
        spec.update(over)
        queue = spec.pop("queue", "resumeq")
        return enqueue_job(self.store, self.store.redis, spec, queue=queue).id

    def canonical(self, prompt: str) -> str:
        return self.fake.canonical_text([{"role": "user", "content": prompt}])

    def wait_state(self, job_id: str, states: set[str], timeout_s: float = 30) -> JobRecord:
        def reached() -> JobRecord | None:
            record = self.store.get(job_id)
            return record if record.state.value in states else None

        try:
            return wait_for(reached, timeout_s=timeout_s, what=f"job {job_id} in {states}")  # type: ignore[no-any-return]
        except TimeoutError:
            print(self.cluster.logs())
            raise

    def wait_spent(self, job_id: str, at_least: int, timeout_s: float = 20) -> None:
        wait_for(
            lambda: self.store.get(job_id).spent_output_tokens >= at_least,
            timeout_s=timeout_s,
            what=f"job {job_id} to spend {at_least} tokens",
        )

    def requests_for(self, prompt: str) -> list[dict[str, Any]]:
        return [
            r
            for r in self.fake.journal()
            if any(prompt in str(m.get("content")) for m in (r["body"] or {}).get("messages", []))
        ]


def make_world(
    tmp: Path,
    store: Store,
    fake: FakeProvider,
    redis_url: str,
    *,
    store_settings: dict[str, Any] | None = None,
    profile_settings: dict[str, Any] | None = None,
    janitor_settings: dict[str, Any] | None = None,
    server_settings: dict[str, Any] | None = None,
    **worker: Any,
) -> Iterator[World]:
    profile = {
        "kind": "openai",
        "base_url": fake.openai_base_url,
        "continue_mode": "instruction",
        "counting": "usage",
        # Well past what a starved machine takes to answer: a tighter clock cuts streams
        # the tests did not cut (a 429 read as a timeout, a retry too early).
        "stall_timeout_s": 3.0,
        **(profile_settings or {}),
    }
    settings = {"flush_tokens": 8, "flush_ms": 250, "lease_ttl_ms": 2000}
    settings.update(worker)
    config = write_config(
        tmp / "resumeq.toml",
        {
            "providers": {
                "fake": profile,
                "fake-anthropic": {
                    **profile,
                    "kind": "anthropic",
                    "base_url": fake.anthropic_base_url,
                    "continue_mode": "prefill",
                },
                # The Responses API, its responses made in the background (read on after
                # a cut, before anything is bought again).
                "fake-responses": {
                    **profile,
                    "kind": "openai-responses",
                    "continue_mode": "continue_final_message",
                    "background": True,
                },
                # The Responses API without background responses: a cut is continued.
                "fake-responses-plain": {
                    **profile,
                    "kind": "openai-responses",
                    "continue_mode": "instruction",
                },
                # Tool calls cut inside their arguments asked for again, not continued.
                "fake-redo": {**profile, "continue_calls": False},
                "fake-anthropic-redo": {
                    **profile,
                    "kind": "anthropic",
                    "base_url": fake.anthropic_base_url,
                    "continue_mode": "prefill",
                    "continue_calls": False,
                },
                # llama.cpp's server: a prefill, echoed; usage only at the end; its /tokenize.
                "llamacpp": {
                    **profile,
                    "continue_mode": "prefill",
                    "counting": "usage+tokenizer",
                    "tokenizer": "llamacpp",
                },
            },
            "worker": settings,
            "janitor": {"interval_s": 0.3, **(janitor_settings or {})},
            **({"store": store_settings} if store_settings else {}),
            **({"server": server_settings} if server_settings else {}),
        },
    )
    cluster = Cluster(tmp, redis_url=redis_url, config=config)
    try:
        yield World(store=store, fake=fake, cluster=cluster, config=config)
    finally:
        cluster.stop()


def tokens(text: str) -> int:
    return count_tokens(text)


def background_exchanges(fake: FakeProvider, prompt: str) -> dict[str, list[dict[str, Any]]]:
    """The provider's journal for one job on the Responses wire: the responses it created,
    and of those the status reads, the stream reads and the cancels."""
    journal = fake.journal(settle_s=2)
    created = [e for e in journal if e["path"] == "/v1/responses" and prompt in str(e["body"])]
    ids = {e["response"]["id"] for e in created if isinstance(e.get("response"), dict)}
    mine = [e for e in journal if any(f"/v1/responses/{i}" in e["path"] for i in ids)]
    return {
        "created": created,
        "status": [e for e in mine if not e["stream"] and e["outcome"] == "retrieved"],
        "streamed": [e for e in mine if e["stream"]],
        "cancelled": [e for e in mine if e["path"].endswith("/cancel")],
    }
