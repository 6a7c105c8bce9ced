"""The store's Lua scripts, registered once per Redis connection.

Each script lives in its own ``.lua`` file with a KEYS/ARGV header; ``_prelude.lua`` is
prepended to each so the shared checks (fencing, revision, retention) are written once.
Scripts run by EVALSHA and are loaded again transparently after a ``SCRIPT FLUSH`` or a
Redis restart (redis-py's ``Script`` does that).
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources
from typing import Any

import redis
from redis.client import Pipeline
from redis.commands.core import Script

NAMES = (
    "create",
    "acquire",
    "renew",
    "flush",
    "response",
    "finish",
    "release",
    "reap",
    "cancel",
    "requeue",
    "drop",
    "fail",
    "purge",
    "outbox_done",
    "outbox_set",
    "hook_claim",
    "hook_renew",
    "hook_done",
    "ledger_append",
    "ledger_amend",
    "trim_events",
    "durable",
)


def _source(name: str) -> str:
    return resources.files(__package__).joinpath(f"{name}.lua").read_text(encoding="utf-8")


_PRELUDE = _source("_prelude")
SOURCES = {name: _PRELUDE + _source(name) for name in NAMES}


class Scripts:
    """The registered scripts of one Redis client."""

    def __init__(self, client: redis.Redis) -> None:
        self._scripts: dict[str, Script] = {
            name: client.register_script(src) for name, src in SOURCES.items()
        }

    def queue(
        self, pipe: Pipeline, name: str, keys: list[str], args: Sequence[str | int | bytes]
    ) -> None:
        """Add a run of script ``name`` to ``pipe`` (its reply comes with the others')."""
        self._scripts[name](keys=keys, args=args, client=pipe)

    def run(self, name: str, keys: list[str], args: Sequence[str | int | bytes]) -> list[Any]:
        """Run script ``name``; answers its reply table (bytes elements)."""
        reply = self._scripts[name](keys=keys, args=args)
        if not isinstance(reply, list) or not reply:
            raise TypeError(f"script {name} answered {reply!r}, not a status table")
        return reply
