"""After-completion hooks (SPEC §11), as hook modules and RQ know them: ``from resumeq.hooks
import hook`` registers one, and ``resumeq.hooks.run_hook`` is the function every hook's RQ
job names — queued jobs and workers of another version keep finding it here. The code is
:mod:`resumeq.worker.hooks` (running a hook) and :mod:`resumeq.queue.outbox_hooks`
(enqueueing one)."""

from __future__ import annotations

from resumeq.worker.hooks import (
    HookCall,
    hook,
    idempotency_key,
    import_hook_modules,
    registered,
    run_hook,
)

__all__ = ["HookCall", "hook", "idempotency_key", "import_hook_modules", "registered", "run_hook"]
