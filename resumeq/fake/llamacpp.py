"""llama.cpp's ``POST /tokenize``, over the fake provider's tokenizer.

``{"content": str, "add_special": bool, "with_pieces": bool}`` answers ``{"tokens": [id, ...]}``,
or with ``with_pieces`` ``{"tokens": [{"id": id, "piece": str}, ...]}``. ``add_special`` puts
the model's BOS token first, as llama.cpp does for a model that has one. A body without
``content`` answers 200 ``{"tokens": []}``: llama.cpp does not refuse a body it does not
understand, so a client speaking vLLM's format to it counts nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from resumeq.fake.conversation import InvalidRequest
from resumeq.fake.text import token_id, tokenize

BOS = "<|bos|>"


def llamacpp_tokenize(body: Mapping[str, Any]) -> dict[str, Any]:
    content = body.get("content")
    if content is None:
        return {"tokens": []}
    if not isinstance(content, str):
        raise InvalidRequest("content: expected a string", "content")
    tokens = tokenize(content)
    if body.get("add_special") is True:
        tokens.insert(0, BOS)
    if body.get("with_pieces") is True:
        return {"tokens": [{"id": token_id(token), "piece": token} for token in tokens]}
    return {"tokens": [token_id(token) for token in tokens]}
