"""The values that go to the store's scripts and come back: arguments checked before
anything is sent (queue names, owner names, counts), replies decoded from the bytes-mode
client, a job hash read as its :class:`~resumeq.core.models.JobRecord`, and the compact form
of an ended job's text.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Mapping
from typing import Any

from resumeq.core.errors import CorruptRecord
from resumeq.core.models import JobRecord

#: A queue name (the HTTP API's OpenAPI document states the same).
QUEUE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$"
_QUEUE_RE = re.compile(QUEUE_PATTERN)
_OWNER_RE = re.compile(r"^[A-Za-z0-9_.@-]{1,100}$")


def decode(value: Any) -> str:
    """A reply element as text (the store uses a bytes-mode client, like RQ)."""
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


#: An ended job's text, once its events are trimmed, is stored compressed (zlib) after
#: these two bytes — which no UTF-8 text starts with (0xFF never occurs in UTF-8).
PACKED_TEXT = b"\xffz"


def decode_text(raw: Any) -> str:
    """A text key's value as text, whether stored as written or compressed."""
    if raw is None:
        return ""
    if isinstance(raw, bytes) and raw.startswith(PACKED_TEXT):
        return zlib.decompress(raw[len(PACKED_TEXT) :]).decode("utf-8")
    return decode(raw)


def pack_text(raw: bytes) -> bytes | None:
    """The compressed form of a text key's value, if it is smaller."""
    if not raw or raw.startswith(PACKED_TEXT):
        return None
    packed = PACKED_TEXT + zlib.compress(raw, 6)
    return packed if len(packed) < len(raw) else None


def pairs(flat: list[Any]) -> dict[str, str]:
    """A flat reply ``[field, value, …]`` as a dict of text."""
    it = iter(decode(v) for v in flat)
    return dict(zip(it, it, strict=True))


def fields_of(raw: Mapping[Any, Any]) -> dict[str, str]:
    """A hash read by the bytes-mode client, as text."""
    return {decode(k): decode(v) for k, v in raw.items()}


def job_record(job_id: str, fields: dict[str, str], *, check_spec: bool = False) -> JobRecord:
    """The record of a job hash, or :class:`~resumeq.core.errors.CorruptRecord`. Its spec is
    validated when first used, or now with ``check_spec`` (what a worker or a janitor is
    about to act on: a spec it cannot read fails the job there, not in its attempt)."""
    try:
        record = JobRecord.from_hash(fields)
    except ValueError as exc:
        raise CorruptRecord(f"job {job_id}: corrupt record: {exc}", job_id=job_id) from None
    if check_spec:
        record.spec  # noqa: B018 - validated now: CorruptRecord here
    return record


def check_queue(name: str) -> str:
    if not _QUEUE_RE.fullmatch(name):
        raise ValueError(f"malformed queue name {name!r}")
    return name


def check_owner(name: str) -> str:
    if not _OWNER_RE.fullmatch(name):
        raise ValueError(f"malformed worker or janitor id {name!r}")
    return name


def ledger_json(entry: Mapping[str, Any] | None) -> str:
    return "" if entry is None else json.dumps(dict(entry), separators=(",", ":"))


def optional(value: int | None) -> str | int:
    return "" if value is None else value


def positive(value: int, name: str) -> int:
    if value <= 0:
        raise ValueError(f"{name} must be > 0, got {value}")
    return value


def non_negative(value: int, name: str) -> int:
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value
