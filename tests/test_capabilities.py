"""What a restricted Redis refuses, asked as each process asks it at start."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from resumeq.store.capabilities import is_refusal, refused, server_version, warning
from resumeq.testing import RedisServer


@pytest.fixture
def app_user(redis_client: redis.Redis, redis_server: RedisServer) -> Iterator[str]:
    """A user with the usual application ACL: everything but @dangerous."""
    redis_client.acl_setuser(
        "probe-app",
        enabled=True,
        passwords=["+probe-secret"],
        categories=["+@all", "-@dangerous"],
        keys=["resumeq:*", "rq:*"],
        channels=["rq:pubsub:*"],
        reset=True,
    )
    try:
        yield f"redis://probe-app:probe-secret@127.0.0.1:{redis_server.port}/0"
    finally:
        redis_client.acl_deluser("probe-app")


def test_the_usual_acl_refuses_list_and_unblock_not_setname_or_id(app_user: str) -> None:
    found = refused(app_user, ["setname", "id", "list", "unblock"])
    assert [r.command for r in found] == ["CLIENT LIST", "CLIENT UNBLOCK"]
    assert all(r.how == "denied" and "no permissions" in r.reason for r in found)
    line = warning("serve", found, "polling")
    assert line.startswith("resumeq serve: warning: Redis refuses CLIENT LIST and CLIENT UNBLOCK")
    assert line.endswith("allow it with the ACL rule +client|list +client|unblock")
    assert "\n" not in line


def test_an_unrestricted_redis_refuses_nothing(redis_server: RedisServer) -> None:
    assert refused(redis_server.url, ["setname", "id", "list", "unblock"]) == []


def test_the_version_comes_from_hello_where_info_is_denied(app_user: str) -> None:
    client = redis.Redis.from_url(app_user)
    try:
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.info("server")
        version = server_version(client)
        assert version is not None and version >= (6, 0, 0)
    finally:
        client.close()


def test_what_is_a_refusal_and_what_is_not() -> None:
    assert is_refusal(redis.exceptions.NoPermissionError("this user has no permissions"))
    assert is_refusal(redis.ResponseError("unknown command 'CLIENT', with args beginning"))
    assert is_refusal(redis.ResponseError("ERR unknown subcommand 'UNBLOCK'"))
    assert not is_refusal(redis.ResponseError("WRONGTYPE Operation against a key"))
    assert not is_refusal(redis.ConnectionError("Connection refused"))
