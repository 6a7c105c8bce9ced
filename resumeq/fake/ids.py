"""Ids as the providers make them: a prefix (``chatcmpl-``, ``msg_``, ``call_``, ``toolu_``,
``fc_``, ``resp_``, ...) and 24 random hex digits, fresh every time."""

from __future__ import annotations

import uuid


def new_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:24]
