"""Seeded random faults: each generation request is cut with a probability, at a uniformly
random token of what it would send (``POST /_fake/config {"chaos": {...}}``).

A queued fault (``/_fake/faults``) always fires and cannot say "this request is not cut"; chaos
can. Decisions come from a seeded RNG in request order. With ``scope = "global"`` one RNG
serves every request as it arrives. With ``scope = "conversation"`` each conversation (the
seed of its canonical text, shared by a job's fresh request, retries and continuations) has
its own RNG, so the n-th request of a conversation gets the same decision whatever order
concurrent workers send requests in: two runs of the same jobs see the same fault plan.
"""

from __future__ import annotations

import hashlib
import random
import threading
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from resumeq.fake.faults import Fault, FaultKind


class ChaosConfig(BaseModel):
    """What ``/_fake/config`` takes under ``"chaos"`` (``null`` turns chaos off)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    probability: float = Field(ge=0, le=1)
    kinds: tuple[FaultKind, ...] = Field(default=("disconnect",), min_length=1)
    seed: int = 0
    scope: Literal["global", "conversation"] = "global"
    #: For ``status`` faults.
    status: int = Field(default=429, ge=400, le=599)
    retry_after: float | None = Field(default=None, ge=0)
    #: For ``stall`` faults.
    seconds: float = Field(default=30.0, ge=0)


class Chaos:
    """The RNGs behind one chaos configuration."""

    def __init__(self, config: ChaosConfig) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._global = random.Random(config.seed)
        self._per_conversation: dict[bytes, random.Random] = {}
        self.drawn = 0
        self.faults = 0

    def _rng(self, conversation: bytes) -> random.Random:
        if self.config.scope == "global":
            return self._global
        rng = self._per_conversation.get(conversation)
        if rng is None:
            digest = hashlib.sha256(self.config.seed.to_bytes(8, "little", signed=True))
            digest.update(conversation)
            rng = random.Random(digest.digest())
            self._per_conversation[conversation] = rng
        return rng

    def draw(self, conversation: bytes, tokens: int) -> Fault | None:
        """The fault for the next request of ``conversation`` that would send ``tokens``
        tokens, or None. A stream fault fires after 0 to ``tokens - 1`` tokens."""
        c = self.config
        with self._lock:
            rng = self._rng(conversation)
            self.drawn += 1
            # Every decision draws the same three numbers, so the sequence never shifts.
            cut, kind_pick, position = rng.random(), rng.random(), rng.random()
            if cut >= c.probability:
                return None
            self.faults += 1
        kind = c.kinds[int(kind_pick * len(c.kinds))]
        return Fault(
            kind=kind,
            after_tokens=int(position * tokens),
            status=c.status,
            retry_after=c.retry_after,
            seconds=c.seconds,
        )

    def describe(self) -> dict[str, object]:
        with self._lock:
            return {**self.config.model_dump(), "drawn": self.drawn, "faults": self.faults}
