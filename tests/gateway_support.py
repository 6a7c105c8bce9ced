"""What the drop-in endpoint tests share (SPEC §24): a real ``resumeq serve`` with two real
workers, a janitor, the fake provider over HTTP (on the OpenAI and the Anthropic wire) and a
real redis-server, one per test module; API keys by name; the official SDKs' clients,
closed with the world."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from serve_support import token_entries

from resumeq.fake import FakeProvider
from resumeq.producer.ops import all_job_ids, status_dict
from resumeq.store import Store
from resumeq.testing import RedisServer
from resumeq.testing.processes import Cluster, Proc, wait_for, write_config
from resumeq.testing.redis_server import free_port

ROLES = {"web-app": "producer", "other-app": "producer", "dash": "viewer"}
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
REPORT = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "rivers": {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 4},
    },
    "required": ["title", "rivers"],
}


def key(name: str) -> str:
    return f"rq_gateway_key_of_{name}"


@dataclass
class Gateway:
    base: str
    store: Store
    fake: FakeProvider
    cluster: Cluster
    server: Proc
    config: Path
    #: Two workers: a test kills the one streaming its job, the other takes it over.
    workers: list[Proc]
    clients: list[openai.OpenAI | anthropic.Anthropic] = field(default_factory=list)

    def sdk(self, name: str = "web-app", **options: Any) -> openai.OpenAI:
        client = openai.OpenAI(base_url=f"{self.base}/v1", api_key=key(name), **options)
        self.clients.append(client)
        return client

    def claude(self, name: str = "web-app", **options: Any) -> anthropic.Anthropic:
        client = anthropic.Anthropic(base_url=self.base, api_key=key(name), **options)
        self.clients.append(client)
        return client

    def canonical(self, prompt: str, **shape: Any) -> dict[str, Any]:
        return self.fake.canonical({"messages": [{"role": "user", "content": prompt}], **shape})

    def jobs(self) -> set[str]:
        return set(all_job_ids(self.store))

    def job(self, job_id: str) -> dict[str, Any]:
        return status_dict(self.store, job_id)


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("gateway")
    with RedisServer() as redis_server, FakeProvider(completion_tokens=160) as fake:
        profile = {
            "kind": "openai",
            "base_url": fake.openai_base_url,
            "continue_mode": "continue_final_message",
            "counting": "usage",
            "stall_timeout_s": 5.0,
        }
        port = free_port()
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
                        # A cut attempt's output counted exactly, by the counting endpoint.
                        "counting": "usage+tokenizer",
                    },
                },
                "worker": {"flush_tokens": 8, "flush_ms": 100, "lease_ttl_ms": 2000},
                "janitor": {"interval_s": 0.3},
                "server": {
                    "port": port,
                    "tokens": token_entries(ROLES, key),
                    "keepalive_s": 0.5,
                },
                "gateway": {
                    "models": {
                        "gpt-4o-mini": "fake/fake-model",
                        "claude-sonnet": "fake-anthropic/fake-claude",
                    },
                    "max_wait_s": 30,
                },
            },
        )
        cluster = Cluster(tmp, redis_url=redis_server.url, config=config)
        try:
            workers = [cluster.worker(concurrency=8), cluster.worker(concurrency=8)]
            cluster.janitor(interval_s=0.3)
            server = cluster.command("serve")
            base = f"http://127.0.0.1:{port}"
            wait_for(lambda: _up(base), timeout_s=30, what="resumeq serve")
            store = Store.from_url(redis_server.url)
            gateway = Gateway(base, store, fake, cluster, server, config, workers)
            yield gateway
            for client in gateway.clients:
                client.close()
        finally:
            cluster.stop()


def _up(base: str) -> bool:
    try:
        return httpx.get(f"{base}/console/login", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture(autouse=True)
def fresh_fake(gw: Gateway) -> Iterator[None]:
    gw.fake.clear_faults()
    gw.fake.token_delay_ms = 0
    yield
    gw.fake.clear_faults()
    gw.fake.token_delay_ms = 0


def cut_twice(gw: Gateway) -> None:
    gw.fake.add_faults(
        [{"kind": "disconnect", "after_tokens": 23}, {"kind": "disconnect", "after_tokens": 31}]
    )
