"""What the ``/_fake/config`` and ``/_fake/canonical`` admin endpoints do.

``POST /_fake/canonical`` takes a request's conversation (``messages`` and ``system`` in
either wire's form, or the Responses API's ``input`` and ``instructions``) and its
``tools``, ``tool_choice`` and format in any wire's form (resumeq's JobSpec has the Chat
form), and answers the uncut answer a fresh request gets: ``text``, ``tokens`` (its tokens),
``count``, ``genre``, ``reasoning``, ``reasoning_count``; ``tool_calls: [{"name",
"arguments", "tokens", "count"}]``; ``document`` (the JSON text, when the answer has a
format) and ``refusal`` (its text, when the model refuses). An answer that is calls alone
has ``text: ""``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from resumeq.fake.answer import answer_for
from resumeq.fake.anthropic_wire import chat_messages
from resumeq.fake.chaos import Chaos, ChaosConfig
from resumeq.fake.conversation import Conversation, InvalidRequest, conversation_of
from resumeq.fake.engine import KEYS
from resumeq.fake.plan import reasoning_tokens
from resumeq.fake.responses_input import items_to_messages
from resumeq.fake.shape import shape_of
from resumeq.fake.state import FakeState
from resumeq.fake.wire import positive_int


def configure(state: FakeState, body: Mapping[str, Any]) -> None:
    """Apply ``body``'s keys; the engine's (``engine`` and the keys it presets) together."""
    if any(key in body for key in KEYS):
        try:
            state.engine = state.engine.configure(**{key: body.get(key) for key in KEYS})
        except ValueError as exc:  # pydantic's ValidationError is one
            raise InvalidRequest(str(exc)) from exc
    if "completion_tokens" in body:
        state.completion_tokens = positive_int(body, "completion_tokens")
    if "token_delay_ms" in body:
        delay = body["token_delay_ms"]
        if isinstance(delay, bool) or not isinstance(delay, int | float) or delay < 0:
            raise InvalidRequest("token_delay_ms: expected a number of at least 0")
        state.token_delay_ms = float(delay)
    _configure_background(state, body)
    if "chaos" in body:
        chaos = body["chaos"]
        state.chaos = None if chaos is None else Chaos(ChaosConfig.model_validate(chaos))


def _configure_background(state: FakeState, body: Mapping[str, Any]) -> None:
    """The background responses' settings: their window, their time queued, and whether
    a stream of one ignores ``starting_after``."""
    for key, name in (("background_window_s", "window_s"), ("background_queued_s", "queued_s")):
        if key in body:
            value = body[key]
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise InvalidRequest(f"{key}: expected a number of at least 0")
            setattr(state.background, name, float(value))
    if "background_ignores_starting_after" in body:
        value = body["background_ignores_starting_after"]
        if not isinstance(value, bool):
            raise InvalidRequest("background_ignores_starting_after: expected true or false")
        state.background.ignores_starting_after = value


def canonical_of(state: FakeState, body: Any) -> dict[str, Any]:
    if not isinstance(body, Mapping):
        raise InvalidRequest("expected {'messages': [...], 'system': ...}")
    conversation = any_conversation(body)
    answer = answer_for(conversation, shape_of("any", body), state.completion_tokens)
    markers = conversation.markers()
    reasoning = reasoning_tokens(conversation.seed(), markers.reasoning)
    tokens = answer.target.tokens if answer.has_text else ()
    return {
        "text": "".join(tokens),
        "tokens": list(tokens),
        "count": len(tokens),
        "genre": markers.genre,
        "reasoning": "".join(reasoning),
        "reasoning_count": len(reasoning),
        **answer.describe(),
    }


def any_conversation(body: Mapping[str, Any]) -> Conversation:
    """The conversation of a request in any wire's form."""
    if "input" in body and "messages" not in body:
        return conversation_of(items_to_messages(body)[0])
    messages = body.get("messages")
    if isinstance(messages, list):
        chat: list[Any] = []
        for index, item in enumerate(messages):
            anthropic = isinstance(item, Mapping) and item.get("role") in ("user", "assistant")
            chat.extend(chat_messages(item, f"messages.{index}") if anthropic else [item])
        messages = chat
    return conversation_of(messages, body.get("system"))
