"""Tools that need no Redis of yours: the demo and the fake provider."""

from __future__ import annotations

from typing import Any

import click

from resumeq.cli._base import _emit, _fail, cli, reports_errors


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
