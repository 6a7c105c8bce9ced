"""What a restricted Redis allows of the commands resumeq can do without (SPEC §21).

Managed Redis services often rename or disable ``CLIENT``, and the usual application ACL
(``+@all -@dangerous``) denies ``CLIENT LIST``, ``KILL`` and ``UNBLOCK`` (not ``SETNAME`` or
``ID``). Nothing resumeq promises depends on them; each only makes something faster:

- ``CLIENT SETNAME`` (workers): every connection of a worker carries its name, so that a
  janitor sees the worker die. Without it the connections go unnamed and a dead worker's
  jobs go on when their leases expire.
- ``CLIENT LIST`` (janitors): the look at the connections that finds dead workers in about a
  second. Without it, the leases.
- ``CLIENT ID`` and ``CLIENT UNBLOCK`` (``resumeq serve``): a newly followed job joins the
  blocking read of its reader at once. Without them the reads block for a tenth of a second
  at a time (polling), and a new follower waits for the running one.

Each process asks once, at start, for the commands it uses (:func:`refused`), and says in
one WARNING line what it falls back to and the ACL rule that would restore it
(:func:`warning`). Renamed or denied later, a command is met as a refusal at run time
(:func:`is_refusal`) and handled the same way.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import redis

from resumeq.store import keys
from resumeq.store.connection import connect

Probe = Literal["setname", "id", "list", "unblock"]

#: Each command: how it is spelled, the ACL rule that allows it, and a harmless call of it
#: (a probe connection is named, ``CLIENT LIST`` is asked as a janitor asks it, and
#: ``CLIENT UNBLOCK 0`` unblocks nobody).
COMMANDS: dict[Probe, tuple[str, str, Callable[[redis.Redis], Any]]] = {
    "setname": (
        "CLIENT SETNAME",
        "+client|setname",
        lambda r: r.client_setname(keys.PROBE_CLIENT_NAME),
    ),
    "id": ("CLIENT ID", "+client|id", lambda r: r.client_id()),
    "list": (
        "CLIENT LIST",
        "+client|list",
        lambda r: r.client_list(_type="normal"),
    ),
    "unblock": (
        "CLIENT UNBLOCK",
        "+client|unblock",
        lambda r: r.client_unblock(0),
    ),
}


@dataclass(frozen=True)
class Refusal:
    """A command Redis refused: which, the rule that would allow it, Redis's words, and
    how: ``denied`` by the ACL, ``unknown`` (renamed or disabled), or ``failed`` (answered
    with another error: a Redis-compatible server that does not implement it)."""

    probe: Probe
    command: str
    rule: str
    reason: str
    how: Literal["denied", "unknown", "failed"]


def is_refusal(exc: BaseException) -> bool:
    """Whether ``exc`` is Redis refusing a command (denied by the ACL, or unknown: renamed
    or disabled), not failing to answer."""
    return _how(exc) in ("denied", "unknown")


def _how(exc: BaseException) -> Literal["denied", "unknown", "failed", "none"]:
    if not isinstance(exc, redis.ResponseError):
        return "none"
    text = str(exc).lower()
    if isinstance(exc, redis.exceptions.NoPermissionError) or "noperm" in text:
        return "denied"
    if "unknown command" in text or "unknown subcommand" in text:
        return "unknown"
    return "failed"


def refusal(probe: Probe, exc: BaseException) -> Refusal:
    command, rule, _ = COMMANDS[probe]
    how = _how(exc)
    reason = " ".join(str(exc).split())[:160]
    return Refusal(probe, command, rule, reason, "failed" if how == "none" else how)


def refused(url: str, probes: Sequence[Probe], **options: Any) -> list[Refusal]:
    """Which of ``probes`` the Redis at ``url`` refuses, asked on a connection of its own
    (closed after). Raises redis-py's error when Redis does not answer at all."""
    options.setdefault("socket_timeout", 5.0)
    options.setdefault("socket_connect_timeout", 5.0)
    client = connect(url, pool_size=1, **options)
    out: list[Refusal] = []
    try:
        for probe in probes:
            try:
                COMMANDS[probe][2](client)
            except redis.ResponseError as exc:  # whatever the error: it cannot be used
                out.append(refusal(probe, exc))
    finally:
        with contextlib.suppress(redis.RedisError):
            client.close()
    return out


def warning(process: str, refusals: Sequence[Refusal], consequence: str) -> str:
    """The one line a process says at start: what Redis refuses, what it falls back to, and
    what would restore it."""
    commands = " and ".join(r.command for r in refusals)
    rules = " ".join(r.rule for r in refusals)
    first = refusals[0]
    if first.how == "unknown":
        said = f"Redis does not know {commands} (renamed or disabled: {first.reason})"
        restore = f"restore CLIENT, and allow it with the ACL rule {rules} if an ACL applies"
    elif first.how == "denied":
        said = f"Redis refuses {commands} ({first.reason})"
        restore = f"allow it with the ACL rule {rules}"
    else:
        said = f"Redis answers {commands} with an error ({first.reason})"
        restore = f"a Redis that implements it, allowing it (ACL rule {rules}), restores it"
    return f"resumeq {process}: warning: {said}: {consequence}; {restore}"


def server_version(client: redis.Redis) -> tuple[int, int, int] | None:
    """The server's version, from ``INFO`` or, where the ACL denies it (it is @dangerous),
    from ``HELLO``; None when neither answers (``INFO`` unknown: fakeredis)."""
    text: str | None = None
    try:
        text = str(client.info("server").get("redis_version", ""))
    except redis.exceptions.NoPermissionError:
        # Denied, not unknown: a Redis (a server without INFO may not know HELLO either,
        # or answer it in a way that leaves the connection speaking another protocol).
        with contextlib.suppress(redis.ResponseError):
            hello: Any = client.execute_command("HELLO", "2")  # type: ignore[no-untyped-call]
            fields = dict(zip(hello[::2], hello[1::2], strict=False))
            raw = fields.get(b"version", fields.get("version", b""))
            text = raw.decode() if isinstance(raw, bytes) else str(raw)
    except redis.ResponseError:
        return None
    parts = [int(p) for p in (text or "").split(".")[:3] if p.isdigit()]
    if not parts:
        return None
    major, minor, patch = [*parts, 0, 0][:3]
    return major, minor, patch
