"""vLLM's ``POST /tokenize``, over the fake provider's tokenizer and prompt layout."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from resumeq.fake.conversation import InvalidRequest, conversation_of
from resumeq.fake.prompt import layout
from resumeq.fake.text import token_id, tokenize

MAX_MODEL_LEN = 131072


def vllm_tokenize(body: Mapping[str, Any]) -> dict[str, Any]:
    """vLLM's ``/tokenize``: ``{"prompt": ...}`` or ``{"messages": [...]}``."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        tokens = tokenize(prompt)
    elif body.get("messages") is not None:
        generation_prompt = body.get("add_generation_prompt", True) is not False
        conversation = conversation_of(body.get("messages"))
        tokens = list(layout(conversation, generation_prompt=generation_prompt).tokens)
    else:
        raise InvalidRequest("either 'prompt' (a string) or 'messages' is required", "prompt")
    return {
        "count": len(tokens),
        "max_model_len": MAX_MODEL_LEN,
        "tokens": [token_id(token) for token in tokens],
        "token_strs": None,
    }
