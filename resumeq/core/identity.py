"""Who a worker process is: one name in RQ, in its Redis connections' names and in its lease
tokens, unique per incarnation (SPEC §21).

``HOST-PID-NONCE``: the hostname first, for people reading ``rq info``; then the process id;
then a random nonce drawn at each start. A container restarted after a kill has the same
hostname and PID 1, two containers with host networking may share both, and pod names that
differ past the first characters kept would read the same: the nonce keeps every one of
them apart (RQ refuses a name whose registration still lives, for minutes after a kill).
A hostname longer than :data:`HOST_CHARS` is cut, with a digest of the whole of it, so a
cut name still says which host it was. No ``:`` (lease tokens are ``attempt:worker:nonce``)
and nothing but ``A-Z a-z 0-9 _ . - ~``.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import socket

#: The most characters of the hostname a name keeps.
HOST_CHARS = 40
#: A name's nonce: this many characters of lowercase base32 (40 bits).
NONCE_CHARS = 8
_NONCE_ALPHABET = "abcdefghijklmnopqrstuvwxyz234567"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def process_name(
    hostname: str | None = None, pid: int | None = None, nonce: str | None = None
) -> str:
    """This process's name (or one for the host, PID and nonce given)."""
    host = readable_host(socket.gethostname() if hostname is None else hostname)
    return f"{host}-{os.getpid() if pid is None else pid}-{nonce or new_nonce()}"


def readable_host(hostname: str) -> str:
    """The hostname as a name shows it: safe characters only, cut past :data:`HOST_CHARS`
    with a digest of the whole (``~`` and six hex digits)."""
    host = _UNSAFE.sub("-", hostname).strip("-.") or "host"
    if len(host) <= HOST_CHARS:
        return host
    digest = hashlib.sha256(hostname.encode("utf-8", "surrogatepass")).hexdigest()[:6]
    return f"{host[: HOST_CHARS - 7]}~{digest}"


def new_nonce() -> str:
    return "".join(secrets.choice(_NONCE_ALPHABET) for _ in range(NONCE_CHARS))


def pid_of(name: str | None) -> int | None:
    """The process id a worker's name carries (``HOST-PID-NONCE``), or None."""
    parts = (name or "").rsplit("-", 2)
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None
