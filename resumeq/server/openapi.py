"""The service's OpenAPI 3.1 document (``GET /openapi.json``): the contract a generated
client and a fuzzer read. Every bound, pattern and enum the routes enforce is in it — the
configured providers as the ``provider`` enum of a new job, ``[worker] queues`` as the
``queue`` enum, the ``[limits]`` as bounds — and every status a route answers, with
problem+json. The patterns are the ones the code matches (:mod:`resumeq.core.spec_rules`,
:mod:`resumeq.store.keys`), written once for both engines.

Some rules of a job spec compare fields with each other, which JSON Schema cannot say (or
a fuzzer could not follow): a ``floor_tokens`` under ``budget_tokens`` (or 1), an
``idempotency_key`` in the body equal to the ``Idempotency-Key`` header when both are sent,
a ``tool_choice`` naming one of ``tools`` (and none without them but ``none``), a
``response_format`` only with a ``tool_choice`` that forces no call, tool names used once,
and a conversation's tool calls: ids used once, each tool message answering an earlier
call, each call naming a tool. A tool's ``parameters`` and a response format's ``schema``
are published as objects (a JSON Schema is one; the meta-schema is no schema a fuzzer can
generate from), with what enqueue checks of them in their descriptions
(:mod:`resumeq.server.openapi_shapes`). All of them are in the descriptions; a key reused
with another body is a 422, as the Idempotency-Key draft has it.

The event stream is ``text/event-stream`` whose ``schema`` describes one event (OpenAPI
3.1 has no ``itemSchema``; 3.2's SSE shape, ``{event, data, id, retry}`` with the data's
JSON given by ``contentMediaType`` and ``contentSchema``, is what schemathesis validates
each event against).

Built once per app from its settings; a test checks that every route of the app is in it
and nothing else."""

from __future__ import annotations

from typing import Any

from resumeq.core import names, spec, spec_rules, spec_tools
from resumeq.core.settings import Settings
from resumeq.core.states import JobState
from resumeq.server.openapi_shapes import not_refused as _not_refused
from resumeq.server.openapi_shapes import nullable as _nullable
from resumeq.server.openapi_shapes import shape_components
from resumeq.server.openapi_shapes import string as _string
from resumeq.store import QUEUE_PATTERN, keys

PROBLEM = {"$ref": "#/components/schemas/Problem"}
JOB = {"$ref": "#/components/schemas/Job"}

#: An ``Idempotency-Key`` as a client sends it: bare, or the draft's quoted string. It is
#: kept under the caller's name (``name:key``, within the 200 characters a spec's key has).
IDEMPOTENCY_HEADER_KEY = r"[A-Za-z0-9_.:@/+=-]{1,128}"
IDEMPOTENCY_HEADER_PATTERN = f'^(?:{IDEMPOTENCY_HEADER_KEY}|"{IDEMPOTENCY_HEADER_KEY}")$'
#: A revision as ``Last-Event-ID`` carries it (empty: none, from the start).
LAST_EVENT_ID_PATTERN = r"^[0-9]{0,18}$"
#: A position in the spill list, as a page answered it (``<spilled ms>.<job id>``); empty:
#: the first page.
SPILL_CURSOR_PATTERN = r"^(?:[0-9]{1,18}\.[A-Za-z0-9_-]{1,64})?$"
#: The most entries one page of ``GET /v1/spill`` answers.
SPILL_PAGE_MAX = 500
#: The largest integer a query parameter is read as (18 digits).
QUERY_INT_MAX = 10**18 - 1
_QUOTED_URL = r'^"(?:[A-Za-z][A-Za-z0-9+.-]*://|//|[Ww][Ww][Ww]\.)'

_WHY = {
    400: "a malformed header or parameter, or a body that is not JSON (named in errors)",
    401: "no valid bearer token (a follow token: malformed, forged or expired)",
    403: "the token's role may not do this",
    404: "no such job (or another producer's)",
    409: "the job's state does not allow it",
    413: "the body is over [server] max_body_bytes",
    415: "not application/json",
    422: "a refused field (named in errors)",
    429: "this producer follows its most streams ([server] max_streams_per_producer; Retry-After)",
    501: "follow tokens are not configured ([server] secret_env)",
    503: "Redis is unreachable, or this server follows its most jobs (Retry-After)",
}


def _problems(*statuses: int) -> dict[str, Any]:
    return {
        str(s): {
            "description": _WHY[s],
            "content": {"application/problem+json": {"schema": PROBLEM}},
        }
        for s in statuses
    }


_JOB_ID = {"name": "job_id", "in": "path", "required": True,
           "schema": {"type": "string", "pattern": names.JOB_ID_RE.pattern}}  # fmt: skip
_JSON_JOB = {"description": "the job", "content": {"application/json": {"schema": JOB}}}


#: Each operation's id: what a generated client names its method, and what links name.
OPERATION_IDS = {
    ("/v1/jobs", "post"): "createJob",
    ("/v1/jobs/{job_id}", "get"): "getJob",
    ("/v1/jobs/{job_id}", "delete"): "purgeJob",
    ("/v1/jobs/{job_id}/events", "get"): "followJob",
    ("/v1/jobs/{job_id}/follow-token", "post"): "createFollowToken",
    ("/v1/jobs/{job_id}/cancel", "post"): "cancelJob",
    ("/v1/spill", "get"): "listSpilled",
    ("/v1/spill/export", "get"): "exportSpilled",
    ("/v1/spill/{job_id}/requeue", "post"): "requeueSpilled",
    ("/v1/spill/{job_id}/drop", "post"): "dropSpilled",
    ("/v1/stats", "get"): "getStats",
    ("/healthz", "get"): "health",
    ("/metrics", "get"): "metrics",
    ("/openapi.json", "get"): "openapi",
}
#: What a created job's id opens.
_JOB_LINKS = ("getJob", "followJob", "createFollowToken", "cancelJob", "purgeJob")


def document(settings: Settings) -> dict[str, Any]:
    """The document for a server of ``settings``."""
    doc = _document(settings)
    for path, item in doc["paths"].items():
        if "{job_id}" in path:  # one declaration for every method, OPTIONS among them
            for operation in item.values():
                if isinstance(operation, dict) and "parameters" in operation:
                    operation["parameters"] = [p for p in operation["parameters"] if p != _JOB_ID]
            item["parameters"] = [_JOB_ID]
        for method, operation in item.items():
            if method != "parameters":
                operation["operationId"] = OPERATION_IDS[(path, method)]
    created = doc["paths"]["/v1/jobs"]["post"]["responses"]
    for status in ("200", "201"):
        created[status] = {
            **created[status],
            "links": {
                name: {"operationId": name, "parameters": {"job_id": "$response.body#/id"}}
                for name in _JOB_LINKS
            },
        }
    return doc


def job_spec_schema(settings: Settings) -> dict[str, Any]:
    """A job spec as ``POST /v1/jobs`` takes it: :class:`~resumeq.core.spec.JobSpec`'s fields
    with the rules its validators apply, the configured providers and ``[limits]``."""
    limits = settings.file.limits
    fields = spec.JobSpec.model_fields

    def said(name: str, fallback: str) -> str:
        return fields[name].description or fallback

    providers = sorted(settings.file.providers)
    provider: dict[str, Any] = (
        {"type": "string", "enum": providers}
        if providers
        else {"type": "string", "not": {}, "description": "no provider is configured"}
    )
    provider["description"] = said("provider", "a provider profile of this deployment")
    plain = {"$ref": "#/components/schemas/PlainJson"}
    return {
        "type": "object",
        "description": "One generation request. Give either messages or prompt.",
        "additionalProperties": False,
        "required": ["provider", "model", "budget_tokens"],
        # Exactly one of them, not null.
        "oneOf": [
            {"required": ["prompt"], "properties": {"prompt": {"type": "string"}}},
            {"required": ["messages"], "properties": {"messages": {"type": "array"}}},
        ],
        "properties": {
            "messages": _nullable({
                "type": "array", "minItems": 1, "maxItems": limits.max_messages,
                "items": {"$ref": "#/components/schemas/Message"},
                "contains": {"type": "object", "properties": {"role": {"const": "user"}},
                             "required": ["role"]},
                "description": "at least one user message; all contents and tool calls' "
                f"arguments together at most {limits.max_prompt_bytes} bytes of UTF-8; each "
                "tool call's id used once; a tool message answers a call of an earlier "
                "assistant message; with tools, each call names one of them",
            }),
            "prompt": _nullable({
                "type": "string", "pattern": spec_rules.NOT_BLANK_PATTERN,
                "maxLength": limits.max_prompt_bytes,
                "description": "one user message, not only white space; at most "
                f"{limits.max_prompt_bytes} bytes of UTF-8",
            }),
            "provider": provider,
            "model": _string(spec_rules.MODEL_PATTERN, said("model", "the model name")),
            "budget_tokens": {
                "type": "integer", "minimum": 1, "maximum": limits.max_budget_tokens,
                "description": said("budget_tokens", "the most output tokens, all attempts"),
            },
            "floor_tokens": {  # under a budget, which is at most the limit
                "type": "integer", "minimum": 1, "maximum": max(1, limits.max_budget_tokens - 1),
                "description": "the smallest remaining budget worth a continuation: less "
                "than budget_tokens, or 1 (no floor); not given, 32 or half a smaller budget",
            },
            "params": {"$ref": "#/components/schemas/GenerationParams"},
            "exit": {"$ref": "#/components/schemas/ExitPolicy"},
            "idempotency_key": _nullable(_string(
                f"^{IDEMPOTENCY_HEADER_KEY}$",
                "the Idempotency-Key header's value, if both are sent; kept under the "
                "caller's name",
            )),
            "require_exact_counts": {"type": "boolean"},
            "byte_exact": {"type": "boolean"},
            "metadata": {
                "type": "object", "additionalProperties": plain,
                "propertyNames": {"minLength": 1, "maxLength": 64, **_not_refused()},
                "description": "plain JSON data kept with the job, at most "
                f"{limits.max_metadata_bytes} bytes as JSON; no URL or credential in it",
            },
            "hooks": {
                "type": "array", "maxItems": limits.max_hooks, "uniqueItems": True,
                "items": _string(spec_rules.NAME_PATTERN),
                "description": "names of hooks registered on the workers",
            },
            "tools": _nullable({
                "type": "array", "minItems": 1, "maxItems": limits.max_tools,
                "uniqueItems": True, "items": {"$ref": "#/components/schemas/Tool"},
                "description": "functions the model may call; no function named twice",
            }),
            "tool_choice": _nullable({
                "anyOf": [{"enum": list(spec_tools.TOOL_CHOICE_MODES)},
                          {"$ref": "#/components/schemas/NamedToolChoice"}],
                "description": "needs tools, unless none; a named function is one of tools",
            }),
            "response_format": _nullable({
                "$ref": "#/components/schemas/ResponseFormat",
                "description": "not with a tool_choice that forces a call (required or a "
                "named function): the answer would be the call, never the document",
            }),
        },
    }  # fmt: skip


def _components(settings: Settings) -> dict[str, Any]:
    states = [s.value for s in JobState]
    return {
        "JobSpec": job_spec_schema(settings),
        **shape_components(settings),
        "GenerationParams": {
            "type": "object", "additionalProperties": False,
            "description": "sampling parameters that change the answer, and so the prompt hash",
            "properties": {
                "temperature": _nullable({"type": "number", "minimum": 0, "maximum": 2}),
                "top_p": _nullable({"type": "number", "exclusiveMinimum": 0, "maximum": 1}),
                "stop": _nullable({"type": "array", "maxItems": 4, "items": {
                    "type": "string", "minLength": 1, "maxLength": 64}}),
                "seed": _nullable({"type": "integer", "minimum": 0, "maximum": 2**63 - 1}),
            },
        },
        "ExitPolicy": {
            "type": "object", "additionalProperties": False,
            "description": "the exit chosen before the call: what a cut leads to",
            "properties": {
                "on_cut": {"enum": ["resume", "abandon", "spill"]},
                "droppable": {"type": "boolean", "description": "a droppable job abandons "
                              "(keeping its partial text) where another spills"},
                "max_attempts": {"type": "integer", "minimum": 1, "maximum": 50},
                "on_invalid": {"enum": list(spec_rules.ON_INVALID),
                               "description": "what an answer that is not the asked shape "
                               "leads to: a fresh attempt, a spill, or failure"},
            },
        },
        # Metadata: JSON with no URL and no credential in any string (keys included).
        "PlainJson": {"anyOf": [
            {"type": ["null", "boolean", "number"]},
            {"type": "string", **_not_refused()},
            {"type": "array", "items": {"$ref": "#/components/schemas/PlainJson"}},
            {"type": "object", "propertyNames": _not_refused(),
             "additionalProperties": {"$ref": "#/components/schemas/PlainJson"}},
        ]},
        "Job": {
            "type": "object", "required": ["id", "state", "text", "revision", "links"],
            "description": "what `resumeq status --json` prints, and links",
            "properties": {
                "id": {"type": "string"}, "state": {"enum": states},
                "text": {"type": "string"}, "revision": {"type": "integer", "minimum": 0},
                "budget_tokens": {"type": "integer"}, "floor_tokens": {"type": "integer"},
                "spent_output_tokens": {"type": "integer"},
                "attempts": {"type": "array", "items": {"type": "object"},
                             "description": "one record per attempt (the ledger)"},
                "already_ended": {"type": "boolean", "description": "a cancel's answer: the "
                                  "job had ended before, and nothing was done"},
                "warnings": {"type": "array", "items": {"type": "string"},
                             "description": "a requeue's answer: no live worker listens on "
                             "the queue it went to"},
                "links": {"type": "object", "properties": {
                    k: {"type": "string"} for k in ("self", "events", "cancel")}},
                "tool_calls": {"type": "array", "items": {
                    "type": "object", "required": ["id", "name", "arguments"],
                    "properties": {"id": {"type": "string"}, "name": {"type": "string"},
                                   "arguments": {"type": "string",
                                                 "description": "a JSON object, as text"}}},
                    "description": "the answer's tool calls, whole and durable"},
                "refusal": {"type": ["string", "null"],
                            "description": "the provider's refusal, when it refused"},
            },
            "additionalProperties": True,
        },
        "Delta": {"type": "object", "required": ["text", "revision"], "properties": {
            "text": {"type": "string"}, "revision": {"type": "integer", "minimum": 0}}},
        "StateChange": {"type": "object", "required": ["state"],
                        "properties": {"state": {"enum": states}}},
        "FollowToken": {
            "type": "object", "required": ["token", "expires_at", "events"],
            "properties": {"token": {"type": "string"},
                           "expires_at": {"type": "integer", "description": "ms since the epoch"},
                           "events": {"type": "string"}},
        },
        "SpillPage": {
            "type": "object", "required": ["items", "next_cursor"],
            "properties": {"items": {"type": "array", "items": {"type": "object"}},
                           "next_cursor": {"anyOf": [
                               {"type": "string", "pattern": SPILL_CURSOR_PATTERN},
                               {"type": "null"}]}},
        },
        "Problem": {
            "type": "object", "required": ["title", "status", "detail"],
            "properties": {
                "type": {"type": "string"}, "title": {"type": "string"},
                "status": {"type": "integer"}, "detail": {"type": "string"},
                "instance": {"type": "string"},
                "errors": {"type": "array", "items": {
                    "type": "object", "required": ["field", "message"],
                    "properties": {"field": {"type": "string"},
                                   "message": {"type": "string"}}}}},
        },
    }  # fmt: skip


def _events() -> dict[str, Any]:
    """One event of a job's stream (the OpenAPI 3.2 shape of an SSE event)."""

    def one(name: str, data: str, doc: str) -> dict[str, Any]:
        return {
            "type": "object", "required": ["event", "data"], "description": doc,
            "properties": {
                "event": {"const": name},
                "id": {"type": "string", "pattern": r"^[0-9]+$",
                       "description": "the revision: send it back as Last-Event-ID"},
                "data": {"type": "string", "contentMediaType": "application/json",
                         "contentSchema": {"$ref": f"#/components/schemas/{data}"}},
            },
        }  # fmt: skip

    return {
        "oneOf": [
            one("delta", "Delta", "text appended at this revision"),
            one("state", "StateChange", "the job's state changed"),
            one("end", "StateChange", "the job ended (or spilled): the stream closes"),
        ]
    }


def _document(settings: Settings) -> dict[str, Any]:
    server = settings.file.server
    queues = list(settings.file.worker.queues)
    reads = _problems(401, 403, 404, 503)
    follow_statuses = (400, 401, 403, 404, 413, 415, 422, 503) + (
        () if server.secret_env else (501,)
    )
    filters = [
        {"name": "reason", "in": "query", "schema": {"type": "string"},
         "description": "a piece of the reason it spilled (case does not matter)"},
        {"name": "provider", "in": "query", "schema": {"type": "string"}},
        {"name": "queue", "in": "query", "schema": {"type": "string"}},
    ]  # fmt: skip
    return {
        "openapi": "3.1.0",
        "info": {"title": "resumeq", "version": "1",
                 "description": "LLM generation jobs that resume cut streams. Every /v1/ "
                 "route also answers OPTIONS, as HEAD is implicit: its Allow, and a CORS "
                 "preflight from an origin of [server] cors_origins (no token needed)."},
        "security": [{"bearer": []}],
        "paths": {
            "/v1/jobs": {"post": {
                "summary": "Create a job",
                "parameters": [
                    {"name": "Idempotency-Key", "in": "header",
                     "schema": {"type": "string", "pattern": IDEMPOTENCY_HEADER_PATTERN,
                                # quoted, the key inside is held to the same
                                **_not_refused({"pattern": _QUOTED_URL})},
                     "description": "the same key and body answer the same job (200); the "
                     "same key with another body is a 422"},
                    {"name": "queue", "in": "query",
                     "schema": {"type": "string", "enum": queues},
                     "description": "one of [worker] queues; not given, the first"},
                ],
                "requestBody": {"required": True,
                                "content": {"application/json": {"schema": {
                                    "$ref": "#/components/schemas/JobSpec"}}}},
                "responses": {"201": _JSON_JOB, "200": _JSON_JOB,
                              **_problems(400, 401, 403, 413, 415, 422, 503)},
            }},
            "/v1/jobs/{job_id}": {
                "parameters": [_JOB_ID],
                "get": {"summary": "A job: what `resumeq status --json` prints",
                        "responses": {"200": _JSON_JOB, **reads}},
                "delete": {"summary": "Purge a job (operators)",
                           "responses": {"204": {"description": "purged"},
                                         **_problems(401, 403, 404, 409, 503)}},
            },
            "/v1/jobs/{job_id}/events": {"get": {
                "summary": "The job's durable text as Server-Sent Events, resumable",
                "security": [{"bearer": []}, {"followToken": []}],
                "parameters": [
                    _JOB_ID,
                    {"name": "Last-Event-ID", "in": "header",
                     "schema": {"type": "string", "pattern": LAST_EVENT_ID_PATTERN},
                     "description": "the last revision seen (what a reconnecting "
                     "EventSource sends); before ?after"},
                    {"name": "after", "in": "query",
                     "schema": {"type": "integer", "minimum": 0, "maximum": QUERY_INT_MAX}},
                ],
                "responses": {"200": {
                    "description": "`retry:` first, then an event per durable write: delta "
                    "({text, revision}), state ({state}), and end ({state}) at a terminal "
                    "state or a spill, after which the stream closes; comments keep it alive",
                    "content": {"text/event-stream": {"schema": _events()}},
                }, **_problems(400, 401, 403, 404, 409, 429, 503)},
            }},
            "/v1/jobs/{job_id}/follow-token": {"post": {
                "summary": "A token that opens only this job's events, for a browser",
                "parameters": [_JOB_ID],
                "requestBody": {"content": {"application/json": {"schema": {
                    "type": "object", "additionalProperties": False,
                    "properties": {"ttl_s": {
                        "type": "number", "exclusiveMinimum": 0,
                        "maximum": server.follow_token_ttl_s,
                        "description": "its life in seconds; not given, the longest"}}}}}},
                "responses": {"200": {"description": "the token, and when it expires (ms)",
                                      "content": {"application/json": {"schema": {
                                          "$ref": "#/components/schemas/FollowToken"}}}},
                              **_problems(*follow_statuses)},
            }},
            "/v1/jobs/{job_id}/cancel": {"post": {
                "summary": "Cancel a job; an ended one answers with already_ended",
                "parameters": [_JOB_ID],
                "responses": {"200": _JSON_JOB, **_problems(401, 403, 404, 409, 503)},
            }},
            "/v1/spill": {"get": {
                "summary": "Spilled jobs, a page at a time (oldest spill first)",
                "parameters": [
                    *filters,
                    {"name": "limit", "in": "query",
                     "schema": {"type": "integer", "minimum": 1, "maximum": SPILL_PAGE_MAX,
                                "default": 50}},
                    {"name": "cursor", "in": "query",
                     "schema": {"type": "string", "pattern": SPILL_CURSOR_PATTERN},
                     "description": "a page's next_cursor"},
                ],
                "responses": {"200": {"description": "a page", "content": {
                    "application/json": {"schema": {"$ref": "#/components/schemas/SpillPage"}}}},
                    **_problems(400, 401, 403, 503)},
            }},
            "/v1/spill/export": {"get": {
                "summary": "Every spilled job that matches, as JSON lines",
                "parameters": filters,
                "responses": {"200": {"description": "one job per line", "content": {
                    "application/x-ndjson": {"schema": {"type": "string"}}}},
                    **_problems(401, 403, 503)},
            }},
            "/v1/spill/{job_id}/requeue": {"post": {
                "summary": "Send a spilled job back (to a queue, to a provider)",
                "parameters": [_JOB_ID],
                "requestBody": {"content": {"application/json": {"schema": {
                    "type": "object", "additionalProperties": False,
                    "properties": {
                        "to": _nullable({"type": "string", "pattern": QUEUE_PATTERN,
                                         "not": {"const": keys.SPILL_QUEUE},
                                         "description": "a queue (not the spill lane); a "
                                         "warning says when no live worker listens on it"}),
                        "provider": _nullable({"type": "string",
                                               "enum": sorted(settings.file.providers)}),
                    }}}}},
                "responses": {"200": _JSON_JOB,
                              **_problems(400, 401, 403, 404, 409, 413, 415, 422, 503)},
            }},
            "/v1/spill/{job_id}/drop": {"post": {
                "summary": "Drop a spilled job", "parameters": [_JOB_ID],
                "responses": {"200": _JSON_JOB, **_problems(401, 403, 404, 409, 503)},
            }},
            "/v1/stats": {"get": {"summary": "Counts by state and token totals",
                                  "responses": {"200": {"description": "stats", "content": {
                                      "application/json": {"schema": {"type": "object"}}}},
                                                **_problems(401, 403, 503)}}},
            "/healthz": {"get": {"summary": "Redis is reachable",
                                 "security": [] if server.public_metrics else [{"bearer": []}],
                                 "responses": {"200": {"description": "ok", "content": {
                                     "application/json": {"schema": {"type": "object"}}}},
                                               **_problems(401, 403, 503)}}},
            "/metrics": {"get": {"summary": "Prometheus text exposition",
                                 "security": [] if server.public_metrics else [{"bearer": []}],
                                 "responses": {"200": {"description": "metrics", "content": {
                                     "text/plain": {"schema": {"type": "string"}}}},
                                     **_problems(401, 403, 503)}}},
            "/openapi.json": {"get": {"summary": "This document (any role's token)",
                                      "responses": {"200": {"description": "OpenAPI 3.1",
                                                            "content": {"application/json": {
                                                                "schema": {"type": "object"}}}},
                                                    **_problems(401)}}},
        },
        "components": {
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "followToken": {"type": "apiKey", "in": "query", "name": "token",
                                "description": "a follow token of this job (POST "
                                ".../follow-token), for a browser's EventSource"},
            },
            "schemas": _components(settings),
        },
    }  # fmt: skip
