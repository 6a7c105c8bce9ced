"""Commands on jobs: enqueue, status, tail, stats, cancel, purge.

Each command imports what it uses when it runs: registering them loads none of the store,
redis-py, RQ or pydantic.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import click

from resumeq.cli._base import EXIT_ERROR, Context, _emit, cli, reports_errors
from resumeq.cli.spill import parse_age
from resumeq.core.errors import InvalidTransition, ProviderError, ResumeqError
from resumeq.core.states import ENDED_SCAN_MAX, LIVE_STATES, JobState
from resumeq.store import keys

#: States whose ``reason`` says why the job is in them; a running job's, or an ended
#: one's that finished or failed, is left over from an earlier state.
_REASON_STATES = ("queued", "spilled", "abandoned", "cancelled", "dropped")


def _row(key: str, value: object) -> str:
    return f"{key:>19}: {value}"  # the widest: spent_output_tokens


def _attempt_line(a: dict[str, Any]) -> str:
    """One ledger record, with only the counts that are known: what the provider counted
    (None: it did not say), what was persisted, and its characters unless a record
    written without them shows 0 beside its bytes."""
    cut = a.get("cut")
    head = f"#{a['attempt']} {a['kind']} {a['outcome']}" + (
        f" ({cut})" if cut and cut != "finished" else ""
    )
    counted = []
    if a.get("input_tokens") is not None:
        cached = a.get("cached_input_tokens")
        counted.append(f"in {a['input_tokens']}" + (f" ({cached} cached)" if cached else ""))
    if a.get("output_tokens") is not None:
        counted.append(f"out {a['output_tokens']}")
    if a.get("reasoning_tokens") is not None:
        counted.append(f"reasoning {a['reasoning_tokens']}")
    parts = [f"provider counted {', '.join(counted)}"] if counted else []
    if a.get("billed_lower_bound"):
        parts.append("billed at least that")
    persisted = f"persisted {a.get('output_tokens_persisted', 0)} tokens"
    if not a.get("counts_exact"):
        persisted += " (estimate)"
    size = a.get("bytes_persisted", 0)
    if size:
        chars = a.get("chars_persisted", 0)
        persisted += f", {chars} chars" if chars else ", chars unknown"
        persisted += f", {size} bytes"
    parts.append(persisted)
    if a.get("regenerated_tokens"):
        parts.append(f"{a['regenerated_tokens']} tokens asked again ({a.get('regenerated', '')})")
    return f"{head}: {'; '.join(parts)}"


def _status_lines(info: dict[str, Any]) -> list[str]:
    """The human view of ``status --json``: the same facts, an unknown one left out."""
    lines = [_row("id", info["id"]), _row("state", info["state"])]
    if info["state"] in _REASON_STATES and info["reason"]:
        lines.append(_row("reason", info["reason"]))
    if info["finish_reason"]:
        lines.append(_row("finish", info["finish_reason"]))
    if info["error"]:
        lines.append(_row("error", info["error"]))
    lease = info.get("lease")
    if lease:
        n = lease["attempt"]
        ms = lease["expires_in_ms"]
        lines.append(
            _row(
                "lease",
                f"held by {lease['holder']}"
                + (f" (attempt {n})" if n is not None else "")
                + (f", expires in {ms / 1000:.1f} s" if ms else ", expired: a janitor reaps it"),
            )
        )
    for key in ("provider", "model", "queue", "revision", "attempt"):
        lines.append(_row(key, info[key]))
    exact = "exact" if info["counts_exact"] else "estimated"
    spent = f"{info['spent_output_tokens']} of budget_tokens {info['budget_tokens']} ({exact})"
    lines.append(_row("spent_output_tokens", f"{spent}, floor_tokens {info['floor_tokens']}"))
    lines.extend(_row("attempt", _attempt_line(a)) for a in info["attempts"])
    lines.append(_row("text", f"{len(info['text'])} characters"))
    for call in info.get("tool_calls") or ():
        lines.append(_row("tool call", f"{call['name']} {call['id']}: {call['arguments']}"))
    if info.get("refusal"):
        lines.append(_row("refusal", info["refusal"]))
    return lines


@cli.command()
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_obj
@reports_errors
def status(obj: Context, job_id: str, as_json: bool) -> None:
    """Show a job: its state, spent output tokens, revision, lease, attempts and text."""
    from resumeq.producer import ops  # noqa: PLC0415

    info = ops.status_dict(obj.store, job_id)
    if as_json:
        _emit(info)
        return
    for line in _status_lines(info):
        click.echo(line)
    click.echo(info["text"])


def _json_file(path: str, hint: str) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise click.BadParameter(str(exc.strerror or exc), param_hint=hint) from None
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint=hint) from None


def _tool_choice(value: str) -> Any:
    """``auto``, ``none``, ``required``, or a tool's name (that tool forced)."""
    if value in ("auto", "none", "required"):
        return value
    return {"type": "function", "function": {"name": value}}


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
        spec["messages"] = _json_file(options["messages"], "--messages")
    else:
        raise click.UsageError("give --prompt TEXT or --messages FILE")
    if options["tools"] is not None:
        spec["tools"] = _json_file(options["tools"], "--tools")
    if options["tool_choice"] is not None:
        spec["tool_choice"] = _tool_choice(options["tool_choice"])
    if options["response_format"] is not None:
        spec["response_format"] = _json_file(options["response_format"], "--response-format")
    if options["floor"] is not None:
        spec["floor_tokens"] = options["floor"]
    exit_policy = {
        k: options[o]
        for k, o in (
            ("on_cut", "on_cut"),
            ("droppable", "droppable"),
            ("max_attempts", "max_attempts"),
            ("on_invalid", "on_invalid"),
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
@click.option(
    "--tools", default=None, help="A JSON file with a list of tools (OpenAI's function shape)."
)
@click.option(
    "--tool-choice", default=None, help="auto, none, required, or the name of a tool to force."
)
@click.option(
    "--response-format",
    default=None,
    help='A JSON file with a response_format ({"type": "json_schema", ...} or json_object).',
)
@click.option("--floor", type=int, default=None, help="Smallest remaining budget worth resuming.")
@click.option("--on-cut", type=click.Choice(["resume", "abandon", "spill"]), default=None)
@click.option("--droppable/--no-droppable", default=None)
@click.option("--max-attempts", type=int, default=None)
@click.option(
    "--on-invalid",
    type=click.Choice(["retry", "spill", "fail"]),
    default=None,
    help="What an answer that is not the asked shape leads to (default spill).",
)
@click.option("--idempotency-key", default=None)
@click.option("--queue", default=keys.DEFAULT_QUEUE, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_obj
@reports_errors
def enqueue(obj: Context, /, as_json: bool, queue: str, **options: Any) -> None:
    """Enqueue a generation job; prints its id."""
    from resumeq.producer.enqueue import enqueue_job  # noqa: PLC0415

    spec = _spec_from_options(options)
    digest = obj.digest
    providers = digest.providers if digest is not None else ()
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
    from resumeq.producer.client import Client  # noqa: PLC0415

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
@click.option("--provider", default=None, help="Only this provider profile's totals.")
@click.option(
    "--forget-provider",
    "forget",
    default=None,
    metavar="NAME",
    help="Retire a provider profile's totals and its metrics series (the totals of all "
    "providers keep what it counted).",
)
@click.pass_obj
@reports_errors
def stats(obj: Context, as_json: bool, provider: str | None, forget: str | None) -> None:
    """Jobs by state (now, and ended since the totals began) and token totals; with
    --provider, the token and attempt totals of that provider profile's attempts."""
    if forget is not None:
        if provider is not None:
            raise click.UsageError("--forget-provider goes alone, without --provider")
        _forget_provider(obj, forget, as_json)
        return
    from resumeq.producer import ops  # noqa: PLC0415

    info = ops.stats(obj.store, provider)
    if as_json:
        _emit(info)
        return
    if provider is not None:
        click.echo(f"provider {provider}: what its attempts spent")
    else:
        click.echo(f"jobs: {info['jobs']}")
        for state, n in info["states"].items():
            if n:
                click.echo(f"  {state:<10} {n}")
    for key in (*ops.TOTAL_FIELDS, "attempts_in_flight"):
        click.echo(f"{key}: {info[key]}")
    if not info["counts_complete"]:
        click.echo("counts incomplete: attempts in flight, or a bill known only as a lower bound")


def _forget_provider(obj: Context, provider: str, as_json: bool) -> None:
    try:
        keys.totals_of(provider)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--forget-provider") from None
    if not obj.store.forget_provider(provider):
        raise click.BadParameter(
            f"no provider {provider!r} has totals (stats --json lists them)",
            param_hint="--forget-provider",
        )
    if as_json:
        _emit({"forgotten": provider})
    else:
        click.echo(f"forgot provider {provider}: its totals and its metrics series")


@cli.command()
@click.argument("job_id")
@click.option("--reason", default="cancelled by operator", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_obj
@reports_errors
def cancel(obj: Context, job_id: str, reason: str, as_json: bool) -> None:
    """Cancel a job that has not ended; its worker stops streaming at its next flush.

    A job that had already ended is left as it was, and said so (``already_ended`` in the
    JSON, which is the job's status either way); the exit code is 0 both ways."""
    from resumeq.producer import ops  # noqa: PLC0415
    from resumeq.producer.enqueue import cancel_job  # noqa: PLC0415

    try:
        revision = cancel_job(obj.store, job_id, reason=reason)
        already_ended = False
        obj.audit("cancel", [job_id], reason)
    except InvalidTransition as exc:
        if not JobState(exc.state).terminal:
            raise
        already_ended = True
    stopped, stop_error = (None, None) if already_ended else _stop_response(obj, job_id)
    info = ops.status_dict(obj.store, job_id)
    if as_json:
        extra = {"response_cancelled": stopped} if stopped else {}
        if stop_error:
            extra["response_cancel_error"] = stop_error
        _emit({**info, "already_ended": already_ended, **extra})
    elif already_ended:
        click.echo(
            f"{job_id} had already ended ({info['state']}, revision {info['revision']}): "
            "nothing to cancel"
        )
    else:
        click.echo(f"cancelled {job_id} (revision {revision})")
        if stopped:
            click.echo(f"stopped its background response {stopped} at the provider")
        if stop_error:
            click.echo(f"warning: {stop_error}", err=True)


def _stop_response(obj: Context, job_id: str) -> tuple[str | None, str | None]:
    """A cancelled job's background response stopped at the provider now (a janitor would
    do it at its next sweep): its id if it was stopped, and what went wrong if anything."""
    try:
        record = obj.store.get(job_id)
        if record.response_id is None:  # the usual case: no provider clients to load
            return None, None
        from resumeq.providers import background  # noqa: PLC0415

        found = background.response_of(record)
        if found is not None and background.stop_background_response(
            obj.settings, found[2], found[1]
        ):
            return found[1], None
    except ProviderError as exc:  # the job is cancelled all the same; a janitor tries again
        return None, f"its background response was not cancelled at the provider: {exc}"
    except ResumeqError as exc:
        return None, f"its background response was not looked up: {exc}"
    return None, None


@cli.command()
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_obj
@reports_errors
def purge(obj: Context, job_id: str, as_json: bool) -> None:
    """Remove a job and everything it owns now (a running job: cancel it first)."""
    from resumeq.producer.enqueue import purge_job  # noqa: PLC0415

    removed = purge_job(obj.store, job_id)
    obj.audit("purge", [job_id])
    if as_json:
        _emit({"id": job_id, "purged": True, "keys_removed": removed})
    else:
        click.echo(f"purged {job_id} ({removed} keys)")


#: Every state, the live ones (each with an index of its own) first.
_STATES = (*LIVE_STATES, *sorted(s.value for s in JobState if s.terminal))


@cli.command("jobs")
@click.option(
    "--state",
    type=click.Choice(_STATES),
    required=True,
    help="Live states are read from their own index, longest there first; ended ones from "
    "the index of every job, newest first, at most --scan of it.",
)
@click.option("--queue", default=None, help="Only this queue's jobs.")
@click.option("--limit", type=click.IntRange(1, 10_000), default=100, show_default=True)
@click.option(
    "--since",
    default=None,
    metavar="AGE",
    help="Ended states: only jobs that ended within this long (90s, 10m, 2h, 1d).",
)
@click.option(
    "--scan",
    type=click.IntRange(1, 1_000_000),
    default=ENDED_SCAN_MAX,
    show_default=True,
    help="Ended states: the most entries of the index of every job read.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_obj
@reports_errors
def jobs_command(
    obj: Context,
    /,
    *,
    state: str,
    queue: str | None,
    limit: int,
    since: str | None,
    scan: int,
    as_json: bool,
) -> None:
    """Jobs in a state, from an index (never a scan of Redis): a live state's own, longest
    there first; for an ended state, the index of every job, newest first, bounded by
    --scan and saying how much of it was read."""
    from resumeq.producer import ops  # noqa: PLC0415

    if state in LIVE_STATES:
        if since is not None:
            raise click.BadParameter(
                f"applies to ended states, not {state!r} (listed longest there first)",
                param_hint="'--since'",
            )
        found = ops.list_jobs(obj.store, state, queue=queue, limit=limit)
        if as_json:
            _emit({"state": state, "queue": queue, "jobs": found})
            return
        _print_jobs(found)
        click.echo(f"{len(found)} {state}")
        return
    since_ms = None
    if since is not None:
        since_ms = int((time.time() - parse_age(since)) * 1000)
    ended = ops.list_ended(
        obj.store, state, queue=queue, limit=limit, since_ms=since_ms, scan_max=scan
    )
    if as_json:
        _emit({"state": state, "queue": queue, "since": since, "jobs": ended.jobs,
               "examined": ended.examined, "more": ended.more})  # fmt: skip
        return
    _print_jobs(ended.jobs)
    read = f"{ended.examined} of the newest jobs read"
    if ended.more and len(ended.jobs) < limit:
        read += f"; older ones not read (--scan {scan})"
    click.echo(f"{len(ended.jobs)} {state} ({read})")


def _print_jobs(found: list[dict[str, Any]]) -> None:
    for j in found:
        click.echo(
            f"{j['id']}  {j['queue']}  {j['provider']}  attempt {j['attempt']}  "
            f"{j['spent_output_tokens']}/{j['budget_tokens']}  {j['reason'] or ''}".rstrip()
        )
