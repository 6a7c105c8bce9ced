"""What the tests that run ``resumeq serve`` share: bearer tokens in the config's form, the
fake provider's profile on the OpenAI wire, and whether the server answers yet."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from typing import Any

import httpx

from resumeq.fake import FakeProvider


def token_entries(roles: Mapping[str, str], bearer: Callable[[str], str]) -> list[dict[str, str]]:
    """``[server] tokens`` for each name → role of ``roles``, the token ``bearer(name)``."""
    return [
        {"sha256": hashlib.sha256(bearer(name).encode()).hexdigest(), "role": role, "name": name}
        for name, role in roles.items()
    ]


def fake_profile(fake: FakeProvider) -> dict[str, Any]:
    """A profile for the fake on the OpenAI wire, counted by its usage, continued as vLLM
    continues a final message."""
    return {"kind": "openai", "base_url": fake.openai_base_url, "counting": "usage",
            "continue_mode": "continue_final_message"}  # fmt: skip


def console_up(base: str) -> bool:
    """Whether ``resumeq serve`` at ``base`` answers (its login page needs no token)."""
    try:
        return httpx.get(f"{base}/console/login", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False
