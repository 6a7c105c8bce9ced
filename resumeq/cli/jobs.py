"""Commands on jobs: enqueue, status, tail, stats, cancel, purge."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from resumeq import ops
from resumeq.cli._base import EXIT_ERROR, Context, _emit, cli, reports_errors
from resumeq.client import Client
from resumeq.producer import enqueue_job
from resumeq.store import DEFAULT_QUEUE


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
