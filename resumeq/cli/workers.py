"""Processes: the worker and the janitor. Each imports its machinery when it runs (a
worker loads none of the janitor's, nor the HTTP server's)."""

from __future__ import annotations

import logging
import signal
import threading

import click

from resumeq.cli._base import Context, _emit, cli, reports_errors
from resumeq.core.errors import ConfigError
from resumeq.worker import heap


@cli.command()
@click.option("--queues", "-q", multiple=True, help="Queue to serve (repeatable).")
@click.option("--burst", is_flag=True, help="Exit once the queues are empty.")
@click.option(
    "--concurrency",
    "-c",
    type=int,
    default=None,
    help="Attempts this process runs at once (default: [worker] concurrency, 50).",
)
@click.pass_obj
@reports_errors
def worker(obj: Context, queues: tuple[str, ...], burst: bool, concurrency: int | None) -> None:
    """Run a worker (with RQ's scheduler) on resumeq's queues: one process, up to
    --concurrency attempts at once. SIGTERM or SIGINT hands every stream in flight back
    to its queue at once and exits; a second one stops cold.

    A profile whose ``api_key_env`` variable is not set is a warning line, not a refusal
    to start: this worker may serve only some profiles."""
    if concurrency is not None and concurrency < 1:
        raise ConfigError(f"--concurrency must be at least 1, not {concurrency}")
    heap.reexec_without_thread_caches()  # before a warning is printed or a thread starts
    from resumeq.worker.rq_worker import exit_now, missing_api_keys, run_worker  # noqa: PLC0415

    for profile, variable in missing_api_keys(obj.settings):
        click.echo(
            f"resumeq: warning: profile {profile!r} reads its API key from {variable}, "
            "which is unset or empty here: its jobs will fail (401) on this worker",
            err=True,
        )
    exit_now(run_worker(obj.settings, queues, burst=burst, concurrency=concurrency))


@cli.command()
@click.option("--once", is_flag=True, help="One sweep, then exit.")
@click.option("--interval", type=float, default=None, help="Seconds between sweeps.")
@click.option("--json", "as_json", is_flag=True, help="With --once: print the sweep as JSON.")
@click.pass_obj
@reports_errors
def janitor(obj: Context, once: bool, interval: float | None, as_json: bool) -> None:
    """Reap jobs whose worker died and resume, spill or abandon them."""
    from resumeq.janitor import Janitor  # noqa: PLC0415
    from resumeq.worker.context import build_context  # noqa: PLC0415

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    # Its connections go unnamed: it holds no leases (and a Redis without CLIENT SETNAME
    # refuses nothing of it).
    sweeper = Janitor(build_context(obj.settings, named=False))
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
