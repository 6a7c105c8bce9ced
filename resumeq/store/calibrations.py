"""Where the calibration samples live (:mod:`resumeq.core.calibration`): per provider profile and
model, the latest :data:`~resumeq.core.calibration.KEPT_SAMPLES`, in one Redis list each, shared
by every worker and janitor. Bounded: a list lives :data:`TTL_S` after its last sample, and
at most :data:`MAX_PAIRS` pairs are kept (the least recently written go first)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import redis

from resumeq.core.calibration import KEPT_SAMPLES, Calibration, Sample
from resumeq.store import keys

log = logging.getLogger(__name__)

TTL_S = 30 * 24 * 3600
MAX_PAIRS = 1000


class Calibrations:
    def __init__(self, client: redis.Redis) -> None:
        self.redis = client
        self._warned: set[str] = set()
        self._lock = threading.Lock()

    def record(self, provider: str, model: str, sample: Sample) -> bool:
        """Keep one exact count; a sample that cannot be right is not kept (answers False).
        Best effort: Redis unreachable, it is not kept either."""
        why = sample.refusal()
        if why is not None:
            log.info("calibration sample of %s %s not kept: %s", provider, model, why)
            return False
        key = keys.calibration(provider, model)
        try:
            with self.redis.pipeline(transaction=False) as pipe:
                pipe.lpush(key, sample.encode())
                pipe.ltrim(key, 0, KEPT_SAMPLES - 1)
                pipe.expire(key, TTL_S)
                pipe.zadd(keys.CALIBRATIONS, {key: int(time.time() * 1000)})
                pipe.zcard(keys.CALIBRATIONS)
                *_, pairs = pipe.execute()
            if int(pairs) > MAX_PAIRS:
                popped: Any = self.redis.zpopmin(keys.CALIBRATIONS, int(pairs) - MAX_PAIRS)
                for stale, _ in popped:
                    self.redis.delete(_text(stale))
        except redis.RedisError as exc:
            log.debug("calibration sample of %s %s not kept: %s", provider, model, exc)
            return False
        return True

    def calibration(self, provider: str, model: str, *, margin: float) -> Calibration | None:
        """What this profile and model's exact counts say, or None (too few yet; Redis
        unreachable; corrupt samples: said once, and the profile's default stands)."""
        key = keys.calibration(provider, model)
        try:
            raw = self.redis.lrange(key, 0, KEPT_SAMPLES - 1)
        except redis.RedisError as exc:
            log.debug("calibration of %s %s not read: %s", provider, model, exc)
            return None
        try:
            samples = [Sample.decode(_text(r)) for r in raw]
        except ValueError as exc:
            with self._lock:
                first = key not in self._warned
                self._warned.add(key)
            if first:
                log.warning(
                    "calibration of %s %s is corrupt (%s): its estimates use the profile's "
                    "estimate_bytes_per_token",
                    provider,
                    model,
                    exc,
                )
            return None
        return Calibration.from_samples(samples, margin=margin)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
