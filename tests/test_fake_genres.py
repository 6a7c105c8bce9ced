"""Genres: canonical texts that repeat themselves, picked by a ``[fake:GENRE]`` marker."""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import unicodedata
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resumeq.fake import FakeProvider, tokenize
from resumeq.fake.conversation import Continuation, InvalidRequest, conversation_of
from resumeq.fake.genres import SECTIONS, genre_tokens
from resumeq.fake.genres.periodic import PATTERNS
from resumeq.fake.markers import GENRES, Markers, markers_of
from resumeq.fake.plan import canonical_for, plan

pytestmark = pytest.mark.timeout(30)

NAMED = [genre for genre in GENRES if genre != "prose"]


def user(genre: str, n: int = 0) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"Answer number {n}, please. [fake:{genre}]"}]


@pytest.fixture(scope="module")
def server() -> Iterator[FakeProvider]:
    with FakeProvider() as fake:
        yield fake


@pytest.fixture
def fake(server: FakeProvider) -> FakeProvider:
    server.reset()
    server.completion_tokens = None
    return server


@pytest.fixture
def http(fake: FakeProvider) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=fake.url, timeout=10) as client:
        yield client


# -- markers ---------------------------------------------------------------------------------


def test_markers_come_from_the_user_message_before_the_system_text() -> None:
    assert markers_of("plain", "plain") == Markers()
    assert markers_of("[fake:song] and [fake:code]", "[fake:table]").genre == "song"
    assert markers_of("plain", "[fake:table] [fake:reasoning=7]") == Markers("table", 7)
    for bad in ("[fake:poem]", "[fake:prose]", "[fake:code=2]", "[fake:reasoning=x]"):
        with pytest.raises(ValueError, match="fake"):
            markers_of(bad, "")


def test_an_unknown_marker_is_a_400(http: httpx.Client) -> None:
    body = {"model": "m", "messages": user("sonnet")}
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 400 and "[fake:sonnet]" in response.text


def test_without_a_marker_the_prose_is_unchanged_byte_for_byte() -> None:
    """Digests of the canonical texts before genres existed."""
    fake = FakeProvider()
    harbour = [
        {"role": "system", "content": "You write tersely."},
        {"role": "user", "content": "Describe the harbour at dawn."},
    ]
    tide = [{"role": "user", "content": "What is a tide?"}]
    digests = {
        "ad4c17d7274455c7adc64d2d3385f95328a3c292675884d1c918d43e78ae468f": harbour,
        "edf70b55971d40ec4ac84e9301c1165152a340d3d5cd6321d25267c5a568898f": tide,
    }
    for digest, messages in digests.items():
        assert hashlib.sha256(fake.canonical_text(messages).encode()).hexdigest() == digest
    fake.completion_tokens = 5000
    long = hashlib.sha256(fake.canonical_text(tide).encode()).hexdigest()
    assert long == "7da75ee4fffcc856875dad35b1985d9f8f45519c601024626dc710c01d74e9ba"


# -- the tokenizer invariant -----------------------------------------------------------------


@pytest.mark.parametrize("genre", NAMED)
@settings(max_examples=25, deadline=None)
@given(seed=st.binary(min_size=1, max_size=8), length=st.integers(1, 900), data=st.data())
def test_every_token_aligned_prefix_tokenizes_to_the_tokens_streamed_for_it(
    genre: Any, seed: bytes, length: int, data: st.DataObject
) -> None:
    tokens = genre_tokens(genre, seed, length)
    assert len(tokens) == length
    assert tokenize("".join(tokens)) == list(tokens)
    cut = data.draw(st.integers(0, length))
    assert tokenize("".join(tokens[:cut])) == list(tokens[:cut])
    longer = genre_tokens(genre, seed, length + data.draw(st.integers(1, 300)))
    assert longer[:length] == tokens


@pytest.mark.parametrize("genre", NAMED)
@settings(max_examples=25, deadline=None)
@given(n=st.integers(0, 10_000), data=st.data())
def test_a_prefix_from_any_cut_resumes_with_exactly_the_rest(
    genre: str, n: int, data: st.DataObject
) -> None:
    conversation = conversation_of(user(genre, n))
    target = canonical_for(conversation, None)
    cut = data.draw(st.integers(0, len(target.tokens)))
    inside = 0  # characters into the next token
    if cut < len(target.tokens):
        inside = data.draw(st.integers(0, len(target.tokens[cut]) - 1))
    prefix = target.text[: target.offsets[cut] + inside]
    for mode in ("prefill", "instruction"):
        result = plan(conversation, Continuation(mode, prefix), None, None)  # type: ignore[arg-type]
        assert prefix + "".join(result.pieces) == target.text
        assert not result.ambiguous


# -- what each genre must contain -------------------------------------------------------------


def back_to_back(lines: list[str]) -> bool:
    return any(a.strip() and a == b for a, b in itertools.pairwise(lines))


def far_apart(lines: list[str], gap: int = 3) -> bool:
    first: dict[str, int] = {}
    for index, line in enumerate(lines):
        if line.strip() and index - first.setdefault(line, index) >= gap:
            return True
    return False


def check_code(text: str) -> None:
    lines = text.split("\n")
    assert any(line.startswith("def ") for line in lines)
    assert any(line.startswith(" " * 8) for line in lines)
    assert "\n\n\n" in text  # blank lines between definitions
    assert back_to_back(lines) and far_apart(lines)


def check_table(text: str) -> None:
    rows = [line for line in text.split("\n") if line.startswith("|")]
    assert "| Name | Region | Count | Status |" in rows
    assert any(re.fullmatch(r"\|(-+\|)+", row) for row in rows)
    body = [row for row in rows if "Name" not in row and "---" not in row]
    assert len(body) >= 15 and len(set(body)) < len(body)
    assert back_to_back(body)


def check_song(text: str) -> None:
    choruses = re.findall(r"\[Chorus\]\n(.*?)\n\n", text, re.DOTALL)
    assert len(choruses) >= 2 and len(set(choruses)) == 1
    assert choruses[0].count("\n") >= 3  # several lines, sung the same each time
    assert back_to_back(text.split("\n")) and "[Verse 2]" in text


def check_laughter(text: str) -> None:
    spaced = re.findall(r"(?i)\bha(?: ha){2,}\b", text)
    joined = re.findall(r"(?i)\bha(?:ha){2,}\b", text)
    assert spaced and joined
    assert len({len(run) for run in spaced + joined}) >= 3
    assert re.search(r"[a-z][.!?] Ha", text)  # between sentences


def check_periodic(text: str) -> None:
    for pattern in PATTERNS:
        runs = list(re.finditer(f"(?:{re.escape(pattern)}){{200,}}", text))
        if len(runs) >= 2:
            assert re.search(r"[A-Z][a-z]+ [a-z]+", text[runs[0].end() : runs[1].start()])
            return
    raise AssertionError("no pattern repeated 200 times, twice")


def check_list(text: str) -> None:
    lines = text.split("\n")
    numbered = [line.split(". ", 1)[1] for line in lines if re.match(r"\d+\. ", line)]
    bullets = [line[2:] for line in lines if line.startswith("- ")]
    assert len(set(numbered)) < len(numbered) and len(set(bullets)) < len(bullets)
    assert any(line.startswith("  - ") for line in lines)


def check_unicode(text: str) -> None:
    assert "\u200d" in text and "\u00a0" in text
    assert "\r\n" in text and "\n" not in text.replace("\r\n", "")
    assert any(0x1F3FB <= ord(c) <= 0x1F3FF for c in text)  # skin tones
    assert re.search("[\U0001f1e6-\U0001f1ff]{2}", text)  # a flag
    assert re.search("[\u4e00-\u9fff\u3040-\u30ff\uac00-\ud7af]", text)
    assert re.search("[\u0600-\u06ff]", text) and re.search("[\u0590-\u05ff]", text)
    assert any(unicodedata.combining(c) for c in text)
    assert any(0x1F300 <= ord(c) <= 0x1FAFF for c in text)


def check_mixed(text: str) -> None:
    assert len(text) > 2000
    assert re.search(r"```python\n(?:.|\n)+?\n```\n", text)
    assert re.search(r"^\|(-+\|)+$", text, re.MULTILINE)
    assert re.search(r"^1\. ", text, re.MULTILINE) and re.search(r"^- ", text, re.MULTILINE)
    passage = re.search(r"To sum up: (.+?)\n\n", text)
    assert passage is not None and len(passage.group(1)) > 80
    assert text.count(passage.group(1)) >= 2


def check_html(text: str) -> None:
    assert text.startswith("Here is the page you asked for:\n\n```html\n")
    scripts = re.findall(r"<script>\n(?:.*\n)*?</script>\n", text)
    assert len(scripts) >= 2 and "alert(" in scripts[0]
    handlers = re.findall(r'<img src="[a-z]+\.png" onerror="alert\(\'[a-z]+\'\)"', text)
    assert len(handlers) >= 2
    assert "&amp;" in text and "&lt;" in text and 'href="javascript:' in text


CHECKS: dict[str, Callable[[str], None]] = {
    name[len("check_") :]: check for name, check in globals().items() if name.startswith("check_")
}


def test_every_genre_has_a_check_and_a_default_length() -> None:
    assert set(CHECKS) == set(NAMED) == set(SECTIONS)


@pytest.mark.parametrize("genre", NAMED)
def test_each_genre_contains_its_repetition_at_its_default_length(
    fake: FakeProvider, genre: str
) -> None:
    for n in range(12):
        CHECKS[genre](fake.canonical_text(user(genre, n)))


def test_the_genre_follows_the_system_text_too(fake: FakeProvider) -> None:
    messages = [{"role": "user", "content": "Write."}]
    text = fake.canonical_text(messages, system="Sing. [fake:song]")
    check_song(text)


# -- over HTTP -------------------------------------------------------------------------------


def openai_text(http: httpx.Client, body: dict[str, Any]) -> str:
    text = ""
    with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: {"):
                text += json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
    return text


@pytest.mark.parametrize("genre", NAMED)
def test_canonical_endpoint_and_continuations_over_both_wires(
    fake: FakeProvider, http: httpx.Client, genre: str
) -> None:
    messages = user(genre, 99)
    canonical = http.post("/_fake/canonical", json={"messages": messages}).json()
    assert canonical["genre"] == genre and canonical["text"] == fake.canonical_text(messages)
    assert "".join(canonical["tokens"]) == canonical["text"]
    assert canonical["count"] == len(canonical["tokens"])
    tokens, text = canonical["tokens"], canonical["text"]
    assert openai_text(http, {"model": "m", "messages": messages}) == text
    for cut in (1, len(tokens) // 3, len(tokens) - 1):
        stored = "".join(tokens[:cut])
        prefill = [*messages, {"role": "assistant", "content": stored}]
        assert stored + openai_text(http, {"model": "m", "messages": prefill}) == text
        trimmed = stored.rstrip()
        body = {
            "model": "m",
            "max_tokens": 100_000,
            "messages": [*messages, {"role": "assistant", "content": trimmed}],
        }
        answer = http.post("/v1/messages", json=body).json()
        assert trimmed + answer["content"][0]["text"] == text
    entries = fake.journal(settle_s=5)
    assert all(not e["continuation"]["ambiguous"] for e in entries if e["is_continuation"])


def test_default_lengths_suit_each_genre(fake: FakeProvider) -> None:
    for genre, (_, low, high) in SECTIONS.items():
        counts = {len(fake.canonical_tokens(user(genre, n))) for n in range(6)}
        assert all(low <= count <= high for count in counts), genre
        assert len(counts) > 1
    fake.completion_tokens = 50
    assert all(len(fake.canonical_tokens(user(genre))) == 50 for genre in NAMED)


def test_a_conversation_without_a_user_message_is_still_refused() -> None:
    with pytest.raises(InvalidRequest, match="no user message"):
        conversation_of([{"role": "system", "content": "[fake:code]"}]).markers()
