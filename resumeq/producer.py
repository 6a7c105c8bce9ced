"""Enqueueing a job: the record first (before any call), with its first attempt in the
outbox; then the attempt's RQ job."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import redis

from resumeq import outbox
from resumeq.models import CreateResult
from resumeq.spec import JobSpec
from resumeq.store import DEFAULT_QUEUE, Store


def enqueue_job(
    store: Store,
    connection: redis.Redis,
    spec: JobSpec | Mapping[str, Any],
    *,
    queue: str = DEFAULT_QUEUE,
    owner: str | None = None,
    request_hash: str | None = None,
) -> CreateResult:
    """Validate and write the job record, then enqueue attempt 1.

    With an idempotency key a second call answers the first job (and makes sure its first
    attempt was enqueued). If the process dies between the two steps, the janitor carries
    the outbox out.
    """
    result = store.create(spec, queue=queue, owner=owner, request_hash=request_hash)
    outbox.complete(store, connection, result.id)
    return result
