"""End to end: tool calls and structured output survive a cut (issue 33), on the three wires,
with real worker processes, a real redis-server and the fake provider over HTTP.

Each answer is compared with the fake's uncut one (``FakeProvider.canonical``): the same
text, the same calls (names and arguments; a call asked again has a new id), exactly once;
and the ledger's ``regenerated_tokens`` with what the fake's journal billed twice."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from e2e_support import World, make_world

from resumeq.fake import FakeProvider
from resumeq.store import Store
from resumeq.testing import RedisServer
from resumeq.testing.processes import wait_for

pytestmark = pytest.mark.timeout(120)

ENDED = {"done", "failed", "abandoned", "spilled", "cancelled", "dropped"}
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "A forecast",
                                      "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}},
]  # fmt: skip
REPORT = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "rivers": {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 4},
        "length_km": {"type": "number", "minimum": 0},
        "navigable": {"type": "boolean"},
    },
    "required": ["title", "rivers", "length_km", "navigable"],
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "report", "schema": REPORT}}
WIRES = ["fake", "fake-anthropic", "fake-responses", "fake-responses-plain"]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("e2e-tools")
    with RedisServer() as server, FakeProvider(completion_tokens=24) as fake:
        store = Store.from_url(server.url)
        for w in make_world(tmp, store, fake, server.url):
            w.cluster.worker()
            w.cluster.worker()
            w.cluster.janitor(interval_s=0.3)
            yield w


@pytest.fixture(autouse=True)
def clean(world: World) -> None:
    world.fake.reset()
    world.fake.completion_tokens = 24
    world.fake.token_delay_ms = 0


def canonical(world: World, prompt: str, **shape: Any) -> dict[str, Any]:
    return world.fake.canonical({"messages": [{"role": "user", "content": prompt}], **shape})


def calls_of(info: dict[str, Any]) -> list[tuple[str, str]]:
    return [(c["name"], c["arguments"]) for c in info["tool_calls"]]


def status(world: World, job_id: str) -> dict[str, Any]:
    from resumeq.producer.ops import status_dict  # noqa: PLC0415

    return status_dict(world.store, job_id)


GENERATIONS = ("/v1/chat/completions", "/v1/messages", "/v1/responses")


def exchanges(world: World, prompt: str) -> list[dict[str, Any]]:
    """The fake's generation requests for one job."""
    return [
        e
        for e in world.fake.journal()
        if e["path"] in GENERATIONS and prompt in json.dumps(e.get("body"))
    ]


def bought_twice(world: World, prompt: str, uncut: dict[str, Any]) -> int:
    """Output tokens the fake billed for this job past what its uncut answer needs."""
    needed = uncut["count"] + sum(c["count"] for c in uncut["tool_calls"])
    return sum(int(e["output_tokens_billed"]) for e in exchanges(world, prompt)) - needed


def partial_tokens(world: World, prompt: str) -> int:
    """The argument tokens of calls the fake sent cut (complete False)."""
    return sum(
        call["tokens"]
        for e in exchanges(world, prompt)
        for call in e.get("tool_calls") or ()
        if not call["complete"]
    )


@pytest.mark.parametrize("provider", [*WIRES, "llamacpp"])
def test_a_call_cut_inside_its_arguments_is_continued_to_the_uncut_call_once(
    world: World, provider: str
) -> None:
    prompt = f"Weather in Lyon for {provider}? [fake:tool]"
    uncut = canonical(world, prompt, tools=TOOLS)
    at = uncut["count"] + uncut["tool_calls"][0]["count"] // 2
    world.fake.add_faults([{"kind": "disconnect", "after_tokens": at, "match": prompt}])
    job_id = world.enqueue(prompt, provider=provider, tools=TOOLS)
    assert world.wait_state(job_id, ENDED).state.value == "done"
    info = status(world, job_id)
    assert info["text"] == uncut["text"]
    assert calls_of(info) == [(c["name"], c["arguments"]) for c in uncut["tool_calls"]]
    assert info["finish_reason"] == "tool_calls"
    # Nothing was bought twice: the fake billed exactly the uncut answer's tokens.
    assert bought_twice(world, prompt, uncut) == 0
    assert info["summary"]["regenerated_tokens"] == 0
    if provider == "fake-responses":
        # Its background response went on: read on where it was cut, inside the call.
        assert [a["kind"] for a in info["attempts"]] == ["fresh", "reattach"]
        return
    cut, rest = exchanges(world, prompt)
    assert partial_tokens(world, prompt) > 0 and cut["fault"] is not None
    # The call the cut attempt began is the call the answer holds, id and all.
    assert info["tool_calls"][0]["id"] == cut["tool_calls"][0]["id"]
    assert [a["kind"] for a in info["attempts"]] == ["fresh", "resume"]
    assert "get_weather" in json.dumps(rest["body"])  # the note names the call continued
    assert rest["continuation"]["prefix_chars"] > 0 and not rest.get("tool_calls")


@pytest.mark.parametrize("provider", ["fake-redo", "fake-anthropic-redo"])
def test_a_call_cut_inside_its_arguments_is_asked_again_where_calls_are_not_continued(
    world: World, provider: str
) -> None:
    prompt = f"Weather in Lyon, asked again, for {provider}? [fake:tool]"
    uncut = canonical(world, prompt, tools=TOOLS)
    at = uncut["count"] + uncut["tool_calls"][0]["count"] // 2
    world.fake.add_faults([{"kind": "disconnect", "after_tokens": at, "match": prompt}])
    job_id = world.enqueue(prompt, provider=provider, tools=TOOLS)
    assert world.wait_state(job_id, ENDED).state.value == "done"
    info = status(world, job_id)
    assert info["text"] == uncut["text"]
    assert calls_of(info) == [(c["name"], c["arguments"]) for c in uncut["tool_calls"]]
    twice = bought_twice(world, prompt, uncut)
    assert twice == partial_tokens(world, prompt) > 0
    regenerated = info["summary"]["regenerated_tokens"]
    if provider == "fake-redo":
        assert regenerated == twice  # the chunks' counts are exact (vLLM's continuous usage)
    else:
        # A cut Anthropic stream says no count: each event of the call counted once, a
        # lower bound (the fake sends up to four tokens in one event).
        assert 0 < regenerated <= twice
    redo = [a for a in info["attempts"] if a.get("regenerated_tokens")]
    assert len(redo) == 1 and "get_weather" in redo[0]["regenerated"]


@pytest.mark.parametrize("provider", ["fake", "fake-redo"])
def test_a_parallel_set_cut_in_its_second_call_keeps_the_first(world: World, provider: str) -> None:
    prompt = f"Weather and time in Lyon, for {provider}? [fake:tools=2]"
    uncut = canonical(world, prompt, tools=TOOLS)
    first, second = uncut["tool_calls"]
    at = uncut["count"] + first["count"] + second["count"] // 2
    world.fake.add_faults([{"kind": "truncate", "after_tokens": at, "match": prompt}])
    job_id = world.enqueue(prompt, provider=provider, tools=TOOLS)
    assert world.wait_state(job_id, ENDED).state.value == "done"
    info = status(world, job_id)
    assert calls_of(info) == [(c["name"], c["arguments"]) for c in uncut["tool_calls"]]
    # The first call is the one the cut attempt made, id and all.
    cut_exchange, again = exchanges(world, prompt)
    assert cut_exchange["fault"] is not None
    assert info["tool_calls"][0]["id"] == cut_exchange["tool_calls"][0]["id"]
    if provider == "fake":
        # The second call's arguments continued: the same call, nothing bought twice.
        assert info["tool_calls"][1]["id"] == cut_exchange["tool_calls"][1]["id"]
        assert again["body"]["tool_choice"] == "none"
        assert bought_twice(world, prompt, uncut) == 0 == info["summary"]["regenerated_tokens"]
        return
    # Asked again by name: a call of its own.
    assert info["tool_calls"][1]["id"] != cut_exchange["tool_calls"][1]["id"]
    assert again["body"]["tool_choice"] == {"type": "function", "function": {"name": "get_time"}}
    assert info["summary"]["regenerated_tokens"] == bought_twice(world, prompt, uncut) > 0


@pytest.mark.parametrize("provider", WIRES)
def test_a_document_cut_inside_ends_whole_and_valid(world: World, provider: str) -> None:
    prompt = f"A report on the rivers of France, for {provider}."
    uncut = canonical(world, prompt, response_format=FORMAT)
    assert uncut["document"] == uncut["text"]
    world.fake.add_faults(
        [{"kind": "disconnect", "after_tokens": uncut["count"] // 2, "match": prompt}]
    )
    job_id = world.enqueue(prompt, provider=provider, response_format=FORMAT)
    assert world.wait_state(job_id, ENDED).state.value == "done"
    text = world.store.text(job_id)
    assert text == uncut["document"]
    jsonschema.validate(json.loads(text), REPORT)
    info = status(world, job_id)
    # Continued (a background response is read on: the same draw, nothing sent again).
    again = "reattach" if provider == "fake-responses" else "resume"
    assert [a["kind"] for a in info["attempts"]] == ["fresh", again]
    assert info["summary"]["regenerated_tokens"] == 0  # continued, nothing bought twice


@pytest.mark.parametrize(
    ("on_invalid", "state"), [("spill", "spilled"), ("fail", "failed"), ("retry", "done")]
)
def test_a_broken_document_takes_on_invalid(world: World, on_invalid: str, state: str) -> None:
    prompt = f"A report on rivers, broken then {on_invalid}."
    uncut = canonical(world, prompt, response_format=FORMAT)
    world.fake.add_faults(
        [{"kind": "corrupt", "after_tokens": uncut["count"] // 3, "match": prompt}]
    )
    job_id = world.enqueue(prompt, response_format=FORMAT, exit={"on_invalid": on_invalid})
    record = world.wait_state(job_id, ENDED)
    assert record.state.value == state
    info = status(world, job_id)
    if on_invalid == "retry":
        assert world.store.text(job_id) == uncut["document"]
        first, again = info["attempts"]
        assert first["cut"] == "invalid" and again["kind"] == "retry"
        # The broken answer was let go: all it billed is bought again.
        assert first["regenerated_tokens"] == first["output_tokens_persisted"] > 0
        return
    assert "invalid answer" in (record.reason or record.error or "")
    if on_invalid == "spill":
        shown = subprocess.run(
            [sys.executable, "-m", "resumeq", "spill", "show", job_id],
            capture_output=True, text=True, env=world.cluster.env, timeout=30, check=False,
        )  # fmt: skip
        assert shown.returncode == 0, shown.stderr
        assert "invalid answer" in shown.stdout and "not JSON" in shown.stdout


def test_tool_arguments_that_are_not_json_are_an_invalid_answer(world: World) -> None:
    prompt = "Weather in Paris, arguments broken. [fake:tool]"
    uncut = canonical(world, prompt, tools=TOOLS)
    at = uncut["count"] + 3
    world.fake.add_faults([{"kind": "corrupt", "after_tokens": at, "match": prompt}])
    job_id = world.enqueue(prompt, tools=TOOLS, exit={"on_invalid": "fail"})
    record = world.wait_state(job_id, ENDED)
    assert record.state.value == "failed"
    assert "get_weather: arguments are not JSON" in (record.error or "")


def test_a_refusal_ends_done_with_it(world: World) -> None:
    prompt = "Something you will not do. [fake:refusal]"
    job_id = world.enqueue(prompt)
    assert world.wait_state(job_id, ENDED).state.value == "done"
    info = status(world, job_id)
    assert info["refusal"] == canonical(world, prompt)["refusal"]


@pytest.fixture
def lone(
    tmp_path: Path, real_store: Store, fake: FakeProvider, redis_server: RedisServer
) -> Iterator[World]:
    """A world of its own, with no worker yet: the test starts the one it kills."""
    yield from make_world(tmp_path, real_store, fake, redis_server.url)


def test_a_worker_killed_inside_a_call_ends_with_the_call_once(lone: World) -> None:
    lone.fake.completion_tokens = 24
    lone.fake.token_delay_ms = 40
    victim = lone.cluster.worker()
    prompt = "Weather in Nantes, the worker dies. [fake:tool]"
    uncut = canonical(lone, prompt, tools=TOOLS)
    job_id = lone.enqueue(prompt, tools=TOOLS)
    # Killed once a part of the call's arguments is durable.
    wait_for(
        lambda: any(not c.complete and c.tokens >= 4 for c in lone.store.get(job_id).calls),
        timeout_s=30,
        what="a partial call checkpointed",
    )
    victim.kill()
    seen = next(c.tokens for c in lone.store.get(job_id).calls if not c.complete)
    lone.fake.token_delay_ms = 0
    lone.cluster.worker()
    lone.cluster.janitor(interval_s=0.3)
    assert lone.wait_state(job_id, ENDED, timeout_s=60).state.value == "done"
    info = status(lone, job_id)
    assert calls_of(info) == [(c["name"], c["arguments"]) for c in uncut["tool_calls"]]
    assert info["text"] == uncut["text"]
    first, *later = info["attempts"]
    assert first["cut"] == "worker_died"
    # The call's durable arguments were continued, not bought again: the call the dead
    # worker began is the answer's.
    assert seen >= 4 and info["summary"]["regenerated_tokens"] == 0
    assert later[0]["kind"] == "resume"
    began = next(e for e in exchanges(lone, prompt) if e.get("tool_calls"))
    assert info["tool_calls"][0]["id"] == began["tool_calls"][0]["id"]


def test_a_worker_killed_inside_a_call_asked_again_counts_what_it_saw(lone: World) -> None:
    lone.fake.completion_tokens = 24
    lone.fake.token_delay_ms = 40
    victim = lone.cluster.worker()
    prompt = "Weather in Brest, the worker dies, asked again. [fake:tool]"
    uncut = canonical(lone, prompt, tools=TOOLS)
    job_id = lone.enqueue(prompt, provider="fake-redo", tools=TOOLS)
    wait_for(
        lambda: any(not c.complete and c.tokens >= 4 for c in lone.store.get(job_id).calls),
        timeout_s=30,
        what="a partial call checkpointed",
    )
    victim.kill()
    seen = next(c.tokens for c in lone.store.get(job_id).calls if not c.complete)
    lone.fake.token_delay_ms = 0
    lone.cluster.worker()
    lone.cluster.janitor(interval_s=0.3)
    assert lone.wait_state(job_id, ENDED, timeout_s=60).state.value == "done"
    info = status(lone, job_id)
    assert calls_of(info) == [(c["name"], c["arguments"]) for c in uncut["tool_calls"]]
    first = info["attempts"][0]
    assert first["cut"] == "worker_died"
    # At least what the worker had made durable of the call is counted as bought again.
    assert first["regenerated_tokens"] >= seen >= 4
