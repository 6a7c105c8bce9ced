"""A fake LLM provider on loopback for tests, benchmarks and the demo (SPEC §14, §15).

It speaks OpenAI Chat Completions (``/v1/chat/completions``), Anthropic Messages
(``/v1/messages``, ``/v1/messages/count_tokens``) and ``/tokenize`` (vLLM's or llama.cpp's).
Its completion is a deterministic function of the system text and the last original user
message, so a continuation from a stored prefix yields exactly the rest of the canonical text.
Markers in those texts shape it: ``[fake:GENRE]`` for text that repeats itself (code, tables,
songs, ...), ``[fake:reasoning=N]`` for N reasoning tokens first. The OpenAI wire behaves as
vLLM or llama.cpp does where they differ (``engine``). Faults are queued through
``/_fake/faults`` or drawn at random from a seeded plan (chaos, set through ``/_fake/config``
or :meth:`FakeProvider.chaos`); every request is journalled at ``/_fake/requests``.
"""

from resumeq.core.continuation import PARTIAL_CLOSE, PARTIAL_OPEN
from resumeq.fake.conversation import JSON_OBJECT_NOTE, SCHEMA_NOTE, partial_tail
from resumeq.fake.engine import Engine
from resumeq.fake.faults import Fault, FaultKind
from resumeq.fake.markers import GENRES
from resumeq.fake.prompt import OPENAI_CACHE_MIN_TOKENS, OPENAI_CACHE_STEP_TOKENS
from resumeq.fake.server import FakeProvider, serve
from resumeq.fake.text import VOCABULARY, count_tokens, token_id, tokenize

__all__ = [
    "GENRES",
    "JSON_OBJECT_NOTE",
    "OPENAI_CACHE_MIN_TOKENS",
    "OPENAI_CACHE_STEP_TOKENS",
    "PARTIAL_CLOSE",
    "PARTIAL_OPEN",
    "SCHEMA_NOTE",
    "VOCABULARY",
    "Engine",
    "FakeProvider",
    "Fault",
    "FaultKind",
    "count_tokens",
    "partial_tail",
    "serve",
    "token_id",
    "tokenize",
]
