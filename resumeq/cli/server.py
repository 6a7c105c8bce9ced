"""``resumeq serve`` and ``resumeq token new``."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import click

from resumeq.cli._base import Context, cli, reports_errors

if TYPE_CHECKING:
    from resumeq.core.settings import Role


@cli.command()
@click.option("--host", default=None, help="Address to bind (default: [server] host, 127.0.0.1).")
@click.option(
    "--port", default=None, type=click.IntRange(0, 65535), help="Default: [server] port, 8000."
)
@click.option(
    "--workers",
    default=1,
    show_default=True,
    type=click.IntRange(1, 64),
    help="Server processes sharing the port.",
)
@click.pass_obj
@reports_errors
def serve(obj: Context, host: str | None, port: int | None, workers: int) -> None:
    """Serve the HTTP API: jobs, their event streams (SSE, resumable), stats, health.

    Refuses a non-loopback address while no [server] tokens are configured."""
    # Imported here: the server's libraries are no part of a worker's memory.
    import uvicorn  # noqa: PLC0415

    from resumeq.server import check_exposure, create_app  # noqa: PLC0415

    settings = obj.settings
    server = settings.file.server
    host = host or server.host
    port = server.port if port is None else port
    check_exposure(settings, host)
    # The proxy headers are the app's to read, from [server] forwarded_allow_ips only
    # (uvicorn's own would believe any loopback peer, and not read the host).
    if workers == 1:
        uvicorn.run(
            create_app(settings), host=host, port=port, log_level="info", proxy_headers=False
        )
        return
    # Each server process builds the app from the environment (uvicorn's factory).
    os.environ["RESUMEQ_REDIS_URL"] = settings.redis_url
    if settings.config_path is not None:
        os.environ["RESUMEQ_CONFIG"] = str(settings.config_path)
    uvicorn.run(
        "resumeq.server:app_from_env",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_level="info",
        proxy_headers=False,
    )


@cli.group()
def token() -> None:
    """Bearer tokens for `resumeq serve`."""


@token.command("new")
@click.option(
    "--role", required=True, type=click.Choice(["producer", "operator", "viewer"]), help="Its role."
)
@click.option("--name", default=None, help="Whom its jobs belong to (default: its hash's head).")
def token_new(role: Role, name: str | None) -> None:
    """Print a fresh token and the line to add to [server] tokens (only its hash is kept)."""
    from resumeq.core.settings import ServerToken  # noqa: PLC0415
    from resumeq.server.auth import new_token  # noqa: PLC0415

    secret, line = new_token(role, name)
    if name is not None:
        try:
            ServerToken(sha256="0" * 64, role=role, name=name)
        except ValueError:
            raise click.BadParameter(
                "1 to 64 of A-Z a-z 0-9 _ . @ -", param_hint="--name"
            ) from None
    click.echo(f"token: {secret}")
    click.echo("add to the [server] tokens of the config file:")
    click.echo(f"  {line},")
