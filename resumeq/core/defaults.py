"""What resumeq assumes where nothing is configured, with no model behind it.

A command that only reads or writes Redis (``resumeq status``, ``cancel``, ``enqueue``)
without a config file builds none of the settings models: it resolves the Redis URL here
and hands the store these defaults (tests/test_imports.py holds it). The models of
:mod:`resumeq.core.settings` and :mod:`resumeq.core.spec` take their defaults from here, and
tests/test_settings.py holds the two equal.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

DEFAULT_REDIS_URL = "redis://localhost:6379/0"


@dataclass(frozen=True)
class StoreDefaults:
    """``[store]`` unconfigured: :class:`~resumeq.core.settings.StoreSettings`'s defaults."""

    retention_s: int = 7 * 24 * 3600
    events_grace_s: float = 60.0
    durability: Literal["primary", "replica"] = "primary"
    replica_timeout_ms: int = 1000


@dataclass(frozen=True)
class LimitDefaults:
    """``[limits]`` unconfigured: :class:`~resumeq.core.spec.Limits`'s defaults."""

    max_messages: int = 256
    max_prompt_bytes: int = 1_048_576
    max_budget_tokens: int = 65_536
    max_metadata_bytes: int = 4_096
    max_hooks: int = 8
    #: OpenAI's limit on the tools of one request.
    max_tools: int = 128
    max_schema_bytes: int = 65_536


STORE_DEFAULTS = StoreDefaults()
LIMIT_DEFAULTS = LimitDefaults()


def redis_url(explicit: str | None = None) -> str:
    """The Redis URL: ``explicit``, else ``RESUMEQ_REDIS_URL``, else the default (a
    variable set to the empty string counts as unset)."""
    return explicit or os.environ.get("RESUMEQ_REDIS_URL") or DEFAULT_REDIS_URL


def config_path(explicit: Path | None = None) -> Path | None:
    """The config file: ``explicit``, else the one ``RESUMEQ_CONFIG`` names, else none."""
    value = os.environ.get("RESUMEQ_CONFIG", "")
    return explicit or (Path(value) if value else None)
