"""Running attempts in process: the worker's code path (the attempt RQ runs), a real
redis-server, and a provider over HTTP — without forking worker processes."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import httpx

from resumeq.core.models import JobRecord
from resumeq.core.settings import ConfigFile, Settings
from resumeq.worker.attempt import AttemptRunner
from resumeq.worker.context import HttpClients, build_context

ENDED = {"done", "failed", "abandoned", "cancelled", "dropped", "spilled"}


@contextmanager
def attempt_runner(
    redis_url: str,
    providers: Mapping[str, Mapping[str, Any]],
    *,
    http: httpx.Client | None = None,
    **worker: Any,
) -> Iterator[AttemptRunner]:
    """An :class:`AttemptRunner` over a context built like a worker's (``http`` replaces the
    HTTP client, e.g. to answer some endpoints by hand); closed afterwards."""
    settings = Settings(
        redis_url=redis_url,
        file=ConfigFile.model_validate(
            {"providers": providers, "worker": {"flush_tokens": 8, **worker}}
        ),
    )
    ctx = build_context(settings)
    if http is not None:
        ctx.http.close()
        ctx.http = HttpClients.only(http)
    try:
        yield AttemptRunner(ctx)
    finally:
        ctx.close()


def run_to_rest(runner: AttemptRunner, job_id: str, *, max_attempts: int = 6) -> JobRecord:
    """Run the job's attempts one after the other until it ends or spills (the next
    attempts RQ was told about are run here instead)."""
    store = runner.store
    for _ in range(max_attempts):
        runner.run(job_id)
        record = store.get(job_id)
        if record.state.value in ENDED:
            return record
    raise AssertionError(f"job {job_id} still {store.get(job_id).state} after {max_attempts}")
