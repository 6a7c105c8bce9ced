"""schemathesis hooks (``SCHEMATHESIS_HOOKS``) for the rules of ``POST /v1/jobs`` that
compare one value with another, which JSON Schema cannot say (the OpenAPI document's
descriptions state them): a valid case is made to keep them, an invalid one is left as
generated.

- ``floor_tokens`` is under ``budget_tokens``, or 1;
- a body's ``idempotency_key`` is the ``Idempotency-Key`` header's, when both are sent;
- a key names one request: reused with another body or queue it is a 422 (the
  Idempotency-Key draft), so a generated key is made that request's own."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import schemathesis

KEY_MAX = 128


@schemathesis.hook
def before_call(ctx: Any, case: Any, kwargs: dict[str, Any]) -> None:
    if case.operation.path != "/v1/jobs" or case.method.upper() != "POST":
        return
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive:
        return
    body = case.body
    if not isinstance(body, dict):
        return
    budget, floor = body.get("budget_tokens"), body.get("floor_tokens")
    if _int(budget) and _int(floor) and floor != 1 and floor >= budget:
        body["floor_tokens"] = 1
    headers = case.headers or {}
    header = headers.get("Idempotency-Key")
    if isinstance(header, str):
        quoted = header.startswith('"')
        key = _own(header.strip('"'), body, case.query)
        headers["Idempotency-Key"] = f'"{key}"' if quoted else key
        if body.get("idempotency_key") is not None:
            body["idempotency_key"] = key
    elif isinstance(body.get("idempotency_key"), str):
        body["idempotency_key"] = _own(body["idempotency_key"], body, case.query)


def _int(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == int(value)


def _own(key: str, body: dict[str, Any], query: Any) -> str:
    """``key``, made the key of this request alone (a digest of its body and its queue
    appended)."""
    rest = {k: v for k, v in body.items() if k != "idempotency_key"}
    asked = json.dumps([rest, dict(query or {})], sort_keys=True, default=str)
    digest = hashlib.sha256(asked.encode()).hexdigest()[:16]
    return f"{key[: KEY_MAX - 17]}.{digest}"  # "." ends a credential's run
