"""Calibrated estimates (SPEC §22): exact counts of a profile and model's answers bound the
estimate of its cut attempts, with a known margin, instead of a fixed bytes-per-token guess
(pure rules first, then Redis, then a job on the Anthropic wire)."""

from __future__ import annotations

import logging
import math
from typing import Any

import pytest
import redis
from worker_support import attempt_runner, run_to_rest

from resumeq.core.calibration import Calibration, Sample, pieces
from resumeq.fake import FakeProvider
from resumeq.store import Store, keys
from resumeq.store.calibrations import Calibrations
from resumeq.testing import RedisServer


def test_pieces_split_text_as_a_bpe_pretokenizer_does() -> None:
    assert pieces("Hello, world!") == 4  # "Hello" "," " world" "!"
    assert pieces("x = f(1, 22)\n") == 9  # "x" " =" " f" "(" "1" "," " 22" ")" "\n"
    assert pieces("") == 0


def test_a_sample_that_cannot_be_right_is_refused() -> None:
    assert Sample(0, 0, 0, 5).refusal() == "no text, or no tokens"
    assert "a token is at least a byte" in (Sample(10, 3, 4, 11).refusal() or "")
    assert "each carries at least one" in (Sample(100, 30, 40, 20).refusal() or "")
    assert Sample(100, 20, 25, 25).refusal() is None
    with pytest.raises(ValueError, match="not a calibration sample"):
        Sample.decode("12 x 3")
    with pytest.raises(ValueError, match="not a calibration sample"):
        Sample.decode("5 1 1 9")  # more tokens than bytes


def test_too_little_seen_is_no_calibration() -> None:
    assert Calibration.from_samples([Sample(400, 100, 100, 100)], margin=1.25) is None
    assert Calibration.from_samples([Sample(800, 200, 200, 200)], margin=1.25) is not None


def test_one_token_per_chunk_is_estimated_within_two_percent() -> None:
    """On a wire that streams one token per chunk the chunk count is the truth: the byte
    floor (4 bytes a token) must not raise it."""
    seen = [Sample(4 * n, n, n, n) for n in (220, 310, 260)]
    calibration = Calibration.from_samples(seen, margin=1.25)
    assert calibration is not None
    for chunks in (40, 200, 700):
        got = calibration.estimate(text_bytes=2 * chunks, chunks=chunks, pieces=chunks)
        assert chunks <= got <= math.ceil(1.02 * chunks)


def test_the_margin_caps_how_high_an_estimate_goes() -> None:
    """However the answers spread, an estimate is at most ``margin`` over what they
    showed on average; never below the chunks."""
    seen = [Sample(1000, 100, 200, t) for t in (200, 260, 320, 380, 250, 300, 210, 330)]
    calibration = Calibration.from_samples(seen, margin=1.25)
    assert calibration is not None and calibration.per_chunk is not None
    mean = calibration.per_chunk.mean
    got = calibration.estimate(text_bytes=10_000, chunks=10, pieces=20)
    assert 10 <= got <= 10 * mean * 1.25 + 1


@pytest.fixture
def book(redis_client: redis.Redis) -> Calibrations:
    return Calibrations(redis_client)


def test_samples_are_kept_per_profile_and_model_bounded(
    book: Calibrations, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert not book.record("p", "m", Sample(0, 0, 0, 3))  # refused: never stored
    assert redis_client.keys(f"{keys.CALIBRATIONS}:*") == []
    for _ in range(80):
        assert book.record("p", "m", Sample(900, 200, 210, 220))
    key = keys.calibration("p", "m")
    assert redis_client.llen(key) == 64 and 0 < redis_client.ttl(key) <= 30 * 86400
    assert book.calibration("p", "m", margin=1.25) is not None
    assert book.calibration("p", "other-model", margin=1.25) is None
    monkeypatch.setattr("resumeq.store.calibrations.MAX_PAIRS", 3)
    for n in range(5):
        book.record("p", f"model-{n}", Sample(900, 200, 210, 220))
    assert redis_client.zcard(keys.CALIBRATIONS) == 3
    assert not redis_client.exists(key)  # the least recently written pair went


def test_a_corrupt_stored_sample_falls_back_with_one_warning(
    book: Calibrations, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    book.record("p", "m", Sample(900, 200, 210, 220))
    redis_client.lpush(keys.calibration("p", "m"), "not a sample")
    with caplog.at_level(logging.WARNING, logger="resumeq.store.calibrations"):
        assert book.calibration("p", "m", margin=1.25) is None
        assert book.calibration("p", "m", margin=1.25) is None
    said = [r for r in caplog.records if "corrupt" in r.getMessage()]
    assert len(said) == 1 and "estimate_bytes_per_token" in said[0].getMessage()


def anthropic(fake: FakeProvider) -> dict[str, dict[str, Any]]:
    return {
        "claude": {
            "kind": "anthropic",
            "base_url": fake.anthropic_base_url,
            "continue_mode": "prefill",
            "counting": "usage",  # a cut stream has no usage: its count is an estimate
            "stall_timeout_s": 5,
        }
    }


def test_a_job_cut_twice_is_not_truncated_by_its_estimates_once_calibrated(
    fake: FakeProvider, redis_server: RedisServer, real_store: Store
) -> None:
    """Anthropic's deltas carry several tokens and the fake's tokens are long: at the
    default 2 bytes a token each cut attempt was charged about three times its truth, and
    the budget ran out on paper (the answer ended at 1,159 of 1,391 characters). After one
    uncut answer of the model, the estimates err high by a known margin."""
    fake.completion_tokens = 200
    with attempt_runner(redis_server.url, anthropic(fake)) as runner:
        spec = {"provider": "claude", "model": "claude-x", "budget_tokens": 400}
        first = real_store.create({**spec, "prompt": "An answer that is never cut"}).id
        assert run_to_rest(runner, first).state.value == "done"
        prompt = "An answer cut twice on its way"
        fake.add_faults([
            {"kind": "disconnect", "after_tokens": 60, "match": prompt},
            {"kind": "disconnect", "after_tokens": 60, "match": prompt},
        ])  # fmt: skip
        job_id = real_store.create({**spec, "prompt": prompt}).id
        record = run_to_rest(runner, job_id)
    canonical = fake.canonical_text([{"role": "user", "content": prompt}])
    assert record.state.value == "done", (record.reason, record.error)
    assert real_store.text(job_id) == canonical  # the whole answer
    assert record.spent_output_tokens <= 400
    ledger = real_store.ledger(job_id)
    assert [a["count_source"] for a in ledger] == ["estimate", "estimate", "usage"]
    # Each cut attempt sent 60 tokens: estimated above that, by no more than the margin.
    for attempt in ledger[:2]:
        assert 60 <= attempt["output_tokens_persisted"] <= math.ceil(60 * 1.25)
