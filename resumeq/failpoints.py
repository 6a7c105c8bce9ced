"""Failpoints: places where a chaos run kills the process on purpose, to prove that what
must follow a commit survives the committer's death (:mod:`resumeq.outbox`).

Off unless ``RESUMEQ_FAILPOINTS`` names them, as ``name=probability`` pairs separated by
commas (``after_commit=0.2``). A hit failpoint ends the process at once, as SIGKILL would:
no cleanup, no flush.
"""

from __future__ import annotations

import os
import random


def _parse(raw: str) -> dict[str, float]:
    points: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in raw.split(","))):
        name, _, value = item.partition("=")
        points[name.strip()] = float(value or 1.0)
    return points


_POINTS = _parse(os.environ.get("RESUMEQ_FAILPOINTS", ""))


def hit(name: str) -> None:
    """End the process here, with the configured probability."""
    chance = _POINTS.get(name)
    if chance and random.random() < chance:
        os._exit(137)
