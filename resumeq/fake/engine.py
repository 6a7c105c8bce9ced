"""Where the engines behind OpenAI-compatible servers differ, and the fake can play either.

- ``prefill_echo``: llama.cpp's server repeats a continued final assistant message (plain
  prefill, ``prefix: true`` or ``continue_final_message``) in its first content delta, glued
  to the first generated token (a chunk of its own when nothing is generated); a
  non-streaming answer's content is prefill + generated text. The echo is not output: usage
  and a fault's ``after_tokens`` count generated tokens only.
- ``continuous_usage``: vLLM honours ``stream_options.continuous_usage_stats``; llama.cpp
  ignores it and reports usage only in the last chunk.
- ``tokenize``: the format of ``POST /tokenize``, vLLM's (:mod:`resumeq.fake.vllm`) or
  llama.cpp's (:mod:`resumeq.fake.llamacpp`).

``engine`` names a preset of all three; keys given with it override the preset. The
Anthropic wire is Anthropic's own API and has none of these.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from resumeq.fake.wire import Generation

EngineName = Literal["vllm", "llamacpp"]
TokenizeFormat = Literal["vllm", "llamacpp"]
#: The keys of ``/_fake/config`` (and keyword arguments) that set the engine's behaviour.
KEYS = ("engine", "prefill_echo", "continuous_usage", "tokenize")


class Engine(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    prefill_echo: bool = False
    continuous_usage: bool = True
    tokenize: TokenizeFormat = "vllm"

    @property
    def name(self) -> str:
        """The preset this is, or ``custom``."""
        return next((name for name, preset in PRESETS.items() if preset == self), "custom")

    def describe(self) -> dict[str, Any]:
        return {"engine": self.name, **self.model_dump()}

    def configure(self, engine: str | None = None, **overrides: Any) -> Engine:
        """This engine, or the preset ``engine``, with ``overrides`` (None: unchanged)."""
        base = self
        if engine is not None:
            if engine not in PRESETS:
                raise ValueError(f"engine: expected one of {sorted(PRESETS)}, not {engine!r}")
            base = PRESETS[engine]
        changes = {key: value for key, value in overrides.items() if value is not None}
        return Engine.model_validate({**base.model_dump(), **changes})

    def shape(self, wire: str, request: Generation) -> Generation:
        """The request as this engine serves it on ``wire``."""
        if wire != "openai":
            return request
        echo, continuation = "", request.continuation
        repeats = continuation is not None and continuation.mode != "instruction"
        # A model bound to a format answers the whole document again: nothing to echo.
        if self.prefill_echo and repeats and not request.shape.constrained:
            assert continuation is not None
            echo = continuation.prefix
        return dataclasses.replace(
            request,
            echo=echo,
            continuous_usage=request.continuous_usage and self.continuous_usage,
        )


PRESETS: dict[str, Engine] = {
    "vllm": Engine(),
    "llamacpp": Engine(prefill_echo=True, continuous_usage=False, tokenize="llamacpp"),
}
