"""Everything that speaks to Redis: the keys, the connections, the Lua scripts and the fenced
job store over them (SPEC §2 to §4).

``from resumeq.store import Store`` is the store every other layer holds. Its names load
with it, on first use: a command that only needs :mod:`resumeq.store.keys` does not pay for
the store's models.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from resumeq.store.facade import (
        DEFAULT_QUEUE,
        PACKED_TEXT,
        QUEUE_PATTERN,
        RETRY_PAUSE_S,
        SPILL_QUEUE,
        ReapResult,
        ResponseToStop,
        Store,
        check_queue,
        decode,
        decode_text,
        pack_text,
        redis_errors,
        request_id,
    )

__all__ = [
    "DEFAULT_QUEUE",
    "PACKED_TEXT",
    "QUEUE_PATTERN",
    "RETRY_PAUSE_S",
    "SPILL_QUEUE",
    "ReapResult",
    "ResponseToStop",
    "Store",
    "check_queue",
    "decode",
    "decode_text",
    "pack_text",
    "redis_errors",
    "request_id",
]
_FROM_FACADE = frozenset(__all__)


def __getattr__(name: str) -> Any:
    if name in _FROM_FACADE:
        return getattr(importlib.import_module("resumeq.store.facade"), name)
    raise AttributeError(f"module 'resumeq.store' has no attribute {name!r}")
