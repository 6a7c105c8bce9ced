"""resumeq: a Redis-backed job queue for LLM generation jobs that resumes cut streams.

The public surface is what ``__all__`` lists; everything else is internal.
"""

import importlib
from typing import TYPE_CHECKING, Any

from resumeq.errors import (
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
from resumeq.models import (
    TERMINAL_STATES,
    Acquired,
    CreateResult,
    FlushResult,
    JobRecord,
    JobState,
    Lease,
)
from resumeq.settings import (
    ConfigFile,
    JanitorSettings,
    Prices,
    ProviderProfile,
    Settings,
    StoreSettings,
    WorkerSettings,
    load_settings,
)
from resumeq.spec import (
    ExitPolicy,
    GenerationParams,
    JobSpec,
    Limits,
    Message,
    Role,
    parse_spec,
    parse_spec_json,
)
from resumeq.store import DEFAULT_QUEUE, ReapResult, Store

if TYPE_CHECKING:
    from resumeq.async_client import AsyncClient
    from resumeq.client import Client, Delta, Job

__version__ = "0.1.0"

#: The producer clients load on first use: a worker, a janitor or the CLI never needs
#: them, and asyncio's Redis client alone costs a tenth of a second to import.
_LAZY = {
    "AsyncClient": "resumeq.async_client",
    "Client": "resumeq.client",
    "Delta": "resumeq.client",
    "Job": "resumeq.client",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'resumeq' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


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
