"""The spill lane from a shell: list (with filters), show, requeue and drop — one job or
all that match — and export. Each command loads the operations (:mod:`resumeq.producer.ops`) when it
runs."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from resumeq.cli._base import Context, _emit, cli, reports_errors

if TYPE_CHECKING:
    from resumeq.producer import ops

_AGE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_age(text: str) -> float:
    """``90``, ``90s``, ``10m``, ``2h``, ``1d`` as seconds."""
    m = _AGE_RE.match(text)
    if not m:
        raise click.BadParameter(f"{text!r}: expected a number and s, m, h or d (like 10m)")
    return float(m.group(1)) * _UNIT_S[m.group(2)]


def _filters(fn: Callable[..., Any], *, provider_flag: str = "--provider") -> Callable[..., Any]:
    """The filters every spill command that looks at many jobs takes (``requeue`` names the
    provider filter ``--from-provider``: its ``--provider`` is where the job goes)."""
    for option in reversed(
        [
            click.option("--reason", default=None, help="A piece of the reason it spilled."),
            click.option(provider_flag, "of_provider", default=None, help="Its provider profile."),
            click.option("--queue", default=None, help="Its queue."),
            click.option(
                "--older-than",
                default=None,
                metavar="AGE",
                help="Spilled at least this long ago (90s, 10m, 2h, 1d).",
            ),
        ]
    ):
        fn = option(fn)
    return fn


def _where(reason: str | None, of_provider: str | None, queue: str | None,
           older_than: str | None) -> ops.SpillFilter:  # fmt: skip
    from resumeq.producer import ops  # noqa: PLC0415

    return ops.SpillFilter(
        reason=reason,
        provider=of_provider,
        queue=queue,
        older_than_s=parse_age(older_than) if older_than is not None else None,
    )


@cli.group()
def spill() -> None:
    """The spill lane: jobs that could not go on, waiting for a person."""


@spill.command("list")
@_filters
@click.option("--limit", type=click.IntRange(1, 1_000_000), default=None)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@click.pass_obj
@reports_errors
def spill_list(obj: Context, /, as_json: bool, limit: int | None, **filters: Any) -> None:
    """Spilled jobs, oldest first, with why they spilled."""
    from resumeq.producer import ops  # noqa: PLC0415

    entries = ops.spill_list(obj.store, _where(**filters), limit=limit)
    if as_json:
        click.echo(json.dumps(entries, ensure_ascii=False))  # SPEC §15: a list
        return
    for e in entries:
        click.echo(
            f"{e['id']}  {e['provider']}  {e['queue']}  "
            f"{e['spent_output_tokens']}/{e['budget_tokens']}  {e['reason']}"
        )
    click.echo(f"{len(entries)} spilled")


@spill.command("show")
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_obj
@reports_errors
def spill_show(obj: Context, job_id: str, as_json: bool) -> None:
    """A spilled job: why, the conversation it was asked, its partial text and ledger."""
    from resumeq.producer import ops  # noqa: PLC0415

    info = ops.spill_detail(obj.store, job_id)
    if as_json:
        _emit(info)
        return
    click.echo(f"{job_id} ({info['state']}): {info['reason']}")
    click.echo(f"provider {info['provider']}, model {info['model']}")
    for m in info["messages"]:
        click.echo(f"  [{m['role']}] {m['content']}")
    for a in info["attempts"]:
        click.echo(f"  #{a['attempt']} {a['kind']} {a['outcome']} ({a.get('cut')})")
    click.echo(info["text"])


def _single(
    job_id: str | None, every: bool, filters: dict[str, Any], provider_flag: str = "--provider"
) -> bool:
    """Whether the command is about one job (an id) rather than ``--all`` that match."""
    if every and job_id is not None:
        raise click.UsageError("give a job id or --all, not both")
    if not every and job_id is None:
        raise click.UsageError("give a job id, or --all (with filters) for many")
    given = [name for name, value in filters.items() if value is not None]
    if job_id is not None and given:
        flag = {"of_provider": provider_flag}
        flags = ", ".join(flag.get(name, "--" + name.replace("_", "-")) for name in given)
        raise click.UsageError(f"{flags}: filters choose jobs for --all, not with a job id")
    return job_id is not None


def _confirmed(
    obj: Context, verb: str, where: ops.SpillFilter, yes: bool, as_json: bool, *, to: str = ""
) -> bool:
    """Say how many jobs ``--all`` will touch (and where to), and ask (unless ``--yes``)."""
    from resumeq.producer import ops  # noqa: PLC0415

    count = len(ops.spilled_records(obj.store, where))
    if count == 0:
        if as_json:
            _emit(ops.BulkResult().as_dict())
        else:
            click.echo("no spilled job matches")
        return False
    if yes:
        return True
    try:
        question = f"{verb} {count} spilled job(s){to}?"
        answer = click.confirm(question, default=False, err=True)
    except click.Abort:  # no answer: stdin closed, as in a script without --yes
        answer = False
    if not answer:
        click.echo(f"nothing to {verb}: not confirmed (--yes skips the question)", err=True)
        raise click.exceptions.Exit(1)
    return True


@spill.command("requeue")
@click.argument("job_id", required=False)
@click.option("--all", "every", is_flag=True, help="Every spilled job that matches the filters.")
@functools.partial(_filters, provider_flag="--from-provider")
@click.option("--to", "to_queue", default=None, help="Queue to send it to (default: its own).")
@click.option("--provider", default=None, help="Provider profile to continue it with.")
@click.option("--budget", type=click.IntRange(1), default=None, help="A larger budget.")
@click.option("--yes", is_flag=True, help="With --all: do not ask.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_obj
@reports_errors
def spill_requeue(
    obj: Context,
    /,
    job_id: str | None,
    *,
    every: bool,
    to_queue: str | None,
    provider: str | None,
    budget: int | None,
    yes: bool,
    as_json: bool,
    **filters: Any,
) -> None:
    """Send a spilled job (or --all that match) back to a queue, maybe another queue,
    provider or a larger budget."""
    from resumeq.producer import ops  # noqa: PLC0415

    if provider is not None and obj.settings.file.providers:
        obj.settings.profile(provider)

    sent_to: list[str] = []

    def requeue(one: str) -> str:
        queue = ops.requeue_spilled(
            obj.store, one, queue=to_queue, provider=provider, budget=budget
        )
        sent_to.append(queue)
        return queue

    changes = {"to": to_queue, "provider": provider, "budget": budget}
    detail = " ".join(f"{k}={v}" for k, v in changes.items() if v is not None)
    if _single(job_id, every, filters, "--from-provider"):
        assert job_id is not None
        queue = requeue(job_id)
        obj.audit("requeue", [job_id], detail)
        warnings = ops.unserved(obj.store, sent_to)
        if as_json:
            _emit({"id": job_id, "state": "queued", "queue": queue, "warnings": warnings})
        else:
            click.echo(f"requeued {job_id} to {queue}")
        _warn(warnings)
        return
    where = _where(**filters)
    to = "".join(
        f" {label} {value}"
        for label, value in (
            ("to queue", to_queue),
            ("to provider", provider),
            ("with budget", budget),
        )
        if value is not None
    )
    if not _confirmed(obj, "requeue", where, yes, as_json, to=to):
        return
    result = ops.bulk(obj.store, requeue, where)
    obj.audit("requeue", result.done, f"{detail} all matching".strip())
    warnings = ops.unserved(obj.store, sent_to)
    _report(result, "requeued", as_json, warnings=warnings)
    _warn(warnings)


@spill.command("drop")
@click.argument("job_id", required=False)
@click.option("--all", "every", is_flag=True, help="Every spilled job that matches the filters.")
@_filters
@click.option("--why", "why", default="dropped by operator", show_default=True)
@click.option("--yes", is_flag=True, help="With --all: do not ask.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_obj
@reports_errors
def spill_drop(
    obj: Context,
    /,
    job_id: str | None,
    *,
    every: bool,
    why: str,
    yes: bool,
    as_json: bool,
    **filters: Any,
) -> None:
    """Give up on a spilled job (or --all that match); its partial text stays readable
    until it expires."""
    from resumeq.producer import ops  # noqa: PLC0415

    if _single(job_id, every, filters):
        assert job_id is not None
        ops.drop_spilled(obj.store, job_id, reason=why)
        obj.audit("drop", [job_id], why)
        if as_json:
            _emit({"id": job_id, "state": "dropped"})
        else:
            click.echo(f"dropped {job_id}")
        return
    where = _where(**filters)
    if not _confirmed(obj, "drop", where, yes, as_json):
        return
    result = ops.bulk(obj.store, lambda one: ops.drop_spilled(obj.store, one, reason=why), where)
    obj.audit("drop", result.done, f"{why} (all matching)")
    _report(result, "dropped", as_json)


def _report(
    result: ops.BulkResult, verb: str, as_json: bool, *, warnings: list[str] | None = None
) -> None:
    if as_json:
        _emit({**result.as_dict(), **({"warnings": warnings} if warnings is not None else {})})
        return
    click.echo(f"{verb} {len(result.done)}")
    for job_id, why in result.skipped.items():
        click.echo(f"skipped {job_id}: {why}", err=True)


def _warn(warnings: list[str]) -> None:
    """Each warning on stderr, in JSON mode too (stdout stays one JSON object)."""
    for line in warnings:
        click.echo(f"warning: {line}", err=True)


@spill.command("export")
@_filters
@click.pass_obj
@reports_errors
def spill_export(obj: Context, /, **filters: Any) -> None:
    """Spilled jobs that match as JSON lines: reason, conversation, partial text, ledger."""
    from resumeq.producer import ops  # noqa: PLC0415

    for line in ops.spill_export_lines(obj.store, _where(**filters)):
        click.echo(line, nl=False)
