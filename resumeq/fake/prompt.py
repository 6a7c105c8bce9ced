"""Input tokens: how a conversation is laid out as prompt tokens, and the prompt cache.

Layout: each message is ``<|role|>``, its content tokens, then ``<|end|>``; the prompt ends with
``<|assistant|>``. A final assistant message being continued stays open (no ``<|end|>``, no
``<|assistant|>``). So ``[user: X]`` costs ``count_tokens(X) + 3`` input tokens. An assistant
message's tool calls follow its content: each call's name and arguments, as tokens. Tool
definitions and a response format are not billed.

Caching follows the real APIs. OpenAI: a prompt of at least 1024 tokens whose prefix was seen
before reports ``cached_tokens`` for the longest such prefix, in steps of 128 past 1024.
Anthropic: the prompt up to the last ``cache_control`` breakpoint is written to the cache
(``cache_creation_input_tokens``) and read from it next time (``cache_read_input_tokens``);
no minimum length applies. Entries are per wire and model.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass

from resumeq.fake.conversation import Conversation
from resumeq.fake.text import tokenize

END = "<|end|>"
OPENAI_CACHE_MIN_TOKENS = 1024
OPENAI_CACHE_STEP_TOKENS = 128


@dataclass(frozen=True)
class PromptLayout:
    tokens: tuple[str, ...]
    breakpoints: tuple[int, ...]  # token counts at the end of blocks marked cache_control

    def __len__(self) -> int:
        return len(self.tokens)


def layout(conversation: Conversation, *, generation_prompt: bool = True) -> PromptLayout:
    tokens: list[str] = []
    breakpoints: list[int] = []
    messages = conversation.messages
    for index, message in enumerate(messages):
        tokens.append(f"<|{message.role}|>")
        for block in message.blocks:
            tokens.extend(tokenize(block.text))
            if block.cache_control:
                breakpoints.append(len(tokens))
        for call in message.tool_calls:
            tokens.extend(tokenize(call.name))
            tokens.extend(tokenize(call.arguments))
        if index == len(messages) - 1 and message.prefill:
            return PromptLayout(tuple(tokens), tuple(breakpoints))
        tokens.append(END)
    if generation_prompt:
        tokens.append("<|assistant|>")
    return PromptLayout(tuple(tokens), tuple(breakpoints))


def _prefix_keys(namespace: str, tokens: tuple[str, ...], cuts: list[int]) -> list[bytes]:
    """A key for ``tokens[:cut]`` for every cut (ascending), hashing each token once."""
    digest = hashlib.sha256(namespace.encode("utf-8"))
    keys: list[bytes] = []
    done = 0
    for cut in cuts:
        digest.update("\x00".join(tokens[done:cut]).encode("utf-8") + b"\x00")
        done = cut
        keys.append(digest.copy().digest())
    return keys


@dataclass(frozen=True)
class CacheUse:
    read: int = 0
    created: int = 0


class PromptCache:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keys: set[bytes] = set()

    def clear(self) -> None:
        with self._lock:
            self._keys.clear()

    def _use(self, namespace: str, prompt: PromptLayout, cuts: list[int]) -> int:
        """Longest cut already cached (0 if none); then every cut is cached."""
        keys = _prefix_keys(namespace, prompt.tokens, cuts)
        with self._lock:
            hits = [cut for cut, key in zip(cuts, keys, strict=True) if key in self._keys]
            self._keys.update(keys)
        return max(hits, default=0)

    def openai(self, model: str, prompt: PromptLayout) -> CacheUse:
        cuts = list(range(OPENAI_CACHE_MIN_TOKENS, len(prompt) + 1, OPENAI_CACHE_STEP_TOKENS))
        return CacheUse(read=self._use(f"openai\x00{model}", prompt, cuts))

    def anthropic(self, model: str, prompt: PromptLayout) -> CacheUse:
        cuts = sorted(set(prompt.breakpoints))
        if not cuts:
            return CacheUse()
        read = self._use(f"anthropic\x00{model}", prompt, cuts)
        return CacheUse(read=read, created=cuts[-1] - read)
