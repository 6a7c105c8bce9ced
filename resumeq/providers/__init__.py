"""Provider clients: one interface, three wire formats (SPEC §5, §6)."""

from __future__ import annotations

import httpx

from resumeq.core.settings import ProviderProfile
from resumeq.providers.anthropic import AnthropicClient, AnthropicStream
from resumeq.providers.base import (
    OutputDelta,
    ProviderClient,
    ProviderStream,
    Started,
    StreamEvent,
    TextDelta,
    ToolCallDelta,
    ToolCallEnd,
    Usage,
    parse_retry_after,
)
from resumeq.providers.openai import OpenAIClient, OpenAIStream
from resumeq.providers.openai_responses import ResponsesClient, ResponsesStream


def make_client(profile: ProviderProfile, http: httpx.Client) -> ProviderClient:
    """The client for a profile's wire format (``fake`` speaks the OpenAI wire)."""
    if profile.kind == "anthropic":
        return AnthropicClient(profile, http)
    if profile.kind == "openai-responses":
        return ResponsesClient(profile, http)
    return OpenAIClient(profile, http)


__all__ = [
    "AnthropicClient",
    "AnthropicStream",
    "OpenAIClient",
    "OpenAIStream",
    "OutputDelta",
    "ProviderClient",
    "ProviderStream",
    "ResponsesClient",
    "ResponsesStream",
    "Started",
    "StreamEvent",
    "TextDelta",
    "ToolCallDelta",
    "ToolCallEnd",
    "Usage",
    "make_client",
    "parse_retry_after",
]
