"""The chaos soak's after-completion hook (:mod:`resumeq.testing.soak`).

The soak's workers import this module (``[worker] hook_modules``). The hook does what a
downstream service is asked to do with a hook's idempotency key: it applies its effect once
per key (``HSETNX`` of the text's length, the effect) and recognises a second run as one
(every run is also appended to a list, so that the soak can report reruns). Both live in
the soak's Redis (AOF, ``appendfsync always``).
"""

from __future__ import annotations

from resumeq.worker.context import context
from resumeq.worker.hooks import HookCall, hook

#: The hook's name in the soak's job specs.
HOOK = "soak-record"
#: The soak's own keys (not resumeq's): one entry per hook run; idempotency key -> effect.
HOOK_RUNS = "soak:hook-runs"
HOOK_EFFECTS = "soak:hook-effects"


@hook(HOOK)
def record_run(call: HookCall) -> None:
    redis = context().redis
    redis.rpush(HOOK_RUNS, f"{call.job_id}|{len(call.text)}")
    redis.hsetnx(HOOK_EFFECTS, call.idempotency_key, str(len(call.text)))
