"""Everything that speaks to Redis: the keys, the connections, the Lua scripts and the fenced
job store over them (SPEC §2 to §4).

``from resumeq.store import Store`` is the store every other layer holds (its pieces, one
module per concern, are named in :mod:`resumeq.store.facade`). Its names load with it, on
first use: a command that only needs :mod:`resumeq.store.keys` does not pay for the store's
models.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from resumeq.store.codec import (
        PACKED_TEXT,
        QUEUE_PATTERN,
        check_queue,
        decode,
        decode_text,
        pack_text,
    )
    from resumeq.store.facade import Store
    from resumeq.store.keys import DEFAULT_QUEUE, SPILL_QUEUE
    from resumeq.store.leases import ReapResult
    from resumeq.store.responses import ResponseToStop
    from resumeq.store.transport import RETRY_PAUSE_S, redis_errors, request_id

#: Each name, and the module it is defined in.
_HOMES = {
    "DEFAULT_QUEUE": "keys",
    "PACKED_TEXT": "codec",
    "QUEUE_PATTERN": "codec",
    "RETRY_PAUSE_S": "transport",
    "SPILL_QUEUE": "keys",
    "ReapResult": "leases",
    "ResponseToStop": "responses",
    "Store": "facade",
    "check_queue": "codec",
    "decode": "codec",
    "decode_text": "codec",
    "pack_text": "codec",
    "redis_errors": "transport",
    "request_id": "transport",
}
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


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(f"resumeq.store.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'resumeq.store' has no attribute {name!r}")
