"""The ``resumeq`` command (SPEC §13, §15).

Every command takes ``--redis-url`` (or ``RESUMEQ_REDIS_URL``); every command that reports
takes ``--json`` and then prints one JSON object on stdout. Errors print one line on
stderr and exit non-zero, never a traceback. One module per command group; each registers
its commands on the group in :mod:`resumeq.cli._base`.
"""

from __future__ import annotations

import sys

import click

from resumeq.cli import jobs, server, spill, tools, workers
from resumeq.cli._base import cli
from resumeq.worker import heap

__all__ = ["cli", "jobs", "main", "server", "spill", "tools", "workers"]


def main() -> None:
    """The console script: a usage error is one line too, with click's exit code (2)."""
    heap.mark_entry_point()  # ``resumeq worker`` may start itself again (resumeq.worker.heap)
    try:
        code = cli.main(prog_name="resumeq", standalone_mode=False)
    except click.ClickException as exc:
        click.echo(f"resumeq: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except click.Abort:
        click.echo("resumeq: aborted", err=True)
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)
