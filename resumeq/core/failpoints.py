"""Failpoints: places where a chaos run kills the process on purpose, to prove that what
must follow a commit survives the committer's death (:mod:`resumeq.queue.outbox`).

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

#: Where they are: right after a commit, before its outbox is carried out; and after an
#: outbox entry was carried out, before it is marked done.
NAMES = ("after_commit", "after_follow_up")


def configure(spec: str) -> None:
    """Arm failpoints in this process, as ``RESUMEQ_FAILPOINTS`` would (tests)."""
    _POINTS.clear()
    _POINTS.update(_parse(spec))
    unknown = set(_POINTS) - set(NAMES)
    if unknown:
        raise ValueError(f"unknown failpoint(s): {', '.join(sorted(unknown))}")


def hit(name: str) -> None:
    """End the process here, with the configured probability."""
    chance = _POINTS.get(name)
    if chance and random.random() < chance:
        os._exit(137)
