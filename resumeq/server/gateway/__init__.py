"""The drop-in endpoints (SPEC §24): OpenAI's Chat Completions and Anthropic's Messages,
answered from resumeq jobs, so that an app that speaks either through its official SDK gets
streams that never break by changing its base URL."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response

from resumeq.server.gateway import chat, common, messages, models

Endpoint = Callable[[Request], Awaitable[Response]]

#: Each route: its path, its endpoint (errors in the wire's shape), its methods.
ROUTES: list[tuple[str, Endpoint, list[str]]] = [
    ("/v1/chat/completions", common.answered("openai", chat.chat_completions, chat.rename),
     ["POST"]),
    ("/v1/messages", common.answered("anthropic", messages.create_message), ["POST"]),
    ("/v1/models", models.list_models, ["GET"]),
]  # fmt: skip
