"""The OpenAPI document's job spec against the model, in process, where a failure shows the
body: what schemathesis generates as valid for ``POST /v1/jobs`` (made to keep the rules
between fields by tests/fuzz/resumeq_hooks.py, as in tests/test_openapi_fuzz.py) the model
takes, and what it generates as invalid by the document the model refuses — tools, tool
choices, response formats and tool messages among them."""

from __future__ import annotations

import importlib.util
import json
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.generation import GenerationMode

from resumeq.core.errors import InvalidSpec
from resumeq.core.settings import ConfigFile, Settings
from resumeq.core.spec import parse_spec
from resumeq.server.openapi import document

pytestmark = pytest.mark.timeout(240)

CONFIG = ConfigFile.model_validate(
    {"providers": {"fake": {"kind": "openai", "base_url": "http://127.0.0.1:9/v1"}}}
)
DOCUMENT = document(Settings(file=CONFIG))
CREATE = schemathesis.openapi.from_dict(DOCUMENT)["/v1/jobs"]["POST"]
#: The document's JobSpec, to tell a body it refuses from a request refused elsewhere (a
#: negative case may break a header or the query instead).
BY_DOCUMENT = jsonschema.Draft202012Validator(
    {"$ref": "#/components/schemas/JobSpec", "components": DOCUMENT["components"]}
)


def _hooks() -> ModuleType:
    path = Path(__file__).parent / "fuzz" / "resumeq_hooks.py"
    found = importlib.util.spec_from_file_location("resumeq_hooks_in_process", path)
    assert found is not None and found.loader is not None
    module = importlib.util.module_from_spec(found)
    found.loader.exec_module(module)
    return module


HOOKS = _hooks()
SHAPE = ("tools", "tool_choice", "response_format")


def accepted(body: dict[str, Any]) -> bool:
    """What ``POST /v1/jobs`` makes of ``body``: the model's answer, and the provider one
    of the configured profiles."""
    try:
        spec = parse_spec(body, limits=CONFIG.limits)
    except InvalidSpec:
        return False
    return spec.provider in CONFIG.providers


def shapes(body: dict[str, Any]) -> set[str]:
    seen = {k for k in SHAPE if body.get(k) is not None}
    messages = body.get("messages")
    for message in messages if isinstance(messages, list) else ():
        if not isinstance(message, dict):
            continue
        if message.get("tool_calls"):
            seen.add("tool_calls")
        if message.get("role") == "tool":
            seen.add("tool message")
    return seen


def test_what_the_document_holds_valid_the_model_takes() -> None:
    seen: Counter[str] = Counter()
    refused: list[str] = []

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(case=CREATE.as_strategy(generation_mode=GenerationMode.POSITIVE))
    def check(case: Any) -> None:
        HOOKS.before_call(None, case, {})
        seen.update(shapes(case.body))
        if not accepted(case.body):
            refused.append(json.dumps(case.body)[:600])

    check()
    assert refused == [], refused[:3]
    assert all(seen[k] >= 5 for k in (*SHAPE, "tool_calls", "tool message")), seen


def test_what_the_document_refuses_the_model_refuses() -> None:
    seen: Counter[str] = Counter()
    taken: list[str] = []

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
    @given(case=CREATE.as_strategy(generation_mode=GenerationMode.NEGATIVE))
    def check(case: Any) -> None:
        body = case.body
        if not isinstance(body, dict) or BY_DOCUMENT.is_valid(body):
            return
        seen.update(shapes(body))
        if accepted(body):
            taken.append(json.dumps(body)[:600])

    check()
    assert taken == [], taken[:3]
    assert all(seen[k] >= 3 for k in SHAPE), seen
