"""The drop-in Chat Completions endpoint (SPEC §24) through OpenAI's official Python SDK,
pointed at a real ``resumeq serve`` with real workers, the fake provider over HTTP and a
real redis-server: answers equal the fake's canonical ones while the fake cuts each stream
twice or a worker is SIGKILLed mid-stream; bad requests get OpenAI's error shape, and
nothing is enqueued."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import httpx
import openai
import pytest
from gateway_support import REPORT, TOOLS, Gateway, cut_twice, fresh_fake, gw, key

from resumeq.core.identity import pid_of
from resumeq.testing.processes import wait_for

__all__ = ["fresh_fake", "gw"]  # the fixtures

pytestmark = pytest.mark.timeout(120)


def ask(prompt: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": prompt}]


# -- answers -------------------------------------------------------------------------------


def test_a_non_streamed_answer_is_the_canonical_one_through_two_cuts(gw: Gateway) -> None:
    prompt = f"Tell me about rivers, cut twice. {uuid.uuid4().hex}"
    cut_twice(gw)
    done = gw.sdk().chat.completions.create(model="fake/fake-model", messages=ask(prompt))
    assert done.choices[0].message.content == gw.canonical(prompt)["text"]
    assert done.choices[0].finish_reason == "stop"
    assert done.model == "fake/fake-model"  # the model string the client sent
    job = gw.job(done.id)
    assert job["state"] == "done" and len(job["attempts"]) == 3
    extension = done.model_extra["resumeq"]  # type: ignore[index]
    assert extension["attempts"] == 3
    assert extension["billed"]["output_tokens"] == job["summary"]["output_tokens_billed"]
    # Usage is the answer's, as a direct call reports it.
    assert done.usage is not None
    assert done.usage.completion_tokens == gw.canonical(prompt)["count"]
    assert done.usage.prompt_tokens == job["attempts"][0]["input_tokens"]


def test_a_streamed_answer_through_two_cuts_arrives_whole_and_once(gw: Gateway) -> None:
    prompt = f"A table of rivers, streamed and cut twice. {uuid.uuid4().hex}"
    cut_twice(gw)
    stream = gw.sdk().chat.completions.create(
        model="gpt-4o-mini",
        messages=ask(prompt),
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == gw.canonical(prompt)["text"]
    assert chunks[0].choices[0].delta.role == "assistant"
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finish == ["stop"]
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.completion_tokens == gw.canonical(prompt)["count"]
    assert last.model_extra["resumeq"]["attempts"] == 3  # type: ignore[index]
    assert {c.id for c in chunks} == {last.id} and gw.job(last.id)["state"] == "done"


def test_a_worker_killed_mid_stream_is_only_time_to_the_client(gw: Gateway) -> None:
    prompt = f"A long answer while the worker dies. {uuid.uuid4().hex}"
    gw.fake.token_delay_ms = 15
    stream = gw.sdk().chat.completions.create(
        model="fake/fake-model", messages=ask(prompt), stream=True
    )
    pieces: list[str] = []
    victim = None
    for chunk in stream:
        pieces.append(chunk.choices[0].delta.content or "" if chunk.choices else "")
        if victim is None and len("".join(pieces)) > 120:
            holder = pid_of((gw.job(chunk.id)["lease"] or {}).get("holder"))
            victim = next(w for w in gw.workers if w.popen.pid == holder)
            victim.kill()
            gw.workers.remove(victim)
            gw.fake.token_delay_ms = 0
    assert victim is not None and not victim.alive()
    assert "".join(pieces) == gw.canonical(prompt)["text"]
    job = gw.job(chunk.id)
    assert job["attempts"][0]["cut"] == "worker_died"
    assert job["attempts"][1]["kind"] == "resume"


def test_tool_calls_arrive_whole_streamed_and_not(gw: Gateway) -> None:
    prompt = f"Weather in Lyon for three days? [fake:tool] {uuid.uuid4().hex}"
    uncut = gw.canonical(prompt, tools=TOOLS)
    expected = [(c["name"], c["arguments"]) for c in uncut["tool_calls"]]
    gw.fake.add_faults([{"kind": "disconnect", "after_tokens": 14}])
    done = gw.sdk().chat.completions.create(model="gpt-4o-mini", messages=ask(prompt), tools=TOOLS)
    calls = done.choices[0].message.tool_calls or []
    assert [(c.function.name, c.function.arguments) for c in calls] == expected
    assert done.choices[0].finish_reason == "tool_calls"

    gw.fake.add_faults([{"kind": "disconnect", "after_tokens": 14}])
    stream = gw.sdk().chat.completions.create(
        model="gpt-4o-mini", messages=ask(prompt + " again"), tools=TOOLS, stream=True
    )
    seen = [
        (t.index, t.function.name, t.function.arguments)
        for c in stream
        for t in (c.choices[0].delta.tool_calls or [] if c.choices else [])
    ]
    again = gw.canonical(prompt + " again", tools=TOOLS)["tool_calls"]
    assert seen == [
        (i, c["name"], c["arguments"]) for i, c in enumerate(again)
    ]  # each call once, whole


def test_structured_output_arrives_parsed_and_valid_through_a_cut(gw: Gateway) -> None:
    prompt = f"Rivers of France as a report. {uuid.uuid4().hex}"
    shape = {"type": "json_schema", "json_schema": {"name": "report", "schema": REPORT}}
    uncut = gw.canonical(prompt, response_format=shape)
    gw.fake.add_faults([{"kind": "disconnect", "after_tokens": 9}])
    done = gw.sdk().chat.completions.create(
        model="fake/fake-model",
        messages=ask(prompt),
        response_format=shape,  # type: ignore[arg-type]
    )
    content = done.choices[0].message.content or ""
    assert content == uncut["text"]
    assert set(json.loads(content)) >= {"title", "rivers"}


def test_an_idempotency_key_attaches_a_retried_request_to_its_job(gw: Gateway) -> None:
    prompt = f"Asked twice with one key. {uuid.uuid4().hex}"
    header = {"Idempotency-Key": f"order-{uuid.uuid4().hex}"}
    first = gw.sdk().chat.completions.create(
        model="fake/fake-model", messages=ask(prompt), extra_headers=header
    )
    before = gw.jobs()
    again = gw.sdk().chat.completions.create(
        model="fake/fake-model", messages=ask(prompt), extra_headers=header
    )
    assert again.id == first.id and gw.jobs() == before
    with pytest.raises(openai.UnprocessableEntityError) as info:
        gw.sdk(max_retries=0).chat.completions.create(
            model="fake/fake-model", messages=ask(prompt + " other"), extra_headers=header
        )
    assert info.value.body["param"] == "Idempotency-Key"  # type: ignore[index]


def test_a_client_that_goes_away_does_not_cancel_its_job(gw: Gateway) -> None:
    prompt = f"Read by a client that leaves early. {uuid.uuid4().hex}"
    gw.fake.token_delay_ms = 5
    stream = gw.sdk().chat.completions.create(
        model="fake/fake-model", messages=ask(prompt), stream=True
    )
    first = next(iter(stream))
    stream.close()
    ended = wait_for(
        lambda: gw.job(first.id)["state"] in ("done", "cancelled") and gw.job(first.id),
        timeout_s=60,
        what="the job to end",
    )
    assert ended["state"] == "done" and ended["text"] == gw.canonical(prompt)["text"]


def test_a_job_that_ends_otherwise_ends_the_stream_with_an_error_naming_it(gw: Gateway) -> None:
    prompt = f"Refused by the provider. {uuid.uuid4().hex}"
    gw.fake.add_faults([{"kind": "status", "status": 400, "after_tokens": 0}])
    stream = gw.sdk(max_retries=0).chat.completions.create(
        model="fake/fake-model", messages=ask(prompt), stream=True
    )
    with pytest.raises(openai.APIError) as info:
        for _ in stream:
            pass
    assert "ended failed" in info.value.message
    job_id = info.value.message.split()[1]
    assert gw.job(job_id)["state"] == "failed"

    gw.fake.add_faults([{"kind": "status", "status": 400, "after_tokens": 0}])
    with pytest.raises(openai.APIStatusError) as status:
        gw.sdk(max_retries=0).chat.completions.create(
            model="fake/fake-model", messages=ask(prompt + " again")
        )
    assert status.value.status_code == 502 and "ended failed" in status.value.message


# -- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("over", "param"),
    [
        ({"n": 2}, "n"),
        ({"logprobs": True}, "logprobs"),
        ({"logit_bias": {"50256": -100}}, "logit_bias"),
        ({"temperature": 7}, "temperature"),
        ({"max_tokens": 0}, "max_completion_tokens"),
        ({"tools": [{"type": "function", "function": {"name": "no spaces"}}]},
         "tools[0].function.name"),
        ({"messages": [{"role": "narrator", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
         "messages[0].content[0].type"),
    ],
)  # fmt: skip
def test_a_malformed_request_is_openais_400_naming_the_parameter(
    gw: Gateway, over: dict[str, Any], param: str
) -> None:
    before = gw.jobs()
    body = {"model": "fake/fake-model", "messages": ask("bad input"), **over}
    with pytest.raises(openai.BadRequestError) as info:
        gw.sdk(max_retries=0).chat.completions.create(**body)
    error = info.value.body
    assert isinstance(error, dict) and error["param"] == param, error
    assert error["type"] == "invalid_request_error" and param in error["message"]
    assert gw.jobs() == before


def test_an_unknown_model_and_a_bad_key_get_openais_own_errors(gw: Gateway) -> None:
    before = gw.jobs()
    with pytest.raises(openai.NotFoundError) as missing:
        gw.sdk(max_retries=0).chat.completions.create(model="gpt-9", messages=ask("x"))
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.AuthenticationError):
        gw.sdk("nobody", max_retries=0).chat.completions.create(
            model="fake/fake-model", messages=ask("x")
        )
    with pytest.raises(openai.PermissionDeniedError):
        gw.sdk("dash", max_retries=0).chat.completions.create(
            model="fake/fake-model", messages=ask("x")
        )
    assert gw.jobs() == before
    raw = httpx.post(
        f"{gw.base}/v1/chat/completions",
        headers={"Authorization": f"Bearer {key('web-app')}"},
        content=b"{not json",
    )
    assert raw.status_code == 400 and raw.json()["error"]["param"] == "body"


def test_the_models_list_names_aliases_and_profiles(gw: Gateway) -> None:
    names = {m.id for m in gw.sdk().models.list()}
    assert {"gpt-4o-mini", "fake/"} <= names


def test_the_first_delta_is_flushed_at_once(gw: Gateway) -> None:
    """With 8 tokens a flush, a slow provider's first token is shown before the eighth."""
    prompt = f"Slow first tokens. {uuid.uuid4().hex}"
    gw.fake.token_delay_ms = 150
    stream = gw.sdk().chat.completions.create(
        model="fake/fake-model", messages=ask(prompt), stream=True, max_tokens=12
    )
    started = time.monotonic()
    first_text = next(c for c in stream if c.choices and c.choices[0].delta.content)
    waited = time.monotonic() - started
    stream.close()
    assert first_text.choices[0].delta.content
    assert waited < 8 * 0.150, f"the first text came after {waited:.2f} s"
