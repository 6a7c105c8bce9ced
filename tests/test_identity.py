"""Worker names: unique per incarnation, readable, safe in lease tokens (SPEC §21)."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from resumeq.core import names
from resumeq.core.identity import HOST_CHARS, pid_of, process_name, readable_host
from resumeq.core.models import holder_pid

SAFE = re.compile(r"^[A-Za-z0-9_.~-]+$")


def test_a_restart_with_the_same_hostname_and_pid_is_another_name() -> None:
    # A container restarted after a kill: the same hostname, PID 1.
    names = {process_name("vm-1", 1) for _ in range(1000)}
    assert len(names) == 1000
    assert all(n.startswith("vm-1-1-") for n in names)


def test_hostnames_that_share_their_first_characters_stay_apart_and_readable() -> None:
    stem = "checkout-api-deployment-7f9c8d6b5-production-eu-west-1-canary-"
    a, b = readable_host(stem + "a"), readable_host(stem + "b")
    assert a != b and len(a) == len(b) == HOST_CHARS
    assert a.startswith(stem[: HOST_CHARS - 7]) and "~" in a
    assert readable_host("web-1") == "web-1"


@given(st.text(max_size=300), st.integers(min_value=0, max_value=2**22))
def test_any_hostname_makes_a_name_fit_for_rq_connections_and_lease_tokens(
    hostname: str, pid: int
) -> None:
    name = process_name(hostname, pid)
    assert SAFE.match(name) and ":" not in name
    assert names.worker_client_name(name).endswith(name)
    assert pid_of(name) == pid
    assert holder_pid(f"3:{name}:nonce") == pid
    assert len(name) <= HOST_CHARS + 1 + 7 + 1 + 8


def test_pid_of_what_is_not_a_name() -> None:
    assert pid_of(None) is None and pid_of("") is None and pid_of("host") is None
    assert pid_of("host-x-abc") is None
