"""Engine quirks on the OpenAI wire: llama.cpp's prefill echo, usage only at the end, and its
``/tokenize``; the ``engine`` preset, through config, constructor and command line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from resumeq.cli import cli
from resumeq.fake import FakeProvider, token_id, tokenize
from resumeq.fake.llamacpp import BOS

pytestmark = pytest.mark.timeout(20)

MESSAGES = [
    {"role": "system", "content": "You answer in prose."},
    {"role": "user", "content": "What is a harbour?"},
]
PREFILL_FORMS = ["prefill", "prefill_flag", "continue_final_message"]
USAGE = {"include_usage": True, "continuous_usage_stats": True}
DEFAULTS = {"engine": "vllm", "prefill_echo": False, "continuous_usage": True, "tokenize": "vllm"}


@pytest.fixture(scope="module")
def server() -> Iterator[FakeProvider]:
    with FakeProvider(completion_tokens=60) as fake:
        yield fake


@pytest.fixture
def fake(server: FakeProvider) -> FakeProvider:
    server.reset()
    return server.configure_engine("vllm")


@pytest.fixture
def http(fake: FakeProvider) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=fake.url, timeout=10) as client:
        yield client


def prefill_body(form: str, prefix: str, **extra: Any) -> dict[str, Any]:
    assistant: dict[str, Any] = {"role": "assistant", "content": prefix}
    body: dict[str, Any] = {"model": "m", "stream": True, **extra}
    if form == "prefill_flag":
        assistant["prefix"] = True
    if form == "continue_final_message":
        body |= {"continue_final_message": True, "add_generation_prompt": False}
    return {**body, "messages": [*MESSAGES, assistant]}


def chunks_of(http: httpx.Client, body: dict[str, Any]) -> list[dict[str, Any]]:
    """Every JSON chunk of a whole OpenAI-wire stream, ``[DONE]`` checked and left out."""
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200, response.read()
        datas = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert datas[-1] == "[DONE]"
    return [json.loads(data) for data in datas[:-1]]


def contents(chunks: list[dict[str, Any]]) -> list[str]:
    return [
        c["choices"][0]["delta"]["content"]
        for c in chunks
        if c["choices"] and c["choices"][0]["delta"].get("content")
    ]


# -- prefill echo ----------------------------------------------------------------------------


@pytest.mark.parametrize("form", PREFILL_FORMS)
def test_the_echo_is_the_first_content_chunk_glued_to_the_first_token(
    fake: FakeProvider, http: httpx.Client, form: str
) -> None:
    fake.configure_engine(prefill_echo=True)
    tokens = fake.canonical_tokens(MESSAGES)
    prefix = "".join(tokens[:20])
    chunks = chunks_of(http, prefill_body(form, prefix, stream_options=USAGE))
    parts = contents(chunks)
    assert parts[0] == prefix + tokens[20]
    assert parts[1:] == tokens[21:]
    with_content = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert with_content[0]["usage"]["completion_tokens"] == 1  # the echo is not output
    assert chunks[-1]["usage"]["completion_tokens"] == 40
    entry = fake.journal(settle_s=5)[-1]
    assert entry["echo_chars"] == len(prefix)
    assert entry["text"] == "".join(tokens[20:]) and entry["output_tokens_billed"] == 40


def test_the_echo_repeats_what_was_sent_not_what_was_stored(
    fake: FakeProvider, http: httpx.Client
) -> None:
    fake.configure_engine(prefill_echo=True)
    tokens = fake.canonical_tokens(MESSAGES)
    tail = "".join(tokens[30:35])  # resume_context = tail:5
    parts = contents(chunks_of(http, prefill_body("prefill", tail, max_tokens=3)))
    assert parts == [tail + tokens[35], tokens[36], tokens[37]]


def test_no_echo_for_an_instruction_the_anthropic_wire_or_vllm(
    fake: FakeProvider, http: httpx.Client
) -> None:
    tokens = fake.canonical_tokens(MESSAGES)
    prefix = "".join(tokens[:10])
    assert contents(chunks_of(http, prefill_body("prefill", prefix)))[0] == tokens[10]
    fake.configure_engine(prefill_echo=True)
    instruction = {
        "role": "user",
        "content": f"Continue.\n<<<PARTIAL\n{prefix}\nPARTIAL>>>",
    }
    body = {"model": "m", "stream": True, "messages": [*MESSAGES, instruction]}
    assert contents(chunks_of(http, body))[0] == tokens[10]
    claude = {
        "model": "m",
        "max_tokens": 5,
        "system": MESSAGES[0]["content"],
        "messages": [MESSAGES[1], {"role": "assistant", "content": prefix}],
    }
    said = http.post("/v1/messages", json=claude).json()["content"][0]["text"]
    assert said.startswith(tokens[10])
    assert [e["echo_chars"] for e in fake.journal(settle_s=5)] == [0, 0, 0]


def test_with_nothing_to_generate_the_echo_is_a_chunk_of_its_own(
    fake: FakeProvider, http: httpx.Client
) -> None:
    fake.configure_engine(prefill_echo=True)
    whole = fake.canonical_text(MESSAGES)
    chunks = chunks_of(http, prefill_body("prefill", whole, stream_options=USAGE))
    assert contents(chunks) == [whole]
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "stop"
    assert chunks[-1]["usage"]["completion_tokens"] == 0


def test_a_fault_counts_generated_tokens_not_the_echo(
    fake: FakeProvider, http: httpx.Client
) -> None:
    fake.configure_engine(prefill_echo=True)
    tokens = fake.canonical_tokens(MESSAGES)
    prefix = "".join(tokens[:25])
    fake.add_faults([{"kind": "truncate", "after_tokens": 3}, {"kind": "truncate"}])
    with http.stream("POST", "/v1/chat/completions", json=prefill_body("prefill", prefix)) as r:
        datas = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert contents([json.loads(d) for d in datas]) == [prefix + tokens[25], *tokens[26:28]]
    entry = fake.journal(settle_s=5)[-1]
    assert entry["tokens_emitted"] == entry["output_tokens_billed"] == 3
    with http.stream("POST", "/v1/chat/completions", json=prefill_body("prefill", prefix)) as r:
        datas = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert contents([json.loads(d) for d in datas]) == []  # cut before the first token


def test_non_streaming_content_is_the_prefix_then_the_rest(
    fake: FakeProvider, http: httpx.Client
) -> None:
    fake.configure_engine(prefill_echo=True)
    tokens = fake.canonical_tokens(MESSAGES)
    prefix = "".join(tokens[:12])
    body = prefill_body("continue_final_message", prefix, stream=False)
    answer = http.post("/v1/chat/completions", json=body).json()
    assert answer["choices"][0]["message"]["content"] == fake.canonical_text(MESSAGES)
    assert answer["usage"]["completion_tokens"] == 48
    assert fake.journal(settle_s=5)[-1]["echo_chars"] == len(prefix)


# -- usage at the end only -------------------------------------------------------------------


def test_without_continuous_usage_stats_usage_comes_only_last(
    fake: FakeProvider, http: httpx.Client
) -> None:
    body = {"model": "m", "messages": MESSAGES, "stream": True, "stream_options": USAGE}
    assert all(c["usage"] is not None for c in chunks_of(http, body))
    fake.configure_engine(continuous_usage=False)
    chunks = chunks_of(http, body)
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 60


# -- /tokenize -------------------------------------------------------------------------------


def test_llamacpp_tokenize(fake: FakeProvider, http: httpx.Client) -> None:
    fake.configure_engine(tokenize="llamacpp")
    text = "".join(fake.canonical_tokens(MESSAGES)[:33])
    ids = [token_id(token) for token in tokenize(text)]
    plain = {"content": text, "add_special": False, "with_pieces": False}
    assert http.post("/tokenize", json=plain).json() == {"tokens": ids}
    special = http.post("/tokenize", json={**plain, "add_special": True}).json()["tokens"]
    assert special == [token_id(BOS), *ids]
    pieces = http.post("/tokenize", json={**plain, "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == ids and "".join(p["piece"] for p in pieces) == text
    vllm_body = {"model": "m", "prompt": text}
    answer = http.post("/tokenize", json=vllm_body)
    assert (answer.status_code, answer.json()) == (200, {"tokens": []})
    assert http.post("/tokenize", json={"content": 3}).status_code == 400


def test_vllm_tokenize_refuses_a_llamacpp_body(http: httpx.Client) -> None:
    assert http.post("/tokenize", json={"content": "a b"}).status_code == 400
    assert http.post("/tokenize", json={"prompt": "a b"}).json()["count"] == 2


# -- the preset, and where it is set ---------------------------------------------------------


def test_config_presets_and_overrides(http: httpx.Client) -> None:
    assert {k: v for k, v in http.get("/_fake/config").json().items() if k in DEFAULTS} == (
        DEFAULTS
    )
    llamacpp = {"prefill_echo": True, "continuous_usage": False, "tokenize": "llamacpp"}
    assert http.post("/_fake/config", json={"engine": "llamacpp"}).json() == {
        "completion_tokens": 60,
        "token_delay_ms": 0.0,
        "engine": "llamacpp",
        **llamacpp,
    }
    mixed = http.post("/_fake/config", json={"engine": "llamacpp", "prefill_echo": False}).json()
    assert mixed["engine"] == "custom" and mixed["tokenize"] == "llamacpp"
    assert not mixed["prefill_echo"] and not mixed["continuous_usage"]
    alone = http.post("/_fake/config", json={"continuous_usage": True}).json()
    assert alone["continuous_usage"] and alone["tokenize"] == "llamacpp"  # the rest stays
    for bad in ({"engine": "sglang"}, {"tokenize": "tgi"}, {"prefill_echo": "yes"}):
        assert http.post("/_fake/config", json=bad).status_code == 422
    assert http.get("/_fake/config").json() == alone
    assert http.post("/_fake/config", json={"engine": "vllm"}).json()["engine"] == "vllm"
    assert http.post("/_fake/reset").status_code == 200
    assert http.get("/_fake/config").json()["engine"] == "vllm"


def test_constructor_arguments() -> None:
    assert FakeProvider(engine="llamacpp").engine.describe() == {
        "engine": "llamacpp",
        "prefill_echo": True,
        "continuous_usage": False,
        "tokenize": "llamacpp",
    }
    assert FakeProvider().engine.describe() == DEFAULTS
    custom = FakeProvider(engine="llamacpp", tokenize="vllm").engine
    assert (custom.name, custom.tokenize, custom.prefill_echo) == ("custom", "vllm", True)
    assert FakeProvider(prefill_echo=True, continuous_usage=False).engine.tokenize == "vllm"
    with pytest.raises(ValueError, match="engine"):
        FakeProvider(engine="sglang")  # type: ignore[arg-type]


def test_command_line_options() -> None:
    command = [sys.executable, "-m", "resumeq", "fake-provider", "--port", "0"]
    options = ["--engine", "llamacpp", "--no-prefill-echo", "--continuous-usage"]
    process = subprocess.Popen([*command, *options], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        url = process.stdout.readline().split(" on ", 1)[1].split(" ", 1)[0]
        config = httpx.get(f"{url}/_fake/config").json()
        assert config["engine"] == "custom" and config["tokenize"] == "llamacpp"
        assert config["continuous_usage"] and not config["prefill_echo"]
    finally:
        os.kill(process.pid, signal.SIGTERM)
        process.communicate(timeout=10)
    assert process.returncode == 0
    refused = CliRunner().invoke(cli, ["fake-provider", "--tokenize", "tgi"])
    assert refused.exit_code == 2 and "tgi" in refused.output
