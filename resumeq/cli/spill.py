"""The spill lane from a shell: list, show, requeue, drop, export."""

from __future__ import annotations

import json

import click

from resumeq import ops
from resumeq.cli._base import Context, _emit, cli, reports_errors


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
