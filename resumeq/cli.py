"""The ``resumeq`` command.

Every command takes ``--redis-url`` (or ``RESUMEQ_REDIS_URL``); every command that reports
takes ``--json`` and then prints one JSON object on stdout. Errors print one line on
stderr and exit non-zero, never a traceback.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import click

from resumeq.errors import JobNotFound, ResumeqError
from resumeq.fake import serve
from resumeq.models import JobRecord
from resumeq.rq_worker import run_worker
from resumeq.settings import Settings, load_settings
from resumeq.store import Store

P = ParamSpec("P")
R = TypeVar("R")

EXIT_ERROR = 1
EXIT_NOT_FOUND = 3


class Context:
    """What the group's options resolve to, shared by the commands."""

    def __init__(self, redis_url: str | None, config: Path | None) -> None:
        self._redis_url = redis_url
        self._config = config
        self._settings: Settings | None = None
        self._store: Store | None = None

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            self._settings = load_settings(redis_url=self._redis_url, config_path=self._config)
        return self._settings

    @property
    def store(self) -> Store:
        if self._store is None:
            file = self.settings.file
            self._store = Store.from_url(
                self.settings.redis_url, settings=file.store, limits=file.limits
            )
        return self._store


def _fail(message: str, code: int = EXIT_ERROR) -> None:
    click.echo(f"resumeq: {message}", err=True)
    sys.exit(code)


def reports_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn resumeq's errors into one line on stderr and a non-zero exit."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except JobNotFound as exc:
            _fail(str(exc), EXIT_NOT_FOUND)
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


def status_dict(record: JobRecord, text: str, ledger: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``status --json`` object (SPEC §15)."""
    return {
        "id": record.id,
        "state": record.state.value,
        "text": text,
        "budget_tokens": record.budget_tokens,
        "floor_tokens": record.floor_tokens,
        "spent_output_tokens": record.spent_output_tokens,
        "counts_exact": record.counts_exact,
        "revision": record.revision,
        "attempt": record.attempt,
        "attempts": ledger,
        "finish_reason": record.finish_reason,
        "error": record.error,
        "reason": record.reason,
        "spill_count": record.spill_count,
        "queue": record.queue,
        "provider": record.spec.provider,
        "model": record.spec.model,
        "prompt_hash": record.prompt_hash,
        "created_ms": record.created_ms,
        "updated_ms": record.updated_ms,
        "finished_ms": record.finished_ms,
    }


@cli.command()
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_obj
@reports_errors
def status(obj: Context, job_id: str, as_json: bool) -> None:
    """Show a job: its state, cursor, revision, text and ledger."""
    store = obj.store
    record = store.get(job_id)
    info = status_dict(record, store.text(job_id), store.ledger(job_id))
    if as_json:
        _emit(info)
        return
    for key in ("id", "state", "reason", "provider", "model", "queue", "revision", "attempt"):
        click.echo(f"{key:>20}: {info[key]}")
    exact = "exact" if record.counts_exact else "estimated"
    click.echo(f"{'cursor':>20}: {record.spent_output_tokens}/{record.budget_tokens} ({exact})")
    if record.finish_reason or record.error:
        click.echo(f"{'finish':>20}: {record.finish_reason or ''} {record.error or ''}".rstrip())
    click.echo(f"{'text':>20}: {len(info['text'])} characters")
    click.echo(info["text"])


@cli.command()
@click.argument("job_id")
@click.option("--reason", default="cancelled by operator", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_obj
@reports_errors
def cancel(obj: Context, job_id: str, reason: str, as_json: bool) -> None:
    """Cancel a job that has not ended; its worker stops streaming at its next flush."""
    revision = obj.store.cancel(job_id, reason=reason)
    if as_json:
        _emit({"id": job_id, "state": "cancelled", "revision": revision})
    else:
        click.echo(f"cancelled {job_id} (revision {revision})")


@cli.command()
@click.option("--queues", "-q", multiple=True, help="Queue to serve (repeatable).")
@click.option("--burst", is_flag=True, help="Exit once the queues are empty.")
@click.pass_obj
@reports_errors
def worker(obj: Context, queues: tuple[str, ...], burst: bool) -> None:
    """Run an RQ worker (with the scheduler) on resumeq's queues."""
    sys.exit(run_worker(obj.settings, queues, burst=burst))


@cli.command("fake-provider")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535))
@click.option(
    "--completion-tokens",
    type=click.IntRange(1, 1_000_000),
    default=None,
    help="Length of every canonical completion (default: derived from the prompt).",
)
@click.option(
    "--token-delay-ms",
    type=click.FloatRange(0, 60_000),
    default=0.0,
    show_default=True,
    help="Pause between tokens, so streams can be cut by hand.",
)
@reports_errors
def fake_provider(
    host: str, port: int, completion_tokens: int | None, token_delay_ms: float
) -> None:
    """Serve the fake provider (OpenAI and Anthropic wire formats) until interrupted."""
    try:
        serve(host, port, completion_tokens=completion_tokens, token_delay_ms=token_delay_ms)
    except OSError as exc:
        _fail(f"cannot serve on {host}:{port}: {exc.strerror or exc}")


def main() -> None:
    cli(prog_name="resumeq")
