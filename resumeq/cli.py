"""The ``resumeq`` command.

Every command takes ``--redis-url`` (or ``RESUMEQ_REDIS_URL``); every command that reports
takes ``--json`` and then prints one JSON object on stdout. Errors print one line on
stderr and exit non-zero, never a traceback.
"""

from __future__ import annotations

import functools
import json
import logging
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import click

from resumeq import ops
from resumeq.client import Client
from resumeq.context import build_context
from resumeq.errors import JobNotFound, ResumeqError
from resumeq.janitor import Janitor
from resumeq.producer import enqueue_job
from resumeq.rq_worker import run_worker
from resumeq.settings import Settings, load_settings
from resumeq.store import DEFAULT_QUEUE, Store

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


@cli.command()
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_obj
@reports_errors
def status(obj: Context, job_id: str, as_json: bool) -> None:
    """Show a job: its state, cursor, revision, text and ledger."""
    info = ops.status_dict(obj.store, job_id)
    if as_json:
        _emit(info)
        return
    for key in ("id", "state", "reason", "provider", "model", "queue", "revision", "attempt"):
        click.echo(f"{key:>12}: {info[key]}")
    exact = "exact" if info["counts_exact"] else "estimated"
    click.echo(f"{'cursor':>12}: {info['spent_output_tokens']}/{info['budget_tokens']} ({exact})")
    if info["finish_reason"] or info["error"]:
        click.echo(f"{'finish':>12}: {info['finish_reason'] or ''} {info['error'] or ''}".rstrip())
    for a in info["attempts"]:
        click.echo(
            f"{'attempt':>12}: #{a['attempt']} {a['kind']:<6} {a['outcome']:<9} "
            f"out {a.get('output_tokens')}/{a['output_tokens_persisted']} "
            f"in {a.get('input_tokens')} ({a.get('cut')})"
        )
    click.echo(f"{'text':>12}: {len(info['text'])} characters")
    click.echo(info["text"])


def _spec_from_options(options: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "provider": options["provider"],
        "model": options["model"],
        "budget_tokens": options["budget"],
    }
    if options["prompt"] is not None and options["messages"] is not None:
        raise click.UsageError("give --prompt or --messages, not both")
    if options["prompt"] is not None:
        spec["prompt"] = options["prompt"]
    elif options["messages"] is not None:
        try:
            spec["messages"] = json.loads(Path(options["messages"]).read_text(encoding="utf-8"))
        except OSError as exc:
            raise click.BadParameter(str(exc.strerror or exc), param_hint="--messages") from None
        except ValueError as exc:
            raise click.BadParameter(f"not JSON: {exc}", param_hint="--messages") from None
    else:
        raise click.UsageError("give --prompt TEXT or --messages FILE")
    if options["floor"] is not None:
        spec["floor_tokens"] = options["floor"]
    exit_policy = {
        k: options[o]
        for k, o in (
            ("on_cut", "on_cut"),
            ("droppable", "droppable"),
            ("max_attempts", "max_attempts"),
        )
        if options[o] is not None
    }
    if exit_policy:
        spec["exit"] = exit_policy
    if options["idempotency_key"] is not None:
        spec["idempotency_key"] = options["idempotency_key"]
    return spec


@cli.command()
@click.option("--provider", required=True, help="Provider profile name (configured on workers).")
@click.option("--model", required=True)
@click.option("--budget", type=int, required=True, help="Most output tokens, all attempts.")
@click.option("--prompt", default=None, help="The user message.")
@click.option("--messages", default=None, help="A JSON file with a list of chat messages.")
@click.option("--floor", type=int, default=None, help="Smallest remaining budget worth resuming.")
@click.option("--on-cut", type=click.Choice(["resume", "abandon", "spill"]), default=None)
@click.option("--droppable/--no-droppable", default=None)
@click.option("--max-attempts", type=int, default=None)
@click.option("--idempotency-key", default=None)
@click.option("--queue", default=DEFAULT_QUEUE, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_obj
@reports_errors
def enqueue(obj: Context, /, as_json: bool, queue: str, **options: Any) -> None:
    """Enqueue a generation job; prints its id."""
    spec = _spec_from_options(options)
    providers = obj.settings.file.providers
    if providers and spec["provider"] not in providers:
        obj.settings.profile(spec["provider"])  # raises: names the known profiles
    result = enqueue_job(obj.store, obj.store.redis, spec, queue=queue)
    if as_json:
        _emit({"id": result.id, "created": result.created, "queue": queue})
    else:
        click.echo(result.id)


@cli.command()
@click.argument("job_id")
@click.option("--after", type=int, default=0, help="Start after this revision.")
@click.pass_obj
@reports_errors
def tail(obj: Context, job_id: str, after: int) -> None:
    """Print a job's text as it grows; exit when the job ends."""
    client = Client(obj.store.redis, settings=obj.store.settings, limits=obj.store.limits)
    for delta in client.follow(job_id, after=after):
        click.echo(delta.text, nl=False)
    job = client.get(job_id)
    click.echo()
    detail = job.finish_reason or job.error or job.reason or ""
    click.echo(f"[{job.state.value}{': ' + detail if detail else ''}]", err=True)
    if job.state.value != "done":
        sys.exit(EXIT_ERROR)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_obj
@reports_errors
def stats(obj: Context, as_json: bool) -> None:
    """Counts by state and token totals over every job in Redis."""
    info = ops.stats(obj.store)
    if as_json:
        _emit(info)
        return
    click.echo(f"jobs: {info['jobs']}")
    for state, n in info["states"].items():
        if n:
            click.echo(f"  {state:<10} {n}")
    for key in (
        "attempts",
        "output_tokens_billed",
        "output_tokens_persisted",
        "naive_output_tokens_billed",
        "input_tokens_billed",
        "cached_input_tokens",
    ):
        click.echo(f"{key}: {info[key]}")


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
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_obj
@reports_errors
def purge(obj: Context, job_id: str, as_json: bool) -> None:
    """Remove a job and everything it owns now (a running job: cancel it first)."""
    removed = obj.store.purge(job_id)
    if as_json:
        _emit({"id": job_id, "purged": True, "keys_removed": removed})
    else:
        click.echo(f"purged {job_id} ({removed} keys)")


@cli.command()
@click.option("--queues", "-q", multiple=True, help="Queue to serve (repeatable).")
@click.option("--burst", is_flag=True, help="Exit once the queues are empty.")
@click.pass_obj
@reports_errors
def worker(obj: Context, queues: tuple[str, ...], burst: bool) -> None:
    """Run an RQ worker (with the scheduler) on resumeq's queues."""
    sys.exit(run_worker(obj.settings, queues, burst=burst))


@cli.command()
@click.option("--once", is_flag=True, help="One sweep, then exit.")
@click.option("--interval", type=float, default=None, help="Seconds between sweeps.")
@click.option("--json", "as_json", is_flag=True, help="With --once: print the sweep as JSON.")
@click.pass_obj
@reports_errors
def janitor(obj: Context, once: bool, interval: float | None, as_json: bool) -> None:
    """Reap jobs whose worker died and resume, spill or abandon them."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    sweeper = Janitor(build_context(obj.settings))
    if once:
        report = sweeper.sweep()
        info = {
            "reaped": report.reaped,
            "outcomes": report.outcomes,
            "requeued": report.requeued,
            "errors": report.errors,
        }
        if as_json:
            _emit(info)
        else:
            click.echo(f"reaped {len(report.reaped)}, re-enqueued {len(report.requeued)}")
        return
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    sweeper.run(interval_s=interval or obj.settings.file.janitor.interval_s, stop=stop)


@cli.group()
def spill() -> None:
    """The spill lane: jobs that could not go on, waiting for a person."""


@spill.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_obj
@reports_errors
def spill_list(obj: Context, as_json: bool) -> None:
    """Spilled jobs, oldest first, with why they spilled."""
    entries = ops.spill_list(obj.store)
    if as_json:
        click.echo(json.dumps(entries, ensure_ascii=False))  # SPEC §15: a list
        return
    for e in entries:
        click.echo(f"{e['id']}  {e['spent_output_tokens']}/{e['budget_tokens']}  {e['reason']}")
    click.echo(f"{len(entries)} spilled")


@spill.command("show")
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_obj
@reports_errors
def spill_show(obj: Context, job_id: str, as_json: bool) -> None:
    """A spilled job: why, its partial text and its ledger."""
    info = ops.status_dict(obj.store, job_id)
    if as_json:
        _emit(info)
        return
    click.echo(f"{job_id} ({info['state']}): {info['reason']}")
    for a in info["attempts"]:
        click.echo(f"  #{a['attempt']} {a['kind']} {a['outcome']} ({a.get('cut')})")
    click.echo(info["text"])


@spill.command("requeue")
@click.argument("job_id")
@click.option("--to", "to_queue", default=None, help="Queue to send it to (default: its own).")
@click.option("--provider", default=None, help="Provider profile to continue it with.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_obj
@reports_errors
def spill_requeue(
    obj: Context, job_id: str, to_queue: str | None, provider: str | None, as_json: bool
) -> None:
    """Send a spilled job back to a queue (maybe another queue or provider)."""
    if provider is not None and obj.settings.file.providers:
        obj.settings.profile(provider)
    queue = ops.requeue_spilled(obj.store, job_id, queue=to_queue, provider=provider)
    if as_json:
        _emit({"id": job_id, "state": "queued", "queue": queue})
    else:
        click.echo(f"requeued {job_id} to {queue}")


@spill.command("drop")
@click.argument("job_id")
@click.option("--reason", default="dropped by operator", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_obj
@reports_errors
def spill_drop(obj: Context, job_id: str, reason: str, as_json: bool) -> None:
    """Give up on a spilled job; its partial text stays readable until it expires."""
    ops.drop_spilled(obj.store, job_id, reason=reason)
    if as_json:
        _emit({"id": job_id, "state": "dropped"})
    else:
        click.echo(f"dropped {job_id}")


@spill.command("export")
@click.pass_obj
@reports_errors
def spill_export(obj: Context) -> None:
    """Every spilled job as JSON lines: reason, partial text and ledger."""
    for entry in ops.spill_list(obj.store):
        click.echo(json.dumps(ops.status_dict(obj.store, entry["id"]), ensure_ascii=False))


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON object.")
@reports_errors
def demo(as_json: bool) -> None:
    """Cut streams on purpose and resume them, on an embedded Redis: no server needed."""

    def progress(message: str) -> None:
        click.echo(f"... {message}", err=True)

    # Imported here: the demo brings fakeredis and the fake provider, which a worker process
    # (started through this same command line) must not carry in memory.
    from resumeq.demo import render, run_demo  # noqa: PLC0415

    summary = run_demo(progress=None if as_json else progress)
    if as_json:
        _emit(summary)
    else:
        click.echo(render(summary))


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
@click.option(
    "--engine",
    type=click.Choice(["vllm", "llamacpp"]),
    default=None,
    help="Behave as this engine does (default vllm): presets the three options below.",
)
@click.option(
    "--prefill-echo/--no-prefill-echo",
    default=None,
    help="Repeat a continued assistant message before the text, as llama.cpp does.",
)
@click.option(
    "--continuous-usage/--no-continuous-usage",
    default=None,
    help="Honour stream_options.continuous_usage_stats (llama.cpp ignores it).",
)
@click.option(
    "--tokenize",
    type=click.Choice(["vllm", "llamacpp"]),
    default=None,
    help="The request and answer format of POST /tokenize.",
)
@reports_errors
def fake_provider(
    host: str, port: int, completion_tokens: int | None, token_delay_ms: float, **engine: Any
) -> None:
    """Serve the fake provider (OpenAI and Anthropic wire formats) until interrupted."""
    from resumeq.fake import serve  # noqa: PLC0415 - kept out of worker processes

    try:
        serve(
            host,
            port,
            completion_tokens=completion_tokens,
            token_delay_ms=token_delay_ms,
            **engine,
        )
    except OSError as exc:
        _fail(f"cannot serve on {host}:{port}: {exc.strerror or exc}")


def main() -> None:
    """The console script: a usage error is one line too, with click's exit code (2)."""
    try:
        code = cli.main(prog_name="resumeq", standalone_mode=False)
    except click.ClickException as exc:
        click.echo(f"resumeq: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except click.Abort:
        click.echo("resumeq: aborted", err=True)
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)
