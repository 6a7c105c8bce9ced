"""The service's OpenAPI 3.1 document (``GET /openapi.json``): every route of SPEC §18, the
JobSpec's own JSON schema (from the pydantic model the service validates with), the job
and spill shapes, and problem+json for every error. Built once, from the same names the
routes use; a test checks that every route of the app is in it and nothing else."""

from __future__ import annotations

from typing import Any

from resumeq.spec import JobSpec

PROBLEM = {"$ref": "#/components/schemas/Problem"}
JOB = {"$ref": "#/components/schemas/Job"}


def _problems(*statuses: int) -> dict[str, Any]:
    return {
        str(s): {
            "description": _WHY[s],
            "content": {"application/problem+json": {"schema": PROBLEM}},
        }
        for s in statuses
    }


_WHY = {
    400: "a malformed body, header or parameter (named in errors)",
    401: "no valid bearer token",
    403: "the token's role may not do this",
    404: "no such job (or another producer's)",
    409: "the job's state does not allow it",
    413: "the body is over [server] max_body_bytes",
    501: "follow tokens are not configured ([server] secret_env)",
    415: "not application/json",
    422: "a refused field (named in errors)",
    503: "Redis is unreachable, or the server follows its most jobs (Retry-After)",
}
_JOB_ID = {"name": "job_id", "in": "path", "required": True, "schema": {"type": "string",
           "pattern": "^[A-Za-z0-9_-]{1,64}$"}}  # fmt: skip
_JSON_JOB = {"description": "the job", "content": {"application/json": {"schema": JOB}}}


def document() -> dict[str, Any]:
    doc = _document()
    for path, item in doc["paths"].items():
        if path.startswith("/v1/"):
            item["options"] = _OPTIONS
    return doc


#: Every ``/v1/`` route answers OPTIONS: its Allow, and CORS preflights from the origins of
#: ``[server] cors_origins``.
_OPTIONS = {
    "summary": "Allowed methods; a CORS preflight from a listed origin",
    "security": [],
    "responses": {"204": {"description": "Allow, and for a listed origin the CORS headers"}},
}


def _document() -> dict[str, Any]:
    spec_schema = JobSpec.model_json_schema(ref_template="#/components/schemas/{model}")
    defs = spec_schema.pop("$defs", {})
    reads = _problems(401, 403, 404, 503)
    return {
        "openapi": "3.1.0",
        "info": {"title": "resumeq", "version": "1",
                 "description": "LLM generation jobs that resume cut streams (SPEC §18)."},
        "security": [{"bearer": []}],
        "paths": {
            "/v1/jobs": {"post": {
                "summary": "Create a job",
                "parameters": [
                    {"name": "Idempotency-Key", "in": "header", "schema": {"type": "string"}},
                    {"name": "queue", "in": "query", "schema": {"type": "string"}},
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
                "parameters": [
                    _JOB_ID,
                    {"name": "Last-Event-ID", "in": "header", "schema": {"type": "string"}},
                    {"name": "after", "in": "query", "schema": {"type": "integer",
                                                                "minimum": 0}},
                    {"name": "token", "in": "query", "schema": {"type": "string"},
                     "description": "a follow token of this job (POST .../follow-token), "
                     "for a browser's EventSource: no Authorization header then"},
                ],
                "responses": {"200": {
                    "description": "id: the revision; event: delta ({text, revision}), "
                    "state ({state}), end ({state}), then the stream closes",
                    "content": {"text/event-stream": {"schema": {"type": "string"}}},
                }, **_problems(400, 401, 403, 404, 503)},
            }},
            "/v1/jobs/{job_id}/follow-token": {"post": {
                "summary": "A token that opens only this job's events, for a browser",
                "parameters": [_JOB_ID],
                "requestBody": {"content": {"application/json": {"schema": {
                    "type": "object", "additionalProperties": False,
                    "properties": {"ttl_s": {"type": "number", "exclusiveMinimum": 0}}}}}},
                "responses": {"200": {"description": "the token, and when it expires (ms)",
                                      "content": {"application/json": {"schema": {
                                          "$ref": "#/components/schemas/FollowToken"}}}},
                              **_problems(401, 403, 404, 413, 415, 422, 501, 503)},
            }},
            "/v1/jobs/{job_id}/cancel": {"post": {
                "summary": "Cancel a job", "parameters": [_JOB_ID],
                "responses": {"200": _JSON_JOB, **_problems(401, 403, 404, 409, 503)},
            }},
            "/v1/spill": {"get": {
                "summary": "Spilled jobs, a page at a time (oldest spill first)",
                "parameters": [{"name": n, "in": "query", "schema": {"type": t}} for n, t in
                               (("reason", "string"), ("provider", "string"),
                                ("queue", "string"), ("limit", "integer"),
                                ("cursor", "string"))],
                "responses": {"200": {"description": "a page", "content": {
                    "application/json": {"schema": {"$ref": "#/components/schemas/SpillPage"}}}},
                    **_problems(400, 401, 403, 503)},
            }},
            "/v1/spill/export": {"get": {
                "summary": "Every spilled job that matches, as JSON lines",
                "responses": {"200": {"description": "one job per line", "content": {
                    "application/x-ndjson": {"schema": {"type": "string"}}}},
                    **_problems(401, 403, 503)},
            }},
            "/v1/spill/{job_id}/requeue": {"post": {
                "summary": "Send a spilled job back (to a queue, to a provider)",
                "parameters": [_JOB_ID],
                "requestBody": {"content": {"application/json": {"schema": {
                    "type": "object", "additionalProperties": False,
                    "properties": {"to": {"type": "string"}, "provider": {"type": "string"}}}}}},
                "responses": {"200": _JSON_JOB,
                              **_problems(400, 401, 403, 404, 409, 413, 415, 422, 503)},
            }},
            "/v1/spill/{job_id}/drop": {"post": {
                "summary": "Drop a spilled job", "parameters": [_JOB_ID],
                "responses": {"200": _JSON_JOB, **_problems(401, 403, 404, 409, 503)},
            }},
            "/v1/stats": {"get": {"summary": "Counts by state and token totals",
                                  "responses": {"200": {"description": "stats"},
                                                **_problems(401, 403, 503)}}},
            "/healthz": {"get": {"summary": "Redis is reachable",
                                 "responses": {"200": {"description": "ok"},
                                               **_problems(401, 403, 503)}}},
            "/metrics": {"get": {"summary": "Prometheus text exposition",
                                 "responses": {"200": {"description": "metrics", "content": {
                                     "text/plain": {"schema": {"type": "string"}}}},
                                     **_problems(401, 403, 503)}}},
            "/openapi.json": {"get": {"summary": "This document (any role's token)",
                                      "responses": {"200": {"description": "OpenAPI 3.1"},
                                                    **_problems(401)}}},
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                **defs,
                "JobSpec": spec_schema,
                "Job": {"type": "object", "required": ["id", "state", "text", "revision"],
                        "properties": {"id": {"type": "string"}, "state": {"type": "string"},
                                       "text": {"type": "string"},
                                       "revision": {"type": "integer"},
                                       "links": {"type": "object"}},
                        "additionalProperties": True},
                "FollowToken": {"type": "object", "required": ["token", "expires_at"],
                                "properties": {"token": {"type": "string"},
                                               "expires_at": {"type": "integer"},
                                               "events": {"type": "string"}}},
                "SpillPage": {"type": "object", "required": ["items", "next_cursor"],
                              "properties": {"items": {"type": "array", "items": {
                                  "type": "object"}},
                                  "next_cursor": {"type": ["string", "null"]}}},
                "Problem": {"type": "object", "required": ["title", "status", "detail"],
                            "properties": {
                                "type": {"type": "string"}, "title": {"type": "string"},
                                "status": {"type": "integer"}, "detail": {"type": "string"},
                                "instance": {"type": "string"},
                                "errors": {"type": "array", "items": {
                                    "type": "object",
                                    "properties": {"field": {"type": "string"},
                                                   "message": {"type": "string"}}}}}},
            },
        },
    }  # fmt: skip
