"""Follow tokens, signed and checked without a server: rotation, expiry, tampering."""

from __future__ import annotations

import pytest

from resumeq.core.errors import ConfigError
from resumeq.core.settings import ServerSettings
from resumeq.server.follow import FollowTokens, TokenRefused

OLD, NEW = b"o" * 40, b"n" * 40


def refused(tokens: FollowTokens, token: str, job_id: str, now_ms: int) -> int:
    with pytest.raises(TokenRefused) as caught:
        tokens.check(token, job_id, now_ms=now_ms)
    return caught.value.status


def test_a_token_opens_its_job_until_it_expires() -> None:
    tokens = FollowTokens([NEW])
    issued = tokens.issue("job-1", now_ms=1_000, ttl_s=60)
    assert issued.expires_at_ms == 61_000
    tokens.check(issued.token, "job-1", now_ms=60_999)
    assert refused(tokens, issued.token, "job-1", 61_000) == 401
    # Another job's: a 404, whatever its age.
    assert refused(tokens, issued.token, "job-2", 2_000) == 404
    assert refused(tokens, issued.token, "job-2", 99_000) == 404


def test_a_rotation_keeps_tokens_signed_with_the_previous_secret() -> None:
    before = FollowTokens([OLD]).issue("job-1", now_ms=0, ttl_s=60).token
    rotated = FollowTokens([NEW, OLD])
    rotated.check(before, "job-1", now_ms=1)
    assert rotated.issue("job-1", now_ms=0, ttl_s=60).token != before  # signed with NEW
    assert refused(FollowTokens([NEW]), before, "job-1", 1) == 401  # rotated out


def test_tampering_is_a_401() -> None:
    tokens = FollowTokens([NEW])
    good = tokens.issue("job-1", now_ms=0, ttl_s=60).token
    head, _, signature = good.rpartition(".")
    longer = head.replace(".60000", ".99999999") + "." + signature  # a later expiry, same sig
    for bad in (longer, good.replace("job-1", "job-2"), good[:-1] + "A", "", "rqf1.job-1.1.x"):
        assert refused(tokens, bad, "job-1", 1) in (401, 404)
        if "job-2" not in bad:
            assert refused(tokens, bad, "job-1", 1) == 401


def test_a_secret_named_and_unset_or_short_stops_the_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("FOLLOW_SECRET", raising=False)
    settings = ServerSettings(secret_env="FOLLOW_SECRET")
    with pytest.raises(ConfigError, match="FOLLOW_SECRET, which is unset"):
        FollowTokens.from_settings(settings)
    monkeypatch.setenv("FOLLOW_SECRET", "short")
    with pytest.raises(ConfigError, match="5 characters long"):
        FollowTokens.from_settings(settings)
    monkeypatch.setenv("FOLLOW_SECRET", "s" * 32)
    assert FollowTokens.from_settings(settings).configured
    assert not FollowTokens.from_settings(ServerSettings()).configured
