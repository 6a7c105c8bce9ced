"""A web front for resumeq with nothing but the standard library (WSGI).

    POST /jobs               a JobSpec as JSON  ->  {"id": ...}
    GET  /jobs/<id>          the job's state and text so far
    GET  /jobs/<id>/stream   Server-Sent Events: the text as it is checkpointed, one event
                             per revision (its id), resumable with Last-Event-ID

Run it beside Redis, workers and a janitor:

    RESUMEQ_REDIS_URL=redis://localhost:6379/0 python examples/web.py 8080
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from wsgiref.simple_server import make_server

from resumeq import Client, InvalidSpec, JobNotFound

StartResponse = Callable[[str, list[tuple[str, str]]], Any]

client = Client.from_url(os.environ.get("RESUMEQ_REDIS_URL", "redis://localhost:6379/0"))


def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
    try:
        return route(environ, start_response)
    except InvalidSpec as exc:
        return reply(start_response, "422 Unprocessable Entity", {"error": str(exc)})
    except JobNotFound as exc:
        return reply(start_response, "404 Not Found", {"error": str(exc)})
    except ValueError as exc:
        return reply(start_response, "400 Bad Request", {"error": str(exc)})


def route(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
    method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO", "")
    if method == "POST" and path == "/jobs":
        size = int(environ.get("CONTENT_LENGTH") or 0)
        spec = json.loads(environ["wsgi.input"].read(size) or b"{}")
        return reply(start_response, "201 Created", {"id": client.enqueue(spec)})
    if m := re.fullmatch(r"/jobs/([A-Za-z0-9_-]+)", path):
        job = client.get(m.group(1))
        return reply(start_response, "200 OK", {"id": job.id, "state": job.state, "text": job.text})
    if m := re.fullmatch(r"/jobs/([A-Za-z0-9_-]+)/stream", path):
        after = int(environ.get("HTTP_LAST_EVENT_ID") or 0)
        client.get(m.group(1))  # 404 before the stream starts
        start_response("200 OK", [("Content-Type", "text/event-stream")])
        return events(m.group(1), after)
    return reply(start_response, "404 Not Found", {"error": "no such route"})


def events(job_id: str, after: int) -> Iterator[bytes]:
    for delta in client.follow(job_id, after=after):
        yield f"id: {delta.revision}\ndata: {json.dumps(delta.text)}\n\n".encode()
    yield f"event: end\ndata: {json.dumps(client.get(job_id).state.value)}\n\n".encode()


def reply(start_response: StartResponse, status: str, body: dict[str, Any]) -> list[bytes]:
    start_response(status, [("Content-Type", "application/json")])
    return [json.dumps(body).encode()]


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8080
    with make_server("127.0.0.1", port, app) as server:
        print(f"resumeq web example on http://127.0.0.1:{port}")
        server.serve_forever()
