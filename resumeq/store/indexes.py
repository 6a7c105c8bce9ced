"""The indexes of live jobs by state (how many, which, since when) and the running totals a
ledger record adds to: all jobs', each provider's (the provider series the metrics show),
each day's.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

import redis

from resumeq.store import keys
from resumeq.store.codec import decode
from resumeq.store.transport import Transport

#: The most provider series the metrics show (``resumeq stats --forget-provider`` retires one).
MAX_PROVIDER_SERIES = 200


class Indexes:
    """The state indexes and the totals, read; the provider registry, kept."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        #: Providers this process registered already (:meth:`note_provider`).
        self._providers_noted: set[str] = set()

    # -- the state indexes ---------------------------------------------------------------

    def live_counts(self) -> dict[str, int]:
        """How many jobs are in each state that is not terminal, now."""
        indexes = {
            "queued": keys.QUEUED,
            "running": keys.RUNNING,
            "stalled": keys.STALLED,
            "spilled": keys.SPILLED,
        }

        def counts(r: redis.Redis) -> list[Any]:
            with r.pipeline(transaction=False) as pipe:
                for key in indexes.values():
                    pipe.zcard(key)
                return pipe.execute()

        return dict(
            zip(indexes, (int(n) for n in self.transport.read("live_counts", counts)), strict=True)
        )

    def in_state(self, state: str, *, limit: int, offset: int = 0) -> list[str]:
        """Ids of jobs in a state that is not terminal, longest there first."""
        index = {"queued": keys.QUEUED, "running": keys.RUNNING, "stalled": keys.STALLED,
                 "spilled": keys.SPILLED}.get(state)  # fmt: skip
        if index is None:
            raise ValueError(f"no index of {state!r} jobs (queued, running, stalled, spilled)")
        ids = self.transport.read("in_state", lambda r: r.zrange(index, offset, offset + limit - 1))
        return [decode(i) for i in ids]

    def queued_before(self, age_ms: int, *, limit: int = 200) -> list[str]:
        """Ids of jobs queued at least ``age_ms`` ago (Redis server time), oldest first."""
        return self.transport.before(keys.QUEUED, age_ms, limit, "queued_before")

    # -- the totals and the provider series ------------------------------------------------

    def totals(self, provider: str | None = None, *, day: str | None = None) -> dict[str, int]:
        """The running totals (all jobs', or one provider's), or those of the ledger records
        written on ``day`` (``YYYY-MM-DD``, UTC; kept 40 days)."""
        if day is not None:
            key = keys.totals_day(day)
        else:
            key = keys.totals_of(provider) if provider else keys.TOTALS
        raw = self.transport.read("totals", lambda r: r.hgetall(key))
        return {decode(k): int(v) for k, v in raw.items()}

    def note_provider(self, entry: Mapping[str, Any] | None) -> None:
        """Register the provider a ledger record is about to count for, once per process,
        before the record's totals are written: the metrics list every provider with
        totals (a registered one with none yet shows zeros)."""
        provider = (entry or {}).get("provider")
        if not provider or provider in self._providers_noted:
            return
        now_ms = int(time.time() * 1000)
        self.transport.read(
            "providers", lambda r: r.zadd(keys.PROVIDERS, {provider: now_ms}, nx=True)
        )
        self._providers_noted.add(provider)

    def providers(self, limit: int = MAX_PROVIDER_SERIES) -> list[str]:
        """The provider profiles with running totals, by name: the first ``limit`` of them
        to have been counted. A store written before the registry existed is registered
        from its totals' keys, once."""
        names = self.transport.read("providers", lambda r: r.zrange(keys.PROVIDERS, 0, limit - 1))
        if not names:
            prefix = keys.totals_of("x")[:-1]

            def seed(r: redis.Redis) -> list[Any]:
                found = [
                    decode(k)[len(prefix) :] for k in r.scan_iter(match=f"{prefix}*", count=500)
                ]
                if found:
                    r.zadd(keys.PROVIDERS, dict.fromkeys(found, 0), nx=True)
                return found[:limit]

            names = self.transport.read("providers", seed)
        return sorted(decode(n) for n in names)

    def forget_provider(self, provider: str) -> bool:
        """Retire a provider's series: its running totals and its place in the registry
        (the totals of all providers together keep what it counted). Answers whether it
        was registered."""
        key = keys.totals_of(provider)

        def forget(r: redis.Redis) -> Any:
            with r.pipeline() as pipe:
                pipe.zrem(keys.PROVIDERS, provider)
                pipe.delete(key)
                return pipe.execute()

        removed, _ = self.transport.read("forget_provider", forget)
        self._providers_noted.discard(provider)
        return bool(removed)


def totals_keys(entry: Mapping[str, Any] | None) -> list[str]:
    """The running totals a ledger record adds to: all jobs', its provider's, and today's
    (UTC, by this process's clock: a record written at midnight may count for either day)."""
    provider = (entry or {}).get("provider")
    return [
        keys.TOTALS,
        keys.totals_of(provider) if provider else keys.TOTALS,
        keys.totals_day(time.strftime("%Y-%m-%d", time.gmtime())),
    ]


def totals_json(entry: Mapping[str, Any] | None) -> str:
    """What a ledger record adds to the totals; a partial record (a tool's, a test's)
    counts as an attempt and nothing more."""
    if entry is None:
        return ""
    from resumeq.core.ledger import AttemptRecord  # noqa: PLC0415 - the writers' model, not a reader's

    try:
        deltas = AttemptRecord.model_validate(entry).totals()
    except ValueError:
        deltas = {"attempts": 1}
    return json.dumps(deltas, separators=(",", ":"))
