"""resumeq: a Redis-backed job queue for LLM generation jobs that resumes cut streams.

The public surface is what ``__all__`` lists; everything else is internal. The exceptions
load with the package; every other name loads with its module on first use.
"""

import importlib
from typing import TYPE_CHECKING, Any

from resumeq.core.errors import (
    ConfigError,
    CorruptRecord,
    Disconnected,
    FatalProviderError,
    FieldError,
    IdempotencyConflict,
    InBandError,
    InvalidSpec,
    InvalidTransition,
    JobCancelled,
    JobFailed,
    JobNotFound,
    LeaseLost,
    MalformedChunk,
    ProviderConnectError,
    ProviderError,
    ProviderOverloaded,
    ProviderUnavailable,
    RateLimited,
    ReattachRefused,
    RedisUnavailable,
    ReplicaLagging,
    ResponseQueued,
    ResumeqError,
    RetryableProviderError,
    SpillExhausted,
    StaleRevision,
    Stalled,
    StoreError,
    StreamCut,
    Truncated,
    UnreadableCount,
    WriteRefused,
)

if TYPE_CHECKING:
    from resumeq.core.models import (
        TERMINAL_STATES,
        Acquired,
        CreateResult,
        FlushResult,
        JobRecord,
        JobState,
        Lease,
    )
    from resumeq.core.settings import (
        ConfigFile,
        JanitorSettings,
        Prices,
        ProviderProfile,
        Settings,
        StoreSettings,
        WorkerSettings,
        load_settings,
    )
    from resumeq.core.spec import (
        ExitPolicy,
        GenerationParams,
        JobSpec,
        Limits,
        Message,
        Role,
        parse_spec,
        parse_spec_json,
    )
    from resumeq.producer.async_client import AsyncClient
    from resumeq.producer.client import Client, Delta, Job
    from resumeq.store import DEFAULT_QUEUE, ReapResult, Store

from resumeq.core.version import __version__ as __version__

#: Where each name of the surface that is not an exception lives. Each module loads on the
#: first use of one of its names (PEP 562): ``import resumeq`` stays cheap, and a command
#: line, a worker or a janitor imports only what it uses — pydantic's models, redis-py and
#: RQ cost a command line several tenths of a second of CPU, and a worker their memory.
_LAZY_MODULES = {
    "resumeq.producer.async_client": ("AsyncClient",),
    "resumeq.producer.client": ("Client", "Delta", "Job"),
    "resumeq.core.models": (
        "TERMINAL_STATES",
        "Acquired",
        "CreateResult",
        "FlushResult",
        "JobRecord",
        "JobState",
        "Lease",
    ),
    "resumeq.core.settings": (
        "ConfigFile",
        "JanitorSettings",
        "Prices",
        "ProviderProfile",
        "Settings",
        "StoreSettings",
        "WorkerSettings",
        "load_settings",
    ),
    "resumeq.core.spec": (
        "ExitPolicy",
        "GenerationParams",
        "JobSpec",
        "Limits",
        "Message",
        "Role",
        "parse_spec",
        "parse_spec_json",
    ),
    "resumeq.store": ("DEFAULT_QUEUE", "ReapResult", "Store"),
}
_LAZY = {name: module for module, names in _LAZY_MODULES.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'resumeq' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "DEFAULT_QUEUE",
    "TERMINAL_STATES",
    "Acquired",
    "AsyncClient",
    "Client",
    "ConfigError",
    "ConfigFile",
    "CorruptRecord",
    "CreateResult",
    "Delta",
    "Disconnected",
    "ExitPolicy",
    "FatalProviderError",
    "FieldError",
    "FlushResult",
    "GenerationParams",
    "IdempotencyConflict",
    "InBandError",
    "InvalidSpec",
    "InvalidTransition",
    "JanitorSettings",
    "Job",
    "JobCancelled",
    "JobFailed",
    "JobNotFound",
    "JobRecord",
    "JobSpec",
    "JobState",
    "Lease",
    "LeaseLost",
    "Limits",
    "MalformedChunk",
    "Message",
    "Prices",
    "ProviderConnectError",
    "ProviderError",
    "ProviderOverloaded",
    "ProviderProfile",
    "ProviderUnavailable",
    "RateLimited",
    "ReapResult",
    "ReattachRefused",
    "RedisUnavailable",
    "ReplicaLagging",
    "ResponseQueued",
    "ResumeqError",
    "RetryableProviderError",
    "Role",
    "Settings",
    "SpillExhausted",
    "StaleRevision",
    "Stalled",
    "Store",
    "StoreError",
    "StoreSettings",
    "StreamCut",
    "Truncated",
    "UnreadableCount",
    "WorkerSettings",
    "WriteRefused",
    "__version__",
    "load_settings",
    "parse_spec",
    "parse_spec_json",
]
