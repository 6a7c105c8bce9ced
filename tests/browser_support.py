"""What the browser tests share: Debian's chromium driven by Playwright (never a
downloaded build), screenshots a person can look at, and pages served from another origin."""

from __future__ import annotations

import contextlib
import http.server
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright import sync_api as playwright_sync

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
#: Where the screenshots go (the copies in ``docs/`` are refreshed from them by hand).
SHOTS = Path(__file__).resolve().parent.parent / "build" / "screenshots"


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """The system's chromium, launched by its path."""
    if CHROMIUM is None:
        pytest.fail(
            "chromium not found: `make test` installs Debian's package (apt-get install chromium)"
        )
    with playwright_sync.sync_playwright() as p:
        # Chromium's sandbox refuses to run as root; as anyone else it stays on.
        args = ["--no-sandbox"] if os.geteuid() == 0 else []
        launched = p.chromium.launch(executable_path=CHROMIUM, args=args)
        try:
            yield launched
        finally:
            launched.close()


def shot(page: Any, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


class StaticSite:
    """One HTML page served on loopback, at ``url``: another origin than the API's (another
    port; ``localhost`` is another site than ``127.0.0.1`` too)."""

    def __init__(self, body: bytes, *, host: str = "127.0.0.1") -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.origin = f"http://{host}:{self.port}"
        self.url = f"{self.origin}/"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> StaticSite:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)
