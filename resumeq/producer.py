"""Enqueueing a job: the record first (before any call), then its first attempt's RQ job."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import redis

from resumeq.models import CreateResult
from resumeq.queueing import enqueue_attempt
from resumeq.spec import JobSpec
from resumeq.store import DEFAULT_QUEUE, Store


def enqueue_job(
    store: Store,
    connection: redis.Redis,
    spec: JobSpec | Mapping[str, Any],
    *,
    queue: str = DEFAULT_QUEUE,
) -> CreateResult:
    """Validate and write the job record, then enqueue attempt 1.

    With an idempotency key a second call answers the first job and enqueues nothing. If
    the process dies between the two steps the janitor enqueues the queued job later.
    """
    result = store.create(spec, queue=queue)
    if result.created:
        enqueue_attempt(connection, result.id, queue=queue, attempt=1)
    return result
