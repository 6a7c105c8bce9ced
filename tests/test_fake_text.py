"""The fake provider's deterministic text, tokenizer and prompt layout (no HTTP)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import resumeq.fake
from resumeq.fake import VOCABULARY, FakeProvider, count_tokens, tokenize
from resumeq.fake.conversation import Continuation, InvalidRequest, conversation_of
from resumeq.fake.plan import canonical, locate, plan
from resumeq.fake.prompt import PromptCache, layout
from resumeq.fake.text import MAX_DEFAULT_TOKENS, MIN_DEFAULT_TOKENS

pytestmark = pytest.mark.timeout(30)

MESSAGES = [
    {"role": "system", "content": "You write tersely."},
    {"role": "user", "content": "Describe the harbour at dawn."},
]


def test_public_surface_is_complete() -> None:
    for name in resumeq.fake.__all__:
        assert hasattr(resumeq.fake, name), name
    assert {"FakeProvider", "serve", "Fault", "PARTIAL_OPEN", "PARTIAL_CLOSE"} <= set(
        resumeq.fake.__all__
    )


def test_vocabulary_has_two_thousand_distinct_words() -> None:
    assert len(VOCABULARY) == 2000
    assert len(set(VOCABULARY)) == 2000
    assert all(word.isalpha() and word.islower() for word in VOCABULARY)


@given(st.text())
def test_tokenize_joins_back_to_the_text(text: str) -> None:
    assert "".join(tokenize(text)) == text
    assert count_tokens(text) == len(tokenize(text))


def test_tokenize_splits_words_with_their_leading_space() -> None:
    assert tokenize("Hello, big world.\n\nNext  one_2024") == [
        "Hello",
        ",",
        " big",
        " world",
        ".",
        "\n\n",
        "Next",
        " ",
        " one",
        "_",
        "202",
        "4",
    ]


def test_canonical_text_is_deterministic_and_ignores_model_and_earlier_turns() -> None:
    fake = FakeProvider()
    text = fake.canonical_text(MESSAGES)
    assert text == fake.canonical_text([dict(m) for m in MESSAGES])
    earlier = [
        MESSAGES[0],
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo"},
    ]
    assert fake.canonical_text([*earlier, MESSAGES[1]]) == text
    other = [MESSAGES[0], {"role": "user", "content": "Describe the harbour at dusk."}]
    assert fake.canonical_text(other) != text
    # Anthropic spelling: top-level system (string or text blocks), content blocks.
    blocks = [{"role": "user", "content": [{"type": "text", "text": MESSAGES[1]["content"]}]}]
    assert fake.canonical_text(blocks, system="You write tersely.") == text
    system_blocks = [{"type": "text", "text": "You write ", "cache_control": {"type": "x"}}]
    system_blocks.append({"type": "text", "text": "tersely."})
    assert fake.canonical_text(blocks, system=system_blocks) == text


def test_canonical_tokens_are_what_the_tokenizer_sees() -> None:
    fake = FakeProvider(completion_tokens=3000)
    tokens = fake.canonical_tokens(MESSAGES)
    text = "".join(tokens)
    assert len(tokens) == 3000
    assert tokenize(text) == tokens
    for cut in (1, 17, 1234, 2999):
        assert count_tokens("".join(tokens[:cut])) == cut


def test_runs_of_three_tokens_never_repeat() -> None:
    tokens = FakeProvider(completion_tokens=20000).canonical_tokens(MESSAGES)
    runs = list(zip(tokens, tokens[1:], tokens[2:], strict=False))
    assert len(set(runs)) == len(runs)
    assert "\n\n" in tokens and "," in tokens and "." in tokens


def test_default_length_is_derived_from_the_prompt() -> None:
    fake = FakeProvider()
    lengths = {
        len(fake.canonical_tokens([{"role": "user", "content": f"prompt {i}"}])) for i in range(20)
    }
    assert all(MIN_DEFAULT_TOKENS <= n <= MAX_DEFAULT_TOKENS for n in lengths)
    assert len(lengths) > 5


def test_longer_completions_extend_shorter_ones() -> None:
    seed = conversation_of(MESSAGES).seed()
    assert canonical(seed, 500).text.startswith(canonical(seed, 100).text)


def test_locate_prefers_the_start_then_the_last_aligned_occurrence() -> None:
    text = "Ab cd ef cd ef"
    boundaries = frozenset({0, 2, 5, 8, 11, 14})
    assert locate(text, boundaries, "Ab cd").char == 5
    found = locate(text, boundaries, " cd ef")
    assert found is not None and found.char == 14 and found.ambiguous
    assert locate(text, boundaries, " zz") is None


def test_plan_resumes_inside_a_token_with_the_rest_of_it() -> None:
    conversation = conversation_of([*MESSAGES, {"role": "assistant", "content": "x"}])
    target = canonical(conversation.seed(), None)
    index = next(i for i in range(10, 100) if len(target.tokens[i]) >= 5)
    cut = target.offsets[index] + 2
    result = plan(conversation, Continuation("prefill", target.text[:cut]), None, None)
    assert result.pieces[0] == target.tokens[index][2:]
    assert result.pieces[1:] == target.tokens[index + 1 :]
    assert target.text[:cut] + "".join(result.pieces) == target.text
    assert result.finish == "stop"
    capped = plan(conversation, Continuation("prefill", target.text[:cut]), 3, None)
    assert len(capped.pieces) == 3 and capped.finish == "length"


def test_a_prefix_outside_the_canonical_text_is_refused() -> None:
    conversation = conversation_of(MESSAGES)
    with pytest.raises(InvalidRequest, match="not part of the canonical text"):
        plan(conversation, Continuation("prefill", "Something else entirely"), None, None)


def test_layout_counts_three_tokens_of_overhead_per_turn() -> None:
    prompt = layout(conversation_of([{"role": "user", "content": "one two three"}]))
    assert len(prompt) == 3 + 3
    prefill = conversation_of(
        [{"role": "user", "content": "one"}, {"role": "assistant", "content": "Two three"}]
    )
    assert len(layout(prefill)) == (1 + 1 + 1) + (1 + 2)  # the final assistant turn stays open


def test_prompt_cache_follows_openai_and_anthropic_rules() -> None:
    cache = PromptCache()
    long_text = " ".join(["word"] * 1500)
    prompt = layout(conversation_of([{"role": "user", "content": long_text}]))
    assert cache.openai("m", prompt).read == 0
    read = cache.openai("m", prompt).read
    assert read >= 1024 and (read - 1024) % 128 == 0 and read <= len(prompt)
    assert cache.openai("other-model", prompt).read == 0
    marked = [{"type": "text", "text": "rules " * 50, "cache_control": {"type": "ephemeral"}}]
    conversation = conversation_of([{"role": "user", "content": "hi"}], system=marked)
    first = cache.anthropic("m", layout(conversation))
    second = cache.anthropic("m", layout(conversation))
    cached = 1 + count_tokens("rules " * 50)  # <|system|> and the marked block
    assert (first.read, first.created) == (0, cached)
    assert (second.read, second.created) == (cached, 0)
    plain = conversation_of([{"role": "user", "content": "hi"}], system="rules")
    assert cache.anthropic("m", layout(plain)).created == 0
