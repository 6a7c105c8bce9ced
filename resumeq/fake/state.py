"""Everything one fake provider remembers between requests."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from resumeq.fake.faults import FaultQueue
from resumeq.fake.journal import Journal
from resumeq.fake.prompt import PromptCache


@dataclass
class FakeState:
    completion_tokens: int | None = None
    token_delay_ms: float = 0.0
    faults: FaultQueue = field(default_factory=FaultQueue)
    journal: Journal = field(default_factory=Journal)
    cache: PromptCache = field(default_factory=PromptCache)
    stopped: threading.Event = field(default_factory=threading.Event)

    def reset(self) -> None:
        """Clear faults, journal and prompt cache (the configuration stays)."""
        self.faults.clear()
        self.journal.clear()
        self.cache.clear()
