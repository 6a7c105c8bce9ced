"""The audit log: every operator action — who, when, what, on which jobs — kept in Redis
(a capped stream, :data:`~resumeq.store.keys.AUDIT`), whichever face it came through (the console,
the HTTP API, the CLI)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis

from resumeq.store import decode, keys, redis_errors

#: Entries kept (about: trimmed as Redis finds it cheap).
KEEP = 100_000
#: Job ids written into one entry; a larger bulk action says how many, and lists these.
MAX_IDS = 1_000


@dataclass(frozen=True)
class Entry:
    id: str  # the stream entry id, which is also when (ms)
    at_ms: int
    who: str
    role: str
    action: str
    jobs: list[str]
    count: int
    detail: str
    via: str

    @classmethod
    def of(cls, entry_id: bytes | str, fields: dict[Any, Any]) -> Entry:
        f = {decode(k): decode(v) for k, v in fields.items()}
        entry = decode(entry_id)
        return cls(
            id=entry,
            at_ms=int(entry.partition("-")[0]),
            who=f.get("who", ""),
            role=f.get("role", ""),
            action=f.get("action", ""),
            jobs=json.loads(f.get("jobs", "[]")),
            count=int(f.get("count", "0")),
            detail=f.get("detail", ""),
            via=f.get("via", ""),
        )


def record(
    connection: redis.Redis,
    *,
    who: str,
    role: str,
    action: str,
    jobs: Sequence[str],
    detail: str = "",
    via: str,
) -> str:
    """Write one entry; answers its id."""
    fields = {
        "who": who,
        "role": role,
        "action": action,
        "jobs": json.dumps(list(jobs[:MAX_IDS])),
        "count": str(len(jobs)),
        "detail": detail,
        "via": via,
    }
    with redis_errors("audit"):
        entry = connection.xadd(keys.AUDIT, fields, maxlen=KEEP, approximate=True)  # type: ignore[arg-type]
    return decode(entry)


def page(
    connection: redis.Redis, *, before: str | None = None, limit: int = 50
) -> tuple[list[Entry], str | None]:
    """The newest entries (before the entry id ``before``), and where the next page starts
    (None: no more)."""
    top = f"({before}" if before else "+"
    with redis_errors("audit"):
        raw: Any = connection.xrevrange(keys.AUDIT, max=top, min="-", count=limit + 1)
    entries = [Entry.of(entry_id, fields) for entry_id, fields in raw]
    more = len(entries) > limit
    entries = entries[:limit]
    return entries, (entries[-1].id if more and entries else None)
