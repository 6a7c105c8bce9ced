"""Anthropic's ``text_delta`` events carry 1 to 4 tokens, as the real API's do."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from resumeq.fake import FakeProvider

pytestmark = pytest.mark.timeout(20)

TOKENS = 200
USER = {"role": "user", "content": "Explain the tides to a child."}
BODY = {"model": "m", "max_tokens": 4096, "messages": [USER], "stream": True}


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


def events_of(http: httpx.Client, body: dict[str, Any]) -> list[dict[str, Any]]:
    with http.stream("POST", "/v1/messages", json=body) as response:
        assert response.status_code == 200
        return [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data:")]


def group_sizes(deltas: list[str], tokens: list[str]) -> list[int]:
    """How many canonical tokens each delta holds (each must hold whole tokens)."""
    sizes, at = [], 0
    for text in deltas:
        size, joined = 0, ""
        while joined != text:
            assert len(joined) < len(text), "a delta does not end on a token boundary"
            joined += tokens[at + size]
            size += 1
        sizes.append(size)
        at += size
    return sizes


def texts(events: list[dict[str, Any]]) -> list[str]:
    return [e["delta"]["text"] for e in events if e["type"] == "content_block_delta"]


def test_deltas_hold_one_to_four_whole_tokens_and_usage_counts_tokens(
    fake: FakeProvider, http: httpx.Client
) -> None:
    tokens = fake.canonical_tokens([USER])
    events = events_of(http, BODY)
    sizes = group_sizes(texts(events), tokens)
    assert sum(sizes) == TOKENS and set(sizes) == {1, 2, 3, 4}
    assert len(sizes) < TOKENS * 0.6
    assert events[-2]["type"] == "message_delta" and events[-2]["usage"]["output_tokens"] == TOKENS
    entry = fake.journal(settle_s=5)[-1]
    assert entry["tokens_emitted"] == entry["output_tokens_billed"] == TOKENS
    assert texts(events_of(http, BODY)) == texts(events)  # the grouping is deterministic


@pytest.mark.parametrize("after", [0, 1, 2, 5, 7, 13, 101])
@pytest.mark.parametrize("kind", ["truncate", "disconnect", "error_event"])
def test_a_fault_sends_exactly_n_tokens_cutting_the_last_group_short(
    fake: FakeProvider, http: httpx.Client, after: int, kind: str
) -> None:
    tokens = fake.canonical_tokens([USER])
    whole = group_sizes(texts(events_of(http, BODY)), tokens)
    fake.add_faults([{"kind": kind, "after_tokens": after}])
    received: list[str] = []
    try:
        with http.stream("POST", "/v1/messages", json=BODY) as response:
            for line in response.iter_lines():
                if line.startswith("data:") and '"content_block_delta"' in line:
                    received.append(json.loads(line[6:])["delta"]["text"])
    except httpx.RemoteProtocolError:
        assert kind == "disconnect"
    assert "".join(received) == "".join(tokens[:after])
    sizes = group_sizes(received, tokens)
    if after:  # the groups of the whole stream, the last one maybe cut short
        assert sizes[:-1] == whole[: len(sizes) - 1]
        assert 0 < sizes[-1] <= whole[len(sizes) - 1]
    entry = fake.journal(settle_s=5)[-1]
    assert entry["tokens_emitted"] == entry["output_tokens_billed"] == after
    assert entry["outcome"] == kind
