"""Settings, loaded in one place and passed down.

Two sources: environment variables with the ``RESUMEQ_`` prefix (``RESUMEQ_REDIS_URL``,
``RESUMEQ_CONFIG``) and the TOML file that ``RESUMEQ_CONFIG`` names (SPEC §15). Every error
is a :class:`~resumeq.core.errors.ConfigError` that names the file and the field.
"""

from __future__ import annotations

import ipaddress
import re
import tomllib
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from resumeq.core import defaults
from resumeq.core.defaults import DEFAULT_REDIS_URL, STORE_DEFAULTS
from resumeq.core.errors import ConfigError
from resumeq.core.spec import Limits

_TAIL_RE = re.compile(r"^tail:([1-9][0-9]*)$")


class Prices(BaseModel):
    """Prices per million tokens, for reporting money in the ledger summary."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input: float = Field(ge=0)
    cached_input: float | None = Field(default=None, ge=0)
    output: float = Field(ge=0)


class ProviderProfile(BaseModel):
    """A provider a job may name; its URL and key live only on the workers."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: The wire: ``openai`` (Chat Completions), ``openai-responses`` (the Responses API),
    #: ``anthropic`` (Messages); ``fake`` speaks the OpenAI wire.
    kind: Literal["openai", "openai-responses", "anthropic", "fake"]
    base_url: str
    api_key_env: str | None = None
    continue_mode: Literal["prefill", "prefill_flag", "continue_final_message", "instruction"] = (
        "instruction"
    )
    #: Whether a tool call cut inside its arguments is continued (its arguments asked for
    #: from where they stop, as text, in ``continue_mode``) rather than asked for again
    #: whole. Never on a ``background`` profile, which reads a cut call on instead.
    continue_calls: bool = True
    #: How output tokens are counted (SPEC §6): the provider's usage, its counting
    #: endpoint, usage when the stream ends and the endpoint when it was cut, or an
    #: estimate from what arrived.
    counting: Literal["usage", "tokenizer", "usage+tokenizer", "chunks"] = "chunks"
    #: The counting endpoint's format; by default the kind's own (``anthropic`` for
    #: Anthropic, ``vllm`` for the OpenAI wire).
    tokenizer: Literal["vllm", "llamacpp", "anthropic"] | None = None
    #: Whether the engine repeats a prefill before continuing it; ``auto`` detects it
    #: (Anthropic never does: ``auto`` means ``no`` there).
    prefill_echo: Literal["auto", "yes", "no"] = "auto"
    #: An estimate counts at least one token per this many UTF-8 bytes received (and at
    #: least one per chunk). Lower errs higher; 1 is a hard bound (a token is at least a
    #: byte). By default 2 for Anthropic, whose deltas carry several tokens, and 4 for the
    #: OpenAI wire, which streams one token per chunk.
    estimate_bytes_per_token: float | None = Field(default=None, gt=0)
    #: Once exact counts of this profile and model were seen, an estimate errs high by at
    #: most this factor over what they showed (:mod:`resumeq.core.calibration`).
    estimate_margin: float = Field(default=1.25, ge=1.0, le=4.0)
    resume_context: str = "full"
    stall_timeout_s: float = Field(default=30.0, gt=0)
    connect_timeout_s: float = Field(default=10.0, gt=0)
    #: The most connections one worker process opens to this provider at once (by default
    #: the worker's concurrency); further streams wait on the client for a free one.
    max_connections: int | None = Field(default=None, gt=0)
    cache_prompt: bool = False
    #: The Responses API only: create each response in the background (``background: true,
    #: store: true``), so that after a cut the next attempt reads the rest of the same
    #: response (``reattach``) instead of buying a continuation.
    background: bool = False
    #: How long an attempt polls a reattached response that is still ``queued`` before it
    #: hands the job back to the gate (the next attempt polls it again; it is never made
    #: twice).
    background_queued_timeout_s: float = Field(default=600.0, gt=0)
    prices: Prices | None = None

    @field_validator("base_url")
    @classmethod
    def _check_base_url(cls, v: str) -> str:
        if not re.match(r"^https?://[^\s/]+", v):
            raise ValueError("must be an http:// or https:// URL")
        return v.rstrip("/")

    @field_validator("api_key_env")
    @classmethod
    def _check_key_env(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", v):
            raise ValueError("must be the name of an environment variable, not the key itself")
        return v

    @field_validator("resume_context")
    @classmethod
    def _check_resume_context(cls, v: str) -> str:
        if v != "full" and not _TAIL_RE.match(v):
            raise ValueError('must be "full" or "tail:N" with N > 0')
        return v

    @model_validator(mode="after")
    def _check_continue_mode(self) -> ProviderProfile:
        if self.kind == "anthropic" and self.continue_mode not in ("prefill", "instruction"):
            raise ValueError(
                f'continue_mode "{self.continue_mode}" is not an Anthropic mode '
                '(use "prefill" or "instruction")'
            )
        if self.kind == "openai-responses" and self.continue_mode not in (
            "continue_final_message",
            "instruction",
        ):
            raise ValueError(
                f'continue_mode "{self.continue_mode}" is not a Responses mode '
                '(use "continue_final_message" or "instruction")'
            )
        if self.background and self.kind != "openai-responses":
            raise ValueError(
                f'background = true needs kind "openai-responses" (this profile is "{self.kind}")'
            )
        anthropic = self.kind == "anthropic"
        if self.tokenizer is not None and (self.tokenizer == "anthropic") != anthropic:
            wanted = '"anthropic"' if anthropic else '"vllm" or "llamacpp"'
            raise ValueError(
                f'tokenizer "{self.tokenizer}" does not fit kind "{self.kind}" (use {wanted})'
            )
        return self

    @property
    def min_output_tokens(self) -> int:
        """The fewest output tokens a request may ask for: OpenAI's Responses API refuses a
        ``max_output_tokens`` below 16 (a continuation with less left takes the job's exit,
        as below its floor)."""
        return 16 if self.kind == "openai-responses" else 1

    @property
    def tokenizer_format(self) -> Literal["vllm", "llamacpp", "anthropic"]:
        """The counting endpoint's format, defaulted from the kind."""
        if self.tokenizer is not None:
            return self.tokenizer
        return "anthropic" if self.kind == "anthropic" else "vllm"

    @property
    def continues_calls(self) -> bool:
        """Whether a tool call cut inside its arguments is continued (a background
        response is read on instead, the call with it)."""
        return self.continue_calls and not self.background

    @property
    def echo_policy(self) -> Literal["auto", "yes", "no"]:
        """``prefill_echo``, with what is known of the kind: Anthropic never echoes, and its
        first delta, several tokens long, could pass for an echo of a short tail."""
        if self.kind == "anthropic" and self.prefill_echo == "auto":
            return "no"
        return self.prefill_echo

    @property
    def bytes_per_token(self) -> float:
        """The estimate's bytes per token, defaulted from the kind."""
        if self.estimate_bytes_per_token is not None:
            return self.estimate_bytes_per_token
        return 2.0 if self.kind == "anthropic" else 4.0

    @property
    def counts_with_tokenizer(self) -> bool:
        return self.counting in ("tokenizer", "usage+tokenizer")

    @property
    def asks_continuous_usage(self) -> bool:
        """Whether requests ask for usage in every chunk (vLLM's ``continuous_usage_stats``)."""
        return self.counting in ("usage", "usage+tokenizer")

    @property
    def tail_tokens(self) -> int | None:
        """N of ``resume_context = "tail:N"``, or None for ``full``."""
        m = _TAIL_RE.match(self.resume_context)
        return int(m.group(1)) if m else None


class WorkerSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    flush_tokens: int = Field(default=32, gt=0)
    flush_ms: int = Field(default=250, gt=0)
    #: A token-count flush waits until this long after the last one. At a provider's pace
    #: (tens to hundreds of tokens a second) it never binds; at loopback speed it keeps the
    #: checkpoint from costing a Redis round trip every couple of milliseconds. 0: off.
    flush_min_ms: int = Field(default=20, ge=0)
    lease_ttl_ms: int = Field(default=15_000, ge=100)
    #: Attempts that deliver nothing (429, 5xx, connect errors, cuts before any output)
    #: back off and go on for this long before the job's exit applies.
    retry_window_s: float = Field(default=300.0, gt=0)
    #: Attempts one worker process runs at once (each a thread; ``resumeq worker
    #: --concurrency`` overrides it). 1: one at a time.
    concurrency: int = Field(default=50, gt=0, le=10_000)
    #: A provider connection with nothing to read waits at most once per this long
    #: (:mod:`resumeq.providers.pacing`): a slow stream's tokens are read a few per wake-up, which
    #: is most of a busy worker's CPU. Bytes already waiting are read at once. 0 (the
    #: default): off; 100 for a worker of hundreds of streams.
    read_pause_ms: int = Field(default=0, ge=0, le=1_000)
    queues: tuple[str, ...] = ("resumeq",)
    #: Modules the workers import so that their hooks are registered.
    hook_modules: tuple[str, ...] = ()


class JanitorSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    interval_s: float = Field(default=2.0, gt=0)
    #: How often the janitor looks for lease holders whose Redis connections are all gone
    #: (one ``CLIENT LIST``): a worker found gone twice, at least this far apart, has its
    #: jobs reaped at once, without waiting for their leases to expire. 0: leases only.
    liveness_interval_ms: int = Field(default=250, ge=0)


class StoreSettings(BaseModel):
    """How long things live in Redis."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: Terminal jobs (their text, events, ledger and idempotency key too) expire after this
    #: long.
    retention_s: int = Field(default=STORE_DEFAULTS.retention_s, gt=0)
    #: After a job ends, its followers have this long to read its events stream; then the
    #: janitor removes it (the text is kept once, compactly, in the text key, and
    #: a follower that comes later reads it there).
    events_grace_s: float = Field(default=STORE_DEFAULTS.events_grace_s, ge=0)
    #: When a checkpoint counts as durable. ``primary``: once the primary applied it (a
    #: failover can lose the last checkpoints: the job resumes from an older prefix and
    #: buys those tokens again). ``replica``: once a replica acknowledged it too (``WAIT
    #: 1``); followers are shown only text a replica holds, so a failover never takes back
    #: text anyone saw. See RELIABILITY.md.
    durability: Literal["primary", "replica"] = STORE_DEFAULTS.durability
    #: With ``durability = "replica"``: how long a write waits for a replica before it is
    #: sent again (as when Redis is down: the attempt stops once its lease would expire).
    replica_timeout_ms: int = Field(default=STORE_DEFAULTS.replica_timeout_ms, gt=0, le=60_000)


_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
_ORIGIN = re.compile(
    r"^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?$|^https?://\[[0-9A-Fa-f:.]+\](:[0-9]{1,5})?$"
)

ProfileName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]

Role = Literal["producer", "operator", "viewer"]


class ServerToken(BaseModel):
    """A bearer token the HTTP service accepts, by the SHA-256 of the token (hex), with
    its role and the name its jobs are recorded under."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    role: Role
    name: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.@-]{1,64}$")

    @property
    def principal(self) -> str:
        """Whom a job created with this token belongs to: its name, else its hash's head."""
        return self.name or f"sha256-{self.sha256[:12]}"


class ServerSettings(BaseModel):
    """``[server]``: ``resumeq serve``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    #: true: ``/metrics`` and ``/healthz`` need no token.
    public_metrics: bool = False
    tokens: tuple[ServerToken, ...] = ()
    #: A request body larger than this is refused (413).
    max_body_bytes: int = Field(default=1_048_576, gt=0)
    #: An SSE follower with nothing new gets a comment this often (seconds).
    keepalive_s: float = Field(default=15.0, gt=0)
    #: Jobs one server process follows at once (their text is kept in memory while
    #: followed, however many followers each has); a follower of one more is a 503 with
    #: Retry-After.
    max_followed_jobs: int = Field(default=2_000, gt=0)
    #: Event streams one producer may hold open on one server process (operators and
    #: viewers are not counted); one more is a 429 with Retry-After. 0: no limit.
    max_streams_per_producer: int = Field(default=1_000, ge=0)
    #: The environment variable holding the secret follow tokens are signed with (every
    #: ``resumeq serve`` process of a deployment shares it); ``previous_secret_env`` the
    #: one before, still accepted (a rotation). None: no follow tokens.
    secret_env: str | None = Field(default=None, pattern=_ENV_NAME)
    previous_secret_env: str | None = Field(default=None, pattern=_ENV_NAME)
    #: How long a follow token opens its job's events (seconds; at most a week).
    follow_token_ttl_s: float = Field(default=3600.0, gt=0, le=7 * 24 * 3600)
    #: Origins whose pages may call ``/v1/`` from a browser (CORS): ``scheme://host[:port]``
    #: each; none by default, and never ``*``.
    cors_origins: tuple[str, ...] = ()
    #: Addresses (or networks) of the reverse proxies whose ``X-Forwarded-Proto``,
    #: ``X-Forwarded-Host`` and ``X-Forwarded-For`` are believed; ``*`` for any peer.
    forwarded_allow_ips: tuple[str, ...] = ()

    @field_validator("cors_origins")
    @classmethod
    def _check_origins(cls, origins: tuple[str, ...]) -> tuple[str, ...]:
        out = []
        for origin in origins:
            if origin == "*":
                raise ValueError(
                    '"*" would let every site read what its visitors\' tokens open: '
                    "name each origin (https://app.example)"
                )
            if not _ORIGIN.match(origin):
                raise ValueError(
                    f"{origin!r} is not an origin: scheme://host[:port], no path, no slash"
                )
            out.append(origin.lower())
        return tuple(out)

    @field_validator("forwarded_allow_ips")
    @classmethod
    def _check_proxies(cls, addresses: tuple[str, ...]) -> tuple[str, ...]:
        for address in addresses:
            if address == "*":
                continue
            try:
                ipaddress.ip_network(address, strict=False)
            except ValueError:
                raise ValueError(f"{address!r} is not an IP address or network (or *)") from None
        return addresses

    @model_validator(mode="after")
    def _distinct(self) -> ServerSettings:
        hashes = [t.sha256 for t in self.tokens]
        if len(set(hashes)) != len(hashes):
            raise ValueError("tokens: the same sha256 is listed twice")
        names = [t.principal for t in self.tokens]
        if len(set(names)) != len(names):
            raise ValueError("tokens: two tokens have the same name (a job belongs to a name)")
        if self.previous_secret_env is not None and self.secret_env is None:
            raise ValueError("previous_secret_env: set secret_env too (it signs new tokens)")
        return self


#: A gateway model's target: a profile's name, a slash, the model the provider is asked for
#: (model ids hold slashes of their own: the first one splits).
_GATEWAY_TARGET = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}/.{1,200}$", re.DOTALL)


class GatewaySettings(BaseModel):
    """``[gateway]``: the OpenAI- and Anthropic-compatible endpoints of ``resumeq serve``
    (SPEC §24)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: Model names a client may send, each the ``PROFILE/MODEL`` it stands for.
    models: dict[str, str] = Field(default_factory=dict)
    #: A client that goes away from a streaming request cancels its job (false: the job
    #: goes on, and the client may read it again by id).
    cancel_on_disconnect: bool = False
    #: How long a request waits for a job resting on the spill lane (a person may requeue
    #: it), and how long a non-streamed request waits at all, before it ends with an error.
    max_wait_s: float = Field(default=600.0, gt=0, le=24 * 3600)
    #: The budget of a request that names no ``max_tokens`` (Anthropic's wire requires one).
    default_max_tokens: int = Field(default=4096, gt=0)
    #: The queue the gateway's jobs go to; by default the first of ``[worker] queues``.
    queue: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.:-]{1,64}$")

    @field_validator("models")
    @classmethod
    def _check_models(cls, models: dict[str, str]) -> dict[str, str]:
        for alias, target in models.items():
            if not alias or len(alias) > 200:
                raise ValueError(f"{alias[:80]!r}: an alias is 1 to 200 characters")
            if not _GATEWAY_TARGET.match(target):
                raise ValueError(
                    f"{alias!r} = {target[:80]!r}: a target is PROFILE/MODEL "
                    '(as "openai-prod/gpt-4o-mini")'
                )
        return models


class ConfigFile(BaseModel):
    """The TOML file of SPEC §15."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    providers: dict[ProfileName, ProviderProfile] = Field(default_factory=dict)
    worker: WorkerSettings = WorkerSettings()
    janitor: JanitorSettings = JanitorSettings()
    store: StoreSettings = StoreSettings()
    limits: Limits = Limits()
    server: ServerSettings = ServerSettings()
    gateway: GatewaySettings = GatewaySettings()

    @model_validator(mode="after")
    def _gateway_profiles(self) -> ConfigFile:
        for alias, target in self.gateway.models.items():
            profile = target.partition("/")[0]
            if profile not in self.providers:
                known = ", ".join(sorted(self.providers)) or "none configured"
                raise ValueError(
                    f"gateway.models: {alias!r} names profile {profile!r}, which is not "
                    f"configured (known: {known})"
                )
        if self.gateway.queue is not None and self.gateway.queue not in self.worker.queues:
            raise ValueError(f"gateway.queue: {self.gateway.queue!r} is not one of [worker] queues")
        return self


class Settings(BaseModel):
    """Everything resumeq is configured with, resolved once."""

    model_config = ConfigDict(frozen=True)

    redis_url: str = DEFAULT_REDIS_URL
    config_path: Path | None = None
    file: ConfigFile = ConfigFile()

    def profile(self, name: str) -> ProviderProfile:
        try:
            return self.file.providers[name]
        except KeyError:
            known = ", ".join(sorted(self.file.providers)) or "none configured"
            raise ConfigError(f"unknown provider profile {name!r} (known: {known})") from None


def load_config_file(path: Path) -> ConfigFile:
    """Read and validate a TOML config file. A file with several problems reports every
    one, a line each (``config file PATH: field.path: message``); each line stands alone."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    try:
        return ConfigFile.model_validate(data)
    except ValidationError as exc:
        problems = []
        for error in exc.errors(include_url=False, include_input=False):
            where = ".".join(str(p) for p in error["loc"]) or "(file)"
            message = error["msg"].removeprefix("Value error, ")
            problems.append(f"config file {path}: {where}: {message}")
        raise ConfigError("\n".join(problems)) from None


def load_settings(*, redis_url: str | None = None, config_path: Path | None = None) -> Settings:
    """Resolve settings: explicit arguments, then ``RESUMEQ_*`` variables, then defaults.

    The two variables are read from the environment directly (a variable set to the empty
    string counts as unset): a settings library for two strings cost every worker process
    some 2 MB of memory (BENCHMARKS.md §4)."""
    path = defaults.config_path(config_path)
    file = load_config_file(path) if path is not None else ConfigFile()
    return Settings(redis_url=defaults.redis_url(redis_url), config_path=path, file=file)
