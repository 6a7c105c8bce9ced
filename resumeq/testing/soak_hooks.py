"""The chaos soak's after-completion hook (:mod:`resumeq.testing.soak`).

The soak's workers import this module (``[worker] hook_modules``). Each run of the hook
appends ``<job id>|<characters of the text it was given>`` to a list in the soak's Redis
(AOF, ``appendfsync always``), so that afterwards the soak can tell, for every job, how
many times its hook ran and whether it saw the final text.
"""

from __future__ import annotations

from resumeq.context import context
from resumeq.hooks import HookCall, hook

#: The hook's name in the soak's job specs.
HOOK = "soak-record"
#: The soak's own list, one entry per hook run (a key of the soak's, not of resumeq's).
HOOK_RUNS = "soak:hook-runs"


@hook(HOOK)
def record_run(call: HookCall) -> None:
    context().redis.rpush(HOOK_RUNS, f"{call.job_id}|{len(call.text)}")
