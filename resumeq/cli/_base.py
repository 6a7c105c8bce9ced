"""What every ``resumeq`` command shares: the group and its options, the context they
resolve to, one-line errors and JSON output.

Nothing here imports redis-py, RQ, pydantic or the store at load time: ``resumeq --help``
and ``--version`` load only click and this package's command modules, and each command
imports what it uses when it runs (tests/test_imports.py holds the budget)."""

from __future__ import annotations

import functools
import getpass
import json
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import click

from resumeq.core import config_digest, defaults
from resumeq.core.errors import ConfigError, JobNotFound, ResumeqError

if TYPE_CHECKING:
    from resumeq.core.settings import Settings
    from resumeq.store import Store

P = ParamSpec("P")
R = TypeVar("R")

EXIT_ERROR = 1
EXIT_NOT_FOUND = 3


class Context:
    """What the group's options resolve to, shared by the commands.

    Without a config file nothing is built from one: the store gets the defaults
    (:mod:`resumeq.core.defaults`), and a command that only reads or writes Redis loads no
    settings model."""

    def __init__(self, redis_url: str | None, config: Path | None) -> None:
        self._redis_url = redis_url
        self._config = config
        self._checked_url: str | None = None
        self._settings: Settings | None = None
        self._digest: config_digest.ConfigDigest | None = None
        self._store: Store | None = None

    @property
    def configured(self) -> bool:
        """Whether a config file is given (``--config`` or ``RESUMEQ_CONFIG``)."""
        return defaults.config_path(self._config) is not None

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            from resumeq.core.settings import load_settings  # noqa: PLC0415

            path = defaults.config_path(self._config)
            data = config_digest.read_bytes(path) if path is not None else None
            settings = load_settings(redis_url=self._redis_url, config_path=self._config)
            if path is not None and data is not None:
                config_digest.save(path, data, settings.file)
            self._url()
            self._settings = settings
        return self._settings

    @property
    def digest(self) -> config_digest.ConfigDigest | None:
        """What a command reads of the config file without the models, if they validated
        the file as it is now (:mod:`resumeq.core.config_digest`); None without a config file."""
        path = defaults.config_path(self._config)
        if path is None:
            return None
        if self._settings is None and self._digest is None:
            self._digest = config_digest.load(path)
        if self._digest is None:  # the models validate the file (and keep its digest)
            self._digest = config_digest.of(self.settings.file)
        return self._digest

    @property
    def store(self) -> Store:
        if self._store is None:
            from resumeq.store import Store  # noqa: PLC0415

            digest = self.digest
            if digest is not None:
                self._store = Store.from_url(
                    self._url(), settings=digest.store, limits=digest.limits
                )
            else:
                self._store = Store.from_url(self._url())
        return self._store

    def _url(self) -> str:
        """The Redis URL, its Sentinel deployment (if it names one) asked once."""
        if self._checked_url is None:
            url = defaults.redis_url(self._redis_url)
            _check_sentinels(url)
            self._checked_url = url
        return self._checked_url

    def audit(self, action: str, jobs: list[str], detail: str = "") -> None:
        """An operator action from the command line, in the audit log (as the login name
        on this host: the command line has no token)."""
        try:
            who = f"{getpass.getuser()}@{socket.gethostname()}"
        except (KeyError, OSError):  # no login name in this environment
            who = f"unknown@{socket.gethostname()}"
        if jobs:
            from resumeq.store import audit  # noqa: PLC0415

            audit.record(
                self.store.redis,
                who=who,
                role="operator",
                action=action,
                jobs=jobs,
                detail=detail,
                via="cli",
            )


def _fail(message: str, code: int = EXIT_ERROR) -> None:
    for line in message.splitlines() or [message]:
        click.echo(f"resumeq: {line}", err=True)
    sys.exit(code)


def _check_sentinels(url: str) -> None:
    """A Sentinel URL's deployment is asked once, at the start: what is wrong with it is
    one line naming which (no sentinel answers, no service of that name, a primary that
    refuses the credentials), not a traceback at the first command."""
    import redis  # noqa: PLC0415

    from resumeq.store.connection import check_sentinel, parse_sentinel_url  # noqa: PLC0415

    target = parse_sentinel_url(url)
    if target is None:
        return
    try:
        check_sentinel(target)
    except redis.ConnectionError as exc:
        raise ConfigError(f"RESUMEQ_REDIS_URL: {exc}") from None


def reports_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn resumeq's errors into one line on stderr and a non-zero exit: a Redis that
    cannot be reached or refuses the login too (redis-py's errors, where a command talks
    to Redis outside the store, are translated here as the store translates its own). A
    config file's problems are one line each."""
    op = fn.__name__.strip("_").replace("_", " ")

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        from resumeq.store import redis_errors  # noqa: PLC0415

        try:
            with redis_errors(op):
                return fn(*args, **kwargs)
        except JobNotFound as exc:
            _fail(str(exc), EXIT_NOT_FOUND)
        except ConfigError as exc:
            _fail(str(exc) or type(exc).__name__)
        except (ResumeqError, ValueError) as exc:
            _fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        raise AssertionError("unreachable")

    return wrapper


def _emit(obj: dict[str, Any]) -> None:
    click.echo(json.dumps(obj, ensure_ascii=False))


@click.group()
@click.option(
    "--redis-url",
    envvar="RESUMEQ_REDIS_URL",
    default=None,
    help="Redis URL (default: RESUMEQ_REDIS_URL, else redis://localhost:6379/0).",
)
@click.option(
    "--config",
    "config",
    envvar="RESUMEQ_CONFIG",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="TOML config file with provider profiles (default: RESUMEQ_CONFIG).",
)
@click.version_option(package_name="resumeq")
@click.pass_context
def cli(ctx: click.Context, redis_url: str | None, config: Path | None) -> None:
    """resumeq: LLM generation jobs that resume cut streams instead of paying twice."""
    ctx.obj = Context(redis_url, config)
