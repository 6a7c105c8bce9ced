"""After-completion hooks (SPEC §11): effects that change the world never run inside the
stream. A job names hooks registered on the worker side — never code or URLs from the
producer — and each runs as its own RQ job once the text is final, with an idempotency key
derived from the job id, so a hook that runs twice is recognised downstream.

Register hooks in a module the workers import (``[worker] hook_modules``)::

    from resumeq.hooks import hook

    @hook("notify")
    def notify(call: HookCall) -> None:
        send_email(call.text, idempotency_key=call.idempotency_key)
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import redis
from rq.exceptions import DuplicateJobError

from resumeq.context import context
from resumeq.errors import ConfigError
from resumeq.models import JobRecord, JobState
from resumeq.queueing import FAILURE_TTL_S, HOOK_FUNC, RESULT_TTL_S, hook_rq_id, rq_queue

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HookCall:
    job_id: str
    hook: str
    #: Stable across retries of this hook for this job: hand it to the downstream API.
    idempotency_key: str
    record: JobRecord
    text: str


HookFunc = Callable[[HookCall], object]
_REGISTRY: dict[str, HookFunc] = {}


def hook(name: str) -> Callable[[HookFunc], HookFunc]:
    """Register ``fn`` as the hook ``name``."""

    def register(fn: HookFunc) -> HookFunc:
        if name in _REGISTRY and _REGISTRY[name] is not fn:
            raise ConfigError(f"hook {name!r} is registered twice")
        _REGISTRY[name] = fn
        return fn

    return register


def registered() -> dict[str, HookFunc]:
    return dict(_REGISTRY)


def import_hook_modules(modules: Iterable[str]) -> None:
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ConfigError(f"cannot import hook module {module!r}: {exc}") from None


def idempotency_key(job_id: str, name: str) -> str:
    return f"{job_id}:{name}"


def enqueue_hooks(connection: redis.Redis, record: JobRecord, *, queue: str | None = None) -> int:
    """Enqueue one RQ job per hook of a done job (on ``queue``, default the job's); answers
    how many were new. A hook's RQ job id is unique: enqueueing again adds nothing."""
    q = rq_queue(queue or record.queue, connection)
    new = 0
    for name in record.spec.hooks:
        try:
            q.enqueue(
                HOOK_FUNC,
                record.id,
                name,
                job_id=hook_rq_id(record.id, name),
                description=f"hook {name} of {record.id}",
                result_ttl=RESULT_TTL_S,
                failure_ttl=FAILURE_TTL_S,
                unique=True,
            )
        except DuplicateJobError:
            continue
        new += 1
    return new


def run_hook(job_id: str, name: str) -> str:
    """The RQ job of one hook (runs in a resumeq worker)."""
    ctx = context()
    import_hook_modules(ctx.settings.file.worker.hook_modules)
    fn = _REGISTRY.get(name)
    if fn is None:
        raise ConfigError(f"no hook named {name!r} is registered on this worker")
    record = ctx.store.get(job_id)
    if record.state is not JobState.DONE:
        raise ConfigError(f"job {job_id} is {record.state}, hooks run only on done jobs")
    call = HookCall(job_id, name, idempotency_key(job_id, name), record, ctx.store.text(job_id))
    fn(call)
    log.info("hook %s ran for job %s", name, job_id)
    return "ok"
