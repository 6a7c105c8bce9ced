"""Text and counts exact on every kind of engine: cuts at 10, 700 and 5,000 tokens, in every
continue mode and counting mode, the text canonical byte for byte and the cursor equal to
the final text's tokens.

The engines are the fake provider's: vLLM's (continuous usage, ``/tokenize``; and its
Responses API, usage only at the end, continued by an assistant message ``in_progress``),
llama.cpp's (a prefill echoed in the first delta, usage only in the last chunk, its own
``/tokenize`` that answers an empty list to a body it does not understand) and Anthropic's
(deltas of several tokens, ``count_tokens``). Attempts run in process on the worker's code
path, with a real redis-server and real HTTP."""

from __future__ import annotations

from typing import Any

import pytest
from worker_support import attempt_runner, run_to_rest

from resumeq.fake import FakeProvider, count_tokens
from resumeq.store import Store
from resumeq.testing import RedisServer

pytestmark = pytest.mark.timeout(120)

#: name: (engine, profile), the profile without its base URL.
MODES: dict[str, tuple[str, dict[str, Any]]] = {
    "vllm-continue_final_message": (
        "vllm",
        {"kind": "openai", "continue_mode": "continue_final_message", "counting": "usage"},
    ),
    "vllm-prefill_flag-tokenizer": (
        "vllm",
        {"kind": "openai", "continue_mode": "prefill_flag", "counting": "tokenizer"},
    ),
    "vllm-instruction": (
        "vllm",
        {"kind": "openai", "continue_mode": "instruction", "counting": "usage"},
    ),
    "llamacpp-prefill-echo-auto": (
        "llamacpp",
        {
            "kind": "openai",
            "continue_mode": "prefill",
            "counting": "usage+tokenizer",
            "tokenizer": "llamacpp",
        },
    ),
    "llamacpp-prefill-echo-yes": (
        "llamacpp",
        {
            "kind": "openai",
            "continue_mode": "prefill",
            "counting": "tokenizer",
            "tokenizer": "llamacpp",
            "prefill_echo": "yes",
        },
    ),
    "responses-continue_final_message": (
        "vllm",
        {
            "kind": "openai-responses",
            "continue_mode": "continue_final_message",
            "counting": "usage+tokenizer",
        },
    ),
    "responses-instruction": (
        "vllm",
        {"kind": "openai-responses", "continue_mode": "instruction", "counting": "usage+tokenizer"},
    ),
    "anthropic-prefill": (
        "vllm",
        {"kind": "anthropic", "continue_mode": "prefill", "counting": "usage+tokenizer"},
    ),
    "anthropic-instruction": (
        "vllm",
        {"kind": "anthropic", "continue_mode": "instruction", "counting": "usage+tokenizer"},
    ),
}

#: Where each job is cut, and how long its canonical text is.
CUTS = [(10, 1_200), (700, 1_200), (5_000, 5_400)]
BUDGET = 6_000


@pytest.fixture(scope="module")
def fake() -> Any:
    with FakeProvider() as fake:
        yield fake


@pytest.mark.parametrize("mode", sorted(MODES))
def test_a_cut_job_ends_with_the_canonical_text_and_an_exact_cursor(
    mode: str, fake: FakeProvider, redis_server: RedisServer, real_store: Store
) -> None:
    engine, profile = MODES[mode]
    fake.reset()
    fake.configure_engine(engine)
    base = fake.anthropic_base_url if profile["kind"] == "anthropic" else fake.openai_base_url
    providers = {"p": {**profile, "base_url": base, "stall_timeout_s": 5}}
    with attempt_runner(redis_server.url, providers) as runner:
        for cut, length in CUTS:
            fake.completion_tokens = length
            prompt = f"{mode} cut at {cut}: a long answer, please [fake:mixed]"
            messages = [{"role": "user", "content": prompt}]
            want = fake.canonical_text(messages)
            fake.add_faults([{"kind": "disconnect", "after_tokens": cut, "match": prompt}])
            spec = {"prompt": prompt, "provider": "p", "model": "m", "budget_tokens": BUDGET}
            job_id = real_store.create(spec).id
            record = run_to_rest(runner, job_id)
            text = real_store.text(job_id)
            assert record.state.value == "done", (mode, cut, record.reason, record.error)
            assert text == want, (mode, cut)
            assert record.counts_exact, (mode, cut, real_store.ledger(job_id))
            requests = [r for r in fake.journal(settle_s=1) if prompt in str(r["body"])]
            assert len(requests) == 2, (mode, cut)
            # The cursor is what was bought: every token once, but for white space that an
            # Anthropic prefill may not end with, which the model writes again.
            billed = sum(r["output_tokens_billed"] for r in requests)
            assert record.spent_output_tokens == billed, (mode, cut)
            prefix = requests[0]["text"]
            again = prefix[len(prefix.rstrip()) :] if mode == "anthropic-prefill" else ""
            assert billed == count_tokens(want) + count_tokens(again), (mode, cut)
            body = requests[1]["body"]
            assert body.get("max_tokens", body.get("max_output_tokens")) == BUDGET - cut
            if engine == "llamacpp":
                assert requests[1]["echo_chars"] > 0  # the engine did echo, and it was dropped
            ledger = real_store.ledger(job_id)
            assert [a["kind"] for a in ledger] == ["fresh", "resume"]
            assert all(a["counts_exact"] for a in ledger)
