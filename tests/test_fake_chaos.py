"""The fake provider's seeded random faults (chaos): probability, uniform cut points, seeded
order, per-conversation plans, the journal, reset and the admin endpoint."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from resumeq.fake import FakeProvider
from resumeq.fake.chaos import Chaos, ChaosConfig

pytestmark = pytest.mark.timeout(20)

TOKENS = 40


def body(prompt: str) -> dict[str, Any]:
    messages = [{"role": "user", "content": prompt}]
    return {"model": "m", "messages": messages, "stream": True}


@pytest.fixture(scope="module")
def server() -> Iterator[FakeProvider]:
    with FakeProvider(completion_tokens=TOKENS) as fake:
        yield fake


@pytest.fixture
def fake(server: FakeProvider) -> FakeProvider:
    server.reset()
    return server


@pytest.fixture
def http(fake: FakeProvider) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=fake.url, timeout=10) as client:
        yield client


def generate(http: httpx.Client, prompt: str) -> None:
    """One streamed request, read until the server ends or cuts it."""
    try:
        with http.stream("POST", "/v1/chat/completions", json=body(prompt)) as response:
            for _ in response.iter_bytes():
                pass
    except httpx.HTTPError:
        pass  # a cut stream


def decisions(chaos: Chaos, conversation: bytes, n: int) -> list[int | None]:
    out: list[int | None] = []
    for _ in range(n):
        fault = chaos.draw(conversation, TOKENS)
        out.append(None if fault is None else fault.after_tokens)
    return out


def test_probability_and_uniform_cut_points() -> None:
    chaos = Chaos(ChaosConfig(probability=0.5, seed=7))
    drawn = decisions(chaos, b"c", 4000)
    cuts = [d for d in drawn if d is not None]
    assert 0.45 < len(cuts) / len(drawn) < 0.55
    assert set(cuts) == set(range(TOKENS))  # every token, never past the last one
    low = sum(1 for c in cuts if c < TOKENS // 2)
    assert 0.45 < low / len(cuts) < 0.55


def test_the_same_seed_draws_the_same_plan_and_another_seed_does_not() -> None:
    first = decisions(Chaos(ChaosConfig(probability=0.3, seed=1)), b"c", 200)
    again = decisions(Chaos(ChaosConfig(probability=0.3, seed=1)), b"c", 200)
    other = decisions(Chaos(ChaosConfig(probability=0.3, seed=2)), b"c", 200)
    assert first == again != other


def test_conversation_scope_ignores_the_order_of_requests() -> None:
    config = ChaosConfig(probability=0.5, seed=3, scope="conversation")
    one, two = Chaos(config), Chaos(config)
    a_first = decisions(one, b"a", 20) + decisions(one, b"b", 20)
    b_first = decisions(two, b"b", 20)
    b_first = decisions(two, b"a", 20) + b_first
    assert a_first == b_first
    assert decisions(Chaos(config), b"a", 20) != decisions(Chaos(config), b"b", 20)


def test_kinds_are_drawn_from_the_list() -> None:
    config = ChaosConfig(probability=1, kinds=("truncate", "status"), status=529, seed=5)
    chaos = Chaos(config)
    faults = [chaos.draw(b"c", TOKENS) for _ in range(200)]
    kinds = {f.kind for f in faults if f is not None}
    assert kinds == {"truncate", "status"}
    assert all(f.status == 529 for f in faults if f is not None)


def test_bad_configs_are_refused() -> None:
    for bad in ({"probability": 1.5}, {"probability": 0.5, "kinds": ["explode"]}):
        with pytest.raises(ValidationError):
            ChaosConfig.model_validate(bad)


def test_chaos_over_http_is_journalled_and_reset_clears_it(
    fake: FakeProvider, http: httpx.Client
) -> None:
    fake.chaos(probability=1.0, seed=11)
    for n in range(5):
        generate(http, f"chaos {n}")
    journal = fake.journal(settle_s=5)
    assert [e["outcome"] for e in journal] == ["disconnect"] * 5
    for entry in journal:
        assert entry["fault"]["source"] == "chaos"
        assert entry["tokens_emitted"] == entry["fault"]["after_tokens"] < TOKENS
    fake.reset()
    generate(http, "after reset")
    assert [e["outcome"] for e in fake.journal(settle_s=5)] == ["finished"]


def test_a_queued_fault_comes_first(fake: FakeProvider, http: httpx.Client) -> None:
    fake.chaos(probability=1.0, seed=11)
    fake.add_faults([{"kind": "truncate", "after_tokens": 3}])
    generate(http, "queued")
    generate(http, "chaos")
    first, second = fake.journal(settle_s=5)
    assert first["fault"]["source"] == "queue" and first["outcome"] == "truncate"
    assert second["fault"]["source"] == "chaos"


def test_the_config_endpoint_turns_chaos_on_and_off(fake: FakeProvider, http: httpx.Client) -> None:
    chaos = {"probability": 1.0, "kinds": ["truncate"], "seed": 4, "scope": "conversation"}
    reply = http.post("/_fake/config", json={"chaos": chaos})
    assert reply.status_code == 200
    assert reply.json()["chaos"]["scope"] == "conversation"
    generate(http, "configured")
    assert fake.journal(settle_s=5)[0]["outcome"] == "truncate"
    assert http.get("/_fake/config").json()["chaos"]["faults"] == 1
    assert http.post("/_fake/config", json={"chaos": {"probability": 2}}).status_code == 422
    assert "chaos" not in http.post("/_fake/config", json={"chaos": None}).json()
    generate(http, "off again")
    assert fake.journal(settle_s=5)[-1]["outcome"] == "finished"


def test_a_fault_with_match_waits_for_its_request(fake: FakeProvider) -> None:
    fake.add_faults([{"kind": "status", "status": 429, "match": "target job"}])
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "other job"}]}
    with httpx.Client(base_url=fake.openai_base_url, timeout=10) as http:
        assert http.post("/chat/completions", json=body).status_code == 200
        body["messages"][0]["content"] = "the target job, at last"
        assert http.post("/chat/completions", json=body).status_code == 429
        assert http.post("/chat/completions", json=body).status_code == 200
