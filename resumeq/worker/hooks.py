"""After-completion hooks (SPEC §11): effects that change the world never run inside the
stream. A job names hooks registered on the worker side — never code or URLs from the
producer — and each runs as its own RQ job once the text is final, with an idempotency key
derived from the job id, so a hook that runs twice is recognised downstream.

A hook stays in the job's outbox until it has run. A run holds the hook's lease (renewed
while the hook works); if its worker dies, the lease lapses and a janitor enqueues the hook
again (:mod:`resumeq.queue.outbox`). So a hook runs at least once; only a worker that dies after
the hook's effect but before it is recorded makes it run twice — which its idempotency key
lets the downstream recognise.

Register hooks in a module the workers import (``[worker] hook_modules``)::

    from resumeq.hooks import hook

    @hook("notify")
    def notify(call: HookCall) -> None:
        send_email(call.text, idempotency_key=call.idempotency_key)
"""

from __future__ import annotations

import importlib
import logging
import secrets
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from resumeq.core.errors import ConfigError, ResumeqError
from resumeq.core.models import JobRecord, JobState

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


def run_hook(job_id: str, name: str) -> str:
    """The RQ job of one hook (runs in a resumeq worker)."""
    from resumeq.worker.context import context  # noqa: PLC0415 - the worker's, loaded by it

    ctx = context()
    import_hook_modules(ctx.settings.file.worker.hook_modules)
    fn = _REGISTRY.get(name)
    if fn is None:
        raise ConfigError(f"no hook named {name!r} is registered on this worker")
    store, ttl_ms = ctx.store, ctx.settings.file.worker.lease_ttl_ms
    record, text = store.snapshot(job_id)
    if record.state is not JobState.DONE:
        raise ConfigError(f"job {job_id} is {record.state}, hooks run only on done jobs")
    token = secrets.token_hex(8)
    claim = store.claim_hook(job_id, name, token=token, ttl_ms=ttl_ms)
    if claim != "ok":
        log.info("hook %s of job %s not run: %s", name, job_id, claim)
        return claim
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(ttl_ms / 3000.0):
            try:
                if not store.renew_hook(job_id, name, token=token, ttl_ms=ttl_ms):
                    log.warning("hook %s of job %s: lease lost while it ran", name, job_id)
                    return
            except ResumeqError as exc:
                log.warning("hook %s of job %s: renew failed: %s", name, job_id, exc)

    renewer = threading.Thread(target=renew, name=f"hook-{job_id}-{name}", daemon=True)
    renewer.start()
    try:
        fn(HookCall(job_id, name, idempotency_key(job_id, name), record, text))
    finally:
        stop.set()
        renewer.join(timeout=5)
    store.hook_done(job_id, name, token=token)
    log.info("hook %s ran for job %s", name, job_id)
    return "ok"
