"""The janitor: finds jobs whose worker died and applies their exit, carries out follow-ups
nobody finished, promotes due attempts and keeps RQ's registries clean (SPEC §17)."""

from resumeq.janitor.steps import SweepReport
from resumeq.janitor.sweep import Janitor

__all__ = ["Janitor", "SweepReport"]
