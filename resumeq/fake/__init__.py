"""A fake LLM provider on loopback for tests, benchmarks and the demo (SPEC §14, §15).

It speaks OpenAI Chat Completions (``/v1/chat/completions``), Anthropic Messages
(``/v1/messages``, ``/v1/messages/count_tokens``), OpenAI Responses (``/v1/responses``, with
background responses read again from ``GET /v1/responses/{id}?stream=true&starting_after=N``)
and ``/tokenize`` (vLLM's or llama.cpp's). Its completion is a deterministic function of the
system text, the last original user message and the tool results after it, so a
continuation from a stored prefix yields exactly the rest of the canonical text. Markers in
those texts shape it: ``[fake:GENRE]`` for text that repeats itself (code, tables, songs,
...), ``[fake:reasoning=N]`` for N reasoning tokens first, ``[fake:refusal]`` for a refusal.

Tools and structured output (issue 33; :mod:`resumeq.fake.answer`, :mod:`resumeq.fake.shape`,
:mod:`resumeq.fake.documents`): with tools, ``[fake:tool]`` / ``[fake:tools=N]`` make the
answer the text then N calls (``tool_choice`` ``required`` or named: the calls alone; named:
one; ``none``: none), their arguments JSON valid for the tool's schema, a function of the
seed, the tool's name and its schema only, streamed a token at a time in each wire's own
events; a continuation's prefix is located in the text and the calls follow it again (new
ids, same arguments). An answer to a tool result is text. With a format (``response_format``,
Anthropic's ``output_config.format`` / ``output_format``, Responses' ``text.format``, or the
system note :data:`SCHEMA_NOTE` / :data:`JSON_OBJECT_NOTE` a continuation carries instead)
the text is a JSON document valid for the schema; a constrained format answers a continuation
with the whole document again, and Anthropic refuses a prefill with structured outputs (400).

The OpenAI wire behaves as vLLM or llama.cpp does where they differ (``engine``). Faults are
queued through ``/_fake/faults`` (``corrupt`` breaks the JSON from its token on) or drawn at
random from a seeded plan (chaos, set through ``/_fake/config`` or
:meth:`FakeProvider.chaos`); every request is journalled at ``/_fake/requests``, with the
calls it sent; ``POST /_fake/canonical`` (:meth:`FakeProvider.canonical`) tells the uncut
answer to a request: its text, calls and document.
"""

from resumeq.core.answer import JSON_OBJECT_NOTE, SCHEMA_NOTE
from resumeq.core.continuation import PARTIAL_CLOSE, PARTIAL_OPEN
from resumeq.fake.conversation import partial_tail
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
