"""What an answer holds besides its text (issue 33): the tool calls as checkpointed, the
redo of a cut one, the check of a finished answer, the shape a continuation asks, and the
store's writes of all of it (on a real redis-server and on fakeredis)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from resumeq.core.answer import (
    CALL_NOTE,
    CALL_NOTE_SCHEMA,
    JSON_OBJECT_NOTE,
    SCHEMA_NOTE,
    DurableCall,
    dumps_calls,
    loads_calls,
    problem_of,
    redo_of,
    shown,
)
from resumeq.core.continuation import plan_request
from resumeq.core.gate import Cut, JobView, decide
from resumeq.core.settings import ProviderProfile
from resumeq.core.spec import ExitPolicy, JobSpec, NamedToolChoice, parse_spec
from resumeq.producer.client import delta_of
from resumeq.server.sse import frames
from resumeq.store import Store, keys

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
]


def tool_spec(**over: Any) -> JobSpec:
    base: dict[str, Any] = {
        "prompt": "Weather and time in Lyon? [fake:tools=2]",
        "provider": "local",
        "model": "m",
        "budget_tokens": 400,
        "tools": TOOLS,
    }
    return parse_spec({**base, **over})


def doc_spec(kind: str = "json_schema", **over: Any) -> JobSpec:
    rf: dict[str, Any] = {"type": kind}
    if kind == "json_schema":
        rf["json_schema"] = {"name": "forecast", "schema": WEATHER}
    base = {"prompt": "Forecast", "provider": "local", "model": "m", "budget_tokens": 400}
    return parse_spec({**base, "response_format": rf, **over})


def call(name: str, arguments: str, *, complete: bool = True, tokens: int = 5) -> DurableCall:
    return DurableCall(f"call_{name}", name, arguments, complete, tokens, 1)


def test_calls_round_trip_and_only_complete_ones_are_shown() -> None:
    calls = (
        call("get_weather", '{"city":"Lyon","days":2}'),
        call("get_time", '{"tz', complete=False),
    )
    assert loads_calls(dumps_calls(calls)) == calls
    assert shown(calls) == [
        {"id": "call_get_weather", "name": "get_weather", "arguments": '{"city":"Lyon","days":2}'}
    ]
    assert loads_calls("") == ()
    for bad in ("{}", "[1]", '[{"id": "x"}]', '[{"id": "x", "name": "n", "colour": 1}]'):
        with pytest.raises(ValueError, match="tool_calls"):
            loads_calls(bad)


def test_a_call_cut_after_complete_ones_is_redone_alone_by_name() -> None:
    calls = (
        call("get_weather", '{"city":"Lyon","days":2}'),
        call("get_time", '{"tz":"Eu', complete=False, tokens=4),
    )
    redo = redo_of(calls, tool_spec())
    assert redo is not None
    assert redo.kept == calls[:1]
    assert redo.tool_choice == NamedToolChoice.model_validate({"function": {"name": "get_time"}})
    assert redo.regenerated_tokens == 4
    assert "get_time" in redo.why and "1 complete call(s) kept" in redo.why


def test_a_set_cut_in_its_first_call_is_asked_again_whole() -> None:
    redo = redo_of((call("get_weather", '{"ci', complete=False, tokens=3),), tool_spec())
    assert redo is not None and redo.kept == () and redo.tool_choice == "required"
    assert redo.regenerated_tokens == 3 and "the set asked again" in redo.why
    forced = tool_spec(tool_choice={"type": "function", "function": {"name": "get_weather"}})
    again = redo_of((call("get_weather", '{"ci', complete=False),), forced)
    assert again is not None and isinstance(again.tool_choice, NamedToolChoice)
    assert redo_of((call("get_weather", "{}"),), tool_spec()) is None


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ('{"city":"Lyon","days":2}', None),
        ('{"city":"Lyon","days":', "arguments are not JSON"),
        ("[1, 2]", "arguments are not a JSON object"),
    ],
)
def test_tool_call_arguments_must_be_a_json_object(arguments: str, problem: str | None) -> None:
    found = problem_of(tool_spec(), "", (call("get_weather", arguments),), "tool_calls")
    assert found == problem if problem is None else problem in (found or "")


def test_a_strict_tool_checks_its_schema_and_unknown_or_open_calls_are_invalid() -> None:
    strict = [{**TOOLS[0], "function": {**TOOLS[0]["function"], "strict": True}}]
    spec = tool_spec(tools=strict, prompt="Weather? [fake:tool]")
    found = problem_of(spec, "", (call("get_weather", '{"city":"Lyon","days":0}'),), "tool_calls")
    assert found is not None and "days" in found and "minimum" in found
    assert "not one of the job's tools" in (
        problem_of(spec, "", (call("get_news", "{}"),), "tool_calls") or ""
    )
    open_call = (call("get_weather", '{"city":"Ly', complete=False),)
    assert "did not end" in (problem_of(spec, "", open_call, "tool_calls") or "")


@pytest.mark.parametrize(
    ("text", "finish", "problem"),
    [
        ('{"city": "Lyon", "days": 3}', "stop", None),
        ('{"city": "Lyon", "days": 3', "stop", "not JSON"),
        ('{"city": "Lyon"}', "stop", "'days' is a required property"),
        ('{"city": "Lyon", "days": 3}', "length", "cut off by the output limit"),
    ],
)
def test_a_document_must_parse_and_validate(text: str, finish: str, problem: str | None) -> None:
    found = problem_of(doc_spec(), text, (), finish)
    assert found is None if problem is None else problem in (found or "")
    assert (
        problem_of(doc_spec("json_object"), "[1]", (), "stop") == "the answer is not a JSON object"
    )
    assert problem_of(doc_spec("json_object"), '{"a": 1}', (), "stop") is None


def profile(kind: str = "openai", mode: str = "instruction") -> ProviderProfile:
    return ProviderProfile.model_validate(
        {"kind": kind, "base_url": "http://127.0.0.1:1/v1", "continue_mode": mode}
    )


def test_a_continuation_of_a_document_drops_constrained_decoding_for_a_note() -> None:
    spec = doc_spec()
    fresh = plan_request(spec, profile(), prefix="", remaining_tokens=100)
    assert fresh.shape.response_format == spec.response_format
    assert all(SCHEMA_NOTE not in m.content for m in fresh.messages)
    for p in (profile(), profile("anthropic", "prefill")):
        resumed = plan_request(spec, p, prefix='{"city": "Ly', remaining_tokens=100)
        assert resumed.shape.response_format is None
        notes = [
            m for m in resumed.messages if m.role == "system" and m.content.startswith(SCHEMA_NOTE)
        ]
        assert len(notes) == 1
        assert json.loads(notes[0].content.removeprefix(SCHEMA_NOTE)) == WEATHER
        assert resumed.messages[0] is notes[0]  # before the conversation, after any system
    anthropic_object = plan_request(
        doc_spec("json_object"), profile("anthropic", "prefill"), prefix="", remaining_tokens=9
    )
    assert anthropic_object.shape.response_format is None
    assert anthropic_object.messages[0].content == JSON_OBJECT_NOTE


def test_a_redo_forces_its_tool_choice_and_keeps_the_tools() -> None:
    forced = NamedToolChoice.model_validate({"function": {"name": "get_time"}})
    plan = plan_request(
        tool_spec(), profile(), prefix="Let me look.", remaining_tokens=50, tool_choice=forced
    )
    assert plan.shape.tool_choice == forced and len(plan.shape.tools) == 2


def test_a_call_cut_inside_its_arguments_is_continued_where_the_profile_continues_calls() -> None:
    kept = call("get_weather", '{"city":"Lyon","days":2}')
    cut = call("get_time", '{"tz":"Eu', complete=False, tokens=4)
    redo = redo_of((kept, cut), tool_spec(), continue_calls=True)
    assert redo is not None and redo.continued == cut and redo.kept == (kept, cut)
    assert redo.tool_choice == "none" and redo.regenerated_tokens == 0
    assert "arguments continued" in redo.why
    # Nothing of it arrived: there is nothing to continue, it is asked again.
    bare = call("get_time", "", complete=False, tokens=0)
    again = redo_of((kept, bare), tool_spec(), continue_calls=True)
    assert again is not None and again.continued is None and again.kept == (kept,)
    # A background profile reads a cut call on; one that says no asks it again.
    background = ProviderProfile.model_validate(
        {"kind": "openai-responses", "base_url": "http://127.0.0.1:1/v1", "background": True}
    )
    assert profile().continues_calls and not background.continues_calls
    off = profile().model_copy(update={"continue_calls": False})
    assert not off.continues_calls


@pytest.mark.parametrize(("kind", "mode"), [("openai", "instruction"), ("anthropic", "prefill"),
                                           ("openai", "continue_final_message")])  # fmt: skip
def test_a_continued_call_asks_for_the_rest_of_its_arguments_as_text(kind: str, mode: str) -> None:
    cut = call("get_weather", '{"city":"Ly', complete=False)
    plan = plan_request(
        doc_spec(tools=TOOLS), profile(kind, mode), prefix="Let me look.", remaining_tokens=50,
        call=cut,
    )  # fmt: skip
    assert plan.kind == "resume" and plan.continues_call
    assert plan.shape.tool_choice == "none" and len(plan.shape.tools) == 2
    assert plan.shape.response_format is None
    note = plan.messages[0]
    assert note.role == "system" and note.content.startswith(CALL_NOTE + "get_weather")
    schema = note.content.partition(CALL_NOTE_SCHEMA)[2]
    assert json.loads(schema) == WEATHER and SCHEMA_NOTE not in note.content
    assert plan.prefix_chars_sent == len(cut.arguments)  # the arguments are the prefix
    last = plan.messages[-1]
    assert (cut.arguments in last.content) and (last.role == "user") == (mode == "instruction")


def view(**over: Any) -> JobView:
    base: dict[str, Any] = {
        "budget_tokens": 400, "floor_tokens": 8, "spent_output_tokens": 60,
        "prefix_chars": 200, "attempts": 1, "spill_count": 0,
    }  # fmt: skip
    return JobView(**{**base, **over})


@pytest.mark.parametrize(
    ("policy", "over", "action", "discard"),
    [
        ("retry", {}, "retry", True),
        ("retry", {"attempts": 5}, "spill", False),
        ("retry", {"spent_output_tokens": 396}, "spill", False),
        ("spill", {}, "spill", False),
        ("spill", {"spill_count": 1}, "failed", False),
        ("fail", {}, "failed", False),
    ],
)
def test_an_invalid_answer_takes_on_invalid(
    policy: str, over: dict[str, Any], action: str, discard: bool
) -> None:
    decision = decide(
        view(exit=ExitPolicy(on_invalid=policy), **over), Cut(kind="invalid", detail="not JSON")
    )
    assert (decision.action, decision.discard) == (action, discard)
    assert "invalid answer: not JSON" in decision.reason


def test_flush_keeps_the_calls_and_announces_whole_ones(store: Store) -> None:
    job_id = store.create(
        tool_spec().model_dump(mode="json", by_alias=True, exclude_defaults=True)
    ).id
    got = store.acquire(job_id, worker="w1", ttl_ms=5000)
    partial = (call("get_weather", '{"city":"Ly', complete=False, tokens=3),)
    r1 = store.flush(got.lease, expected_revision=got.record.revision, delta="Let me look. ",
                     tokens=4, calls=dumps_calls(partial))  # fmt: skip
    whole = (call("get_weather", '{"city":"Lyon","days":2}', tokens=6),)
    announced = json.dumps(shown(whole))
    r2 = store.flush(got.lease, expected_revision=r1.revision, delta="", tokens=3,
                     calls=dumps_calls(whole), announce=announced)  # fmt: skip
    record = store.get(job_id)
    assert record.calls == whole and record.spent_output_tokens == 7
    events = store.redis.xrange(keys.events(job_id))
    fields = {k.decode(): v.decode() for k, v in events[-1][1].items()}
    assert json.loads(fields["calls"]) == shown(whole)
    delta = delta_of(r2.revision, fields)
    assert delta is not None and delta.tool_calls == tuple(shown(whole)) and delta.text == ""
    sse = "".join(frames(r2.revision, fields))
    assert "event: tool_call" in sse and '"name": "get_weather"' in sse
    first = {k.decode(): v.decode() for k, v in events[-2][1].items()}
    assert "calls" not in first  # the partial call was checkpointed, never shown


def test_a_release_that_discards_lets_the_answer_go(store: Store) -> None:
    job_id = store.create(
        doc_spec().model_dump(mode="json", by_alias=True, exclude_defaults=True)
    ).id
    got = store.acquire(job_id, worker="w1", ttl_ms=5000)
    flushed = store.flush(got.lease, expected_revision=got.record.revision,
                          delta='{"city": "Lyon"}', tokens=9, refusal="")  # fmt: skip
    store.release(got.lease, to="queued", reason="invalid answer", discard=True,
                  expected_revision=flushed.revision)  # fmt: skip
    record = store.get(job_id)
    assert store.text(job_id) == "" and record.calls == () and record.answer_base == 9
    assert record.spent_output_tokens == 9  # billed, still counted
    last = store.redis.xrange(keys.events(job_id))[-1][1]
    fields = {k.decode(): v.decode() for k, v in last.items()}
    assert fields["reset"] == "1" and "event: reset" in "".join(frames(1, fields))
    delta = delta_of(1, fields)
    assert delta is not None and delta.reset


def test_a_byte_exact_job_or_a_call_to_an_unknown_tool_is_asked_again_not_continued() -> None:
    cut = (call("get_weather", '{"city":"Ly', complete=False, tokens=4),)
    exact = redo_of(cut, tool_spec(byte_exact=True), continue_calls=True)
    assert exact is not None and exact.continued is None and exact.regenerated_tokens == 4
    unknown = (call("get_news", '{"q":"Ly', complete=False),)
    assert redo_of(unknown, tool_spec(), continue_calls=True).continued is None  # type: ignore[union-attr]


def test_a_continued_call_is_sent_whole_where_the_profile_sends_a_tail() -> None:
    tail = profile().model_copy(update={"resume_context": "tail:2"})
    arguments = '{"city": "Lyon and its many quarters", "days'
    plan = plan_request(
        tool_spec(), tail, prefix="", remaining_tokens=50,
        call=call("get_weather", arguments, complete=False),
    )  # fmt: skip
    assert plan.prefix_chars_sent == len(arguments) and arguments in plan.messages[-1].content


@pytest.mark.parametrize(
    ("finish", "refusal", "ends"),
    [("stop", "", True), ("end_turn", "", True), ("length", "", False),
     ("max_tokens", "", False), ("content_filter", "", False), ("refusal", "no", False),
     ("end_turn", "I can't help", False)],
)  # fmt: skip
def test_a_continued_call_ends_only_with_a_natural_end(
    finish: str, refusal: str, ends: bool
) -> None:
    from types import SimpleNamespace  # noqa: PLC0415

    from resumeq.worker.call import StreamResult  # noqa: PLC0415
    from resumeq.worker.stream import Streamer  # noqa: PLC0415

    ended: list[bool] = []
    ckpt = SimpleNamespace(refusal=refusal, end_continued=lambda: ended.append(True))
    stub = SimpleNamespace(plan=SimpleNamespace(continues_call=True), ckpt=ckpt)
    result = StreamResult(Cut(kind="finished", finish_reason=finish))
    Streamer.end_continued(stub, result)  # type: ignore[arg-type]
    assert bool(ended) == ends
    assert (result.cut.finish_reason == "tool_calls") == ends


def test_a_document_cut_off_by_anthropics_limit_is_invalid() -> None:
    found = problem_of(doc_spec(), '{"city": "Lyon", "days": 3}', (), "max_tokens")
    assert found is not None and "max_tokens" in found
