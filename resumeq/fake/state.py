"""Everything one fake provider remembers between requests."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from resumeq.fake.background import BackgroundResponses
from resumeq.fake.chaos import Chaos
from resumeq.fake.cpu import CpuMeter
from resumeq.fake.engine import Engine
from resumeq.fake.faults import FaultQueue
from resumeq.fake.journal import Journal
from resumeq.fake.prompt import PromptCache


@dataclass
class FakeState:
    completion_tokens: int | None = None
    token_delay_ms: float = 0.0
    engine: Engine = field(default_factory=Engine)
    faults: FaultQueue = field(default_factory=FaultQueue)
    journal: Journal = field(default_factory=Journal)
    cache: PromptCache = field(default_factory=PromptCache)
    stopped: threading.Event = field(default_factory=threading.Event)
    #: Seeded random faults, applied when no queued fault is pending.
    chaos: Chaos | None = None
    #: The CPU time of the provider's threads, over every start (a reset keeps it).
    cpu: CpuMeter = field(default_factory=CpuMeter)
    #: Background responses of the Responses wire, generating whoever reads them.
    background: BackgroundResponses = field(default_factory=BackgroundResponses)

    def reset(self) -> None:
        """Clear faults, chaos, journal and prompt cache (the rest of the configuration
        stays)."""
        self.faults.clear()
        self.background.clear()
        self.chaos = None
        self.journal.clear()
        self.cache.clear()
