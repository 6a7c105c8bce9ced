"""resumeq: a Redis-backed job queue for LLM generation jobs that resumes cut streams.

The public surface is what ``__all__`` lists; everything else is internal.
"""

from resumeq.errors import (
    ConfigError,
    CorruptRecord,
    FieldError,
    IdempotencyConflict,
    InvalidSpec,
    InvalidTransition,
    JobCancelled,
    JobNotFound,
    LeaseLost,
    RedisUnavailable,
    ResumeqError,
    SpillExhausted,
    StaleRevision,
    StoreError,
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

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_QUEUE",
    "TERMINAL_STATES",
    "Acquired",
    "ConfigError",
    "ConfigFile",
    "CorruptRecord",
    "CreateResult",
    "ExitPolicy",
    "FieldError",
    "FlushResult",
    "GenerationParams",
    "IdempotencyConflict",
    "InvalidSpec",
    "InvalidTransition",
    "JanitorSettings",
    "JobCancelled",
    "JobNotFound",
    "JobRecord",
    "JobSpec",
    "JobState",
    "Lease",
    "LeaseLost",
    "Limits",
    "Message",
    "Prices",
    "ProviderProfile",
    "ReapResult",
    "RedisUnavailable",
    "ResumeqError",
    "Role",
    "Settings",
    "SpillExhausted",
    "StaleRevision",
    "Store",
    "StoreError",
    "StoreSettings",
    "WorkerSettings",
    "WriteRefused",
    "__version__",
    "load_settings",
    "parse_spec",
    "parse_spec_json",
]
