"""Counting endpoints, one format per engine (``tokenizer`` in a profile).

- ``vllm`` — ``POST {root}/tokenize`` with ``{"model", "prompt", "add_special_tokens":
  false}``; answers ``{"count", "tokens", ...}``.
- ``llamacpp`` — ``POST {root}/tokenize`` with ``{"content", "add_special": false}``;
  answers ``{"tokens": [id, ...]}`` (or ``[{"id", "piece"}, ...]``). Given a body it does
  not understand it answers ``{"tokens": []}`` with a 200, so an empty list for text that is
  not empty is refused, never taken for zero.
- ``anthropic`` — ``POST {base}/v1/messages/count_tokens`` counts a whole one-message
  prompt: the framing of such a prompt, measured with a one-token probe, is subtracted.

``{root}`` is the base URL without ``/v1``. Each reader checks the answer's shape and
raises :class:`~resumeq.core.errors.UnreadableCount` for anything that is not a count; whether
a count is believable is decided in :mod:`resumeq.core.counting`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from resumeq.core.errors import UnreadableCount
from resumeq.core.settings import ProviderProfile
from resumeq.providers.counts import int_or_none


class Poster(Protocol):
    def __call__(
        self, url: str, body: Mapping[str, Any], *, timeout_s: float | None
    ) -> dict[str, Any]: ...


def _root(profile: ProviderProfile) -> str:
    return profile.base_url.removesuffix("/v1")


def _token_list(data: Mapping[str, Any], where: str) -> int:
    tokens = data.get("tokens")
    if not isinstance(tokens, list):
        raise UnreadableCount(f"{where} answered no token list: {str(data)[:120]}")
    for token in tokens:
        ident = token.get("id") if isinstance(token, dict) else token
        if int_or_none(ident) is None:
            raise UnreadableCount(
                f"{where} answered a token list of {type(token).__name__}s, not token ids"
            )
    return len(tokens)


def vllm(
    profile: ProviderProfile, post: Poster, text: str, model: str, timeout_s: float | None
) -> int:
    url = f"{_root(profile)}/tokenize"
    body = {"model": model, "prompt": text, "add_special_tokens": False}
    data = post(url, body, timeout_s=timeout_s)
    count = int_or_none(data.get("count"))
    listed = _token_list(data, url) if "tokens" in data else None
    if count is None and listed is None:
        raise UnreadableCount(f"{url} answered neither count nor tokens")
    if count is not None and listed is not None and count != listed:
        raise UnreadableCount(f"{url} answered count {count} for {listed} tokens")
    return count if count is not None else listed  # type: ignore[return-value]


def llamacpp(
    profile: ProviderProfile, post: Poster, text: str, model: str, timeout_s: float | None
) -> int:
    url = f"{_root(profile)}/tokenize"
    data = post(url, {"content": text, "add_special": False}, timeout_s=timeout_s)
    return _token_list(data, url)


def anthropic(
    profile: ProviderProfile, post: Poster, text: str, model: str, timeout_s: float | None
) -> int:
    url = f"{profile.base_url}/v1/messages/count_tokens"

    def count(content: str) -> int:
        body = {"model": model, "messages": [{"role": "user", "content": content}]}
        data = post(url, body, timeout_s=timeout_s)
        value = int_or_none(data.get("input_tokens"))
        if value is None:
            raise UnreadableCount(f"{url} answered no input_tokens")
        return value

    framing = count("x") - 1
    return count(text) - framing


Reader = Callable[[ProviderProfile, Poster, str, str, float | None], int]

READERS: dict[str, Reader] = {"vllm": vllm, "llamacpp": llamacpp, "anthropic": anthropic}
