"""The HTTP handler: routing, the provider endpoints and the ``/_fake/`` admin endpoints."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from pydantic import ValidationError

from resumeq.fake import anthropic_wire
from resumeq.fake.admin import canonical_of, configure
from resumeq.fake.anthropic_wire import AnthropicWire
from resumeq.fake.background import BackgroundResponse
from resumeq.fake.conversation import InvalidRequest
from resumeq.fake.faults import Fault
from resumeq.fake.journal import Exchange
from resumeq.fake.llamacpp import llamacpp_tokenize
from resumeq.fake.openai_wire import OpenAIWire
from resumeq.fake.pacer import Pacer, pause, run_inline
from resumeq.fake.plan import Plan, plan
from resumeq.fake.responses_wire import ResponsesWire
from resumeq.fake.state import FakeState
from resumeq.fake.stream import END, chunk, stream_steps
from resumeq.fake.vllm import vllm_tokenize
from resumeq.fake.wire import (
    ErrorReply,
    Generation,
    InputUsage,
    Output,
    Wire,
    dumps,
    new_id,
    retry_after_headers,
)

OPENAI = OpenAIWire()
ANTHROPIC = AnthropicWire()
RESPONSES = ResponsesWire()
WIRES: dict[str, Wire] = {
    "/v1/chat/completions": OPENAI,
    "/v1/messages": ANTHROPIC,
    "/v1/responses": RESPONSES,
}


@dataclass(frozen=True)
class Call:
    """One generation request on its way out."""

    wire: Wire
    request: Generation
    completion: Plan
    fault: Fault | None
    usage: InputUsage
    exchange: Exchange


class FakeHTTPServer(ThreadingHTTPServer):
    """A thread per connection (named ``{name}:conn``, metered), one pacing thread for the
    streams with a token delay (:mod:`resumeq.fake.pacer`), and a listen backlog for a
    thousand clients connecting at once (the kernel may cap it: ``net.core.somaxconn``)."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 4096

    def __init__(self, address: tuple[str, int], state: FakeState, name: str) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.state = state
        super().__init__(address, FakeHandler)
        self.name = f"{name}:{self.server_address[1]}"
        self.pacer = Pacer(state.stopped, state.cpu, f"{self.name}:pacer")
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._connection_threads: list[threading.Thread] = []
        self._reap_at = 64

    def run(self) -> None:
        """Accept connections until :meth:`shutdown` (the accepting thread's body)."""
        with self.state.cpu.thread():
            self.serve_forever(poll_interval=0.05)

    def process_request(self, request: Any, client_address: Any) -> None:
        thread = threading.Thread(
            target=self._connection,
            args=(request, client_address),
            name=f"{self.name}:conn",
            daemon=True,
        )
        with self._lock:
            self._connections.add(request)
            self._connection_threads.append(thread)
            # Reaped now and then: the list stays near the threads alive, at a cost amortised.
            if len(self._connection_threads) >= self._reap_at:
                self._connection_threads = [t for t in self._connection_threads if t.is_alive()]
                self._reap_at = max(64, 2 * len(self._connection_threads))
        thread.start()

    def _connection(self, request: Any, client_address: Any) -> None:
        with self.state.cpu.thread():
            self.process_request_thread(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._lock:  # out of the set before it is closed (see close_connections)
            self._connections.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        """Hang up on every connection, busy or idle (a keep-alive connection's thread waits
        for its next request): their threads end."""
        with self._lock:
            for connection in self._connections:
                with contextlib.suppress(OSError):
                    connection.shutdown(socket.SHUT_RDWR)

    def join_connections(self) -> None:
        with self._lock:
            threads, self._connection_threads = self._connection_threads, []
        for thread in threads:
            if thread.is_alive():
                thread.join()


class FakeHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server_version = "resumeq-fake-provider"
    server: FakeHTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the journal records every request."""

    def handle(self) -> None:
        """Serve the connection; a client that hung up (reset, broken pipe) is no error."""
        try:
            super().handle()
        except ConnectionError:
            self.close_connection = True

    # -- plumbing --------------------------------------------------------------------------

    @property
    def state(self) -> FakeState:
        return self.server.state

    @property
    def route(self) -> str:
        return urlsplit(self.path).path.rstrip("/") or "/"

    def _read_body(self) -> bytes:
        length = int(self.headers.get("content-length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _send_json(self, status: int, body: Any, headers: Mapping[str, str] | None = None) -> None:
        data = dumps(body).encode("utf-8")
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _send_error_reply(self, reply: ErrorReply, exchange: Exchange | None = None) -> None:
        if exchange is not None:
            exchange.status = reply.status
            exchange.response = reply.body
        self._send_json(reply.status, reply.body, reply.headers)

    def _drop(self) -> None:
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    # -- routing ---------------------------------------------------------------------------

    def do_GET(self) -> None:
        routes: dict[str, Callable[[], Any]] = {
            "/_fake/requests": self.state.journal.snapshot,
            "/_fake/faults": self.state.faults.pending,
            "/_fake/faults/schema": Fault.model_json_schema,
            "/_fake/config": self._config,
            "/_fake/stats": self._stats,
            "/_fake/health": lambda: {"ok": True},
            "/health": lambda: {"ok": True},
        }
        stored = _response_route(self.route)
        if stored is not None and stored[1] == "":
            self._retrieve(stored[0])
            return
        action = routes.get(self.route)
        if action is None:
            self._send_error_reply(OPENAI.error(404, f"no route GET {self.route}"))
            return
        self._send_json(200, action())

    def do_POST(self) -> None:
        raw = self._read_body()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            wire = ANTHROPIC if self.route.startswith("/v1/messages") else OPENAI
            self._send_error_reply(wire.error(400, "the request body is not valid JSON"))
            return
        self._dispatch(body)

    def do_DELETE(self) -> None:
        """``/_fake/faults`` empties the fault queue, ``/_fake/faults/{id}`` takes one out."""
        self._read_body()  # whatever came with it, so the connection stays in step
        route, faults = self.route, self.state.faults
        if route == "/_fake/faults":
            self._send_json(200, {"cleared": faults.clear(), "pending": faults.pending()})
            return
        head, _, fault_id = route.rpartition("/")
        if head != "/_fake/faults":
            self._send_error_reply(OPENAI.error(404, f"no route DELETE {route}"))
            return
        removed = faults.remove(int(fault_id)) if fault_id.isdecimal() else None
        if removed is None:
            ids = [str(f["id"]) for f in faults.pending()]
            message = f"no queued fault {fault_id!r} (queued: {', '.join(ids) or 'none'})"
            self._send_json(404, {"error": {"message": message, "type": "not_found_error"}})
            return
        self._send_json(200, {"removed": removed, "pending": faults.pending()})

    def _dispatch(self, body: Any) -> None:
        route = self.route
        wire = WIRES.get(route)
        stored = _response_route(route)
        if wire is not None:
            self._generate(wire, body)
        elif stored is not None and stored[1] == "cancel":
            self._cancel(stored[0])
        elif route.startswith("/_fake/"):
            self._admin(route, body)
        elif route == "/v1/messages/count_tokens":
            self._count(ANTHROPIC, "count_tokens", body, anthropic_wire.count_tokens)
        elif route == "/tokenize":
            llamacpp = self.state.engine.tokenize == "llamacpp"
            self._count(OPENAI, "tokenize", body, llamacpp_tokenize if llamacpp else vllm_tokenize)
        else:
            self._send_error_reply(OPENAI.error(404, f"no route POST {route}"))

    # -- provider endpoints ----------------------------------------------------------------

    def _count(
        self, wire: Wire, name: str, body: Any, count: Callable[[Mapping[str, Any]], Any]
    ) -> None:
        exchange = self.state.journal.open(self.route, name, body)
        try:
            if not isinstance(body, Mapping):
                raise InvalidRequest("the request body must be a JSON object")
            response = count(body)
        except InvalidRequest as exc:
            exchange.outcome = "invalid_request"
            self._send_error_reply(wire.error(400, exc.message, exc.param), exchange)
            return
        exchange.outcome, exchange.status, exchange.response = "finished", 200, response
        self._send_json(200, response)

    def _generate(self, wire: Wire, body: Any) -> None:
        state = self.state
        exchange = state.journal.open(self.route, wire.name, body)
        try:
            if not isinstance(body, Mapping):
                raise InvalidRequest("the request body must be a JSON object")
            request = state.engine.shape(wire.name, wire.parse(body))
            exchange.model, exchange.stream = request.model, request.stream
            completion = plan(
                request.conversation,
                request.continuation,
                request.max_tokens,
                state.completion_tokens,
                shape=request.shape,
                call_prefix=request.call_prefix,
            )
        except InvalidRequest as exc:
            exchange.outcome = "invalid_request"
            self._send_error_reply(wire.error(400, exc.message, exc.param), exchange)
            return
        exchange.continuation = completion.journal()
        exchange.echo_chars = len(request.echo)
        text = "\n".join(m.text for m in request.conversation.messages)
        fault, source = state.faults.take(text), "queue"
        chaos = state.chaos
        if fault is None and chaos is not None:
            fault, source = chaos.draw(request.conversation.seed(), completion.tokens), "chaos"
        exchange.fault = {**fault.model_dump(), "source": source} if fault is not None else None
        if fault is not None and fault.kind == "corrupt":  # the answer broken, sent whole
            completion, fault = completion.corrupted(fault.after_tokens), None
        if fault is not None and fault.kind == "status":
            exchange.outcome = "status"
            reply = wire.error(fault.status, fault.message)
            reply.headers.update(
                retry_after_headers(fault.retry_after, millis=wire.name != "anthropic")
            )
            self._send_error_reply(reply, exchange)
            return
        usage = wire.input_usage(state.cache, request)
        exchange.input_tokens_billed = usage.total
        exchange.cached_input_tokens = usage.cache_read
        exchange.cache_creation_input_tokens = usage.cache_created
        call = Call(wire, request, completion, fault, usage, exchange)
        if wire is RESPONSES and body.get("background") is True:
            self._background(call, body)
        elif request.stream:
            self._stream(call)
        else:
            self._complete(call)

    # -- background responses (the Responses wire) ------------------------------------------

    def _background(self, call: Call, body: Mapping[str, Any]) -> None:
        """Create a background response: it generates on its own; this request reads it
        (``stream``) or gets it ``queued``. A stream fault cuts this reader only (the
        response goes on); an ``error_event`` fails the response itself."""
        state, fault = self.state, call.fault
        fail_at = fault.after_tokens if fault is not None and fault.kind == "error_event" else -1
        response = BackgroundResponse(
            response_id=new_id("resp_"),
            request=call.request,
            usage=call.usage,
            completion=call.completion,
            exchange=call.exchange,
            delay_s=state.token_delay_ms / 1000.0,
            stopped=state.stopped,
            fail_at=fail_at,
            queued_s=state.background.queued_s,
        )
        created = response.snapshot()  # as it is made: queued
        state.background.add(response)
        call.exchange.status = 200
        call.exchange.response = {"id": response.response_id}
        if not call.request.stream:
            self._send_json(200, created)
            return
        reader_fault = fault if fault is not None and fault.kind != "error_event" else None
        self._follow(response, -1, reader_fault, obfuscation=call.request.obfuscation)

    def _follow(
        self,
        response: BackgroundResponse,
        after: int,
        fault: Fault | None,
        *,
        obfuscation: bool,
    ) -> None:
        """Stream ``response``'s events after ``after`` to this client, until it ends, the
        client goes, or ``fault`` cuts this reader after its tokens."""
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        # Clamped as a stream's fault is: a fault past the end fires at the last token.
        total = response.completion.tokens
        cut_at = min(fault.after_tokens, max(total - 1, 0)) if fault is not None else -1
        tokens, last, skipped = 0, b"", False
        try:
            for event in response.follow(after):
                data = event.data if obfuscation else _without_obfuscation(event.data)
                if skipped:  # the event after the one left out: a number skipped
                    self.wfile.write(chunk(data) + END)
                    return
                if event.tokens and tokens == cut_at and fault is not None:
                    if fault.kind == "pause":  # a quiet while, then the rest
                        pause(fault.seconds, self.state.stopped, self.connection)
                        fault, cut_at = None, -1
                    elif fault.kind == "sequence_skip":
                        skipped = True
                        continue
                    else:
                        self._cut_reader(fault, data, last)
                        return
                self.wfile.write(chunk(data))
                tokens += event.tokens
                last = data if event.tokens else last
            self.wfile.write(END)
        except OSError:  # the client went: the response goes on without it
            self.close_connection = True

    def _cut_reader(self, fault: Fault, following: bytes, last: bytes) -> None:
        """A stream fault on this reader, where ``following`` was to go out next."""
        if fault.kind == "sequence_repeat" and last:
            self.wfile.write(chunk(last))
        elif fault.kind == "malformed":
            whole = following.rstrip(b"\n")
            self.wfile.write(chunk(whole[: len(whole) // 2] + b"\n\n"))
        elif fault.kind == "stall" and fault.seconds > 0:
            with contextlib.suppress(OSError):  # the client went: so does the stall
                pause(fault.seconds, self.state.stopped, self.connection)
        if fault.kind in ("truncate", "malformed", "sequence_repeat"):
            self.wfile.write(END)
        else:
            self._drop()

    def _retrieve(self, response_id: str) -> None:
        response = self.state.background.get(response_id)
        if response is None:
            self._send_error_reply(RESPONSES.not_found(response_id))
            return
        query = parse_qs(urlsplit(self.path).query)
        stream = _flag(query, "stream", False)
        exchange = self.state.journal.open(self.path, RESPONSES.name, None)
        exchange.stream, exchange.status = stream, 200
        if not stream:
            exchange.outcome = "retrieved"
            self._send_json(200, response.snapshot())
            return
        if not response.streamable(self.state.background.window_s):
            minutes = max(1, round(self.state.background.window_s / 60))
            exchange.outcome = "too_old"
            self._send_error_reply(
                RESPONSES.error(
                    400,
                    "This response can no longer be streamed because it is more than "
                    f"{minutes} minutes old",
                ),
                exchange,
            )
            return
        given = query.get("starting_after")
        raw_after = given[-1] if given else None
        if raw_after is not None and not raw_after.isdigit():
            exchange.outcome = "invalid_request"
            self._send_error_reply(
                RESPONSES.error(400, "starting_after: expected an integer", "starting_after"),
                exchange,
            )
            return
        after = int(raw_after) if raw_after is not None else -1
        if self.state.background.ignores_starting_after:
            after = -1
        exchange.outcome = "replayed"
        self._follow(response, after, None, obfuscation=_flag(query, "include_obfuscation", True))

    def _cancel(self, response_id: str) -> None:
        response = self.state.background.get(response_id)
        exchange = self.state.journal.open(self.path, RESPONSES.name, None)
        if response is None:
            exchange.outcome = "not_found"
            self._send_error_reply(RESPONSES.not_found(response_id), exchange)
            return
        exchange.outcome, exchange.status = "cancelled", 200
        self._send_json(200, response.cancel())

    def _stream(self, call: Call) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        call.exchange.status = 200
        delay_s = self.state.token_delay_ms / 1000.0
        fmt = call.wire.stream_format(call.request, call.usage)
        steps = stream_steps(
            fmt, call.completion, fault=call.fault, exchange=call.exchange, delay_s=delay_s
        )
        try:
            if delay_s > 0:
                keep = self.server.pacer.run(
                    self.connection, steps, self.wfile.write, call.exchange
                )
            else:
                keep = run_inline(steps, self.wfile.write, self.state.stopped, self.connection)
        except OSError:  # the client hung up, or the server did (stop)
            gone = "server_stopped" if self.state.stopped.is_set() else "client_gone"
            call.exchange.outcome, keep = gone, False
        if not keep:
            self._drop()

    def _complete(self, call: Call) -> None:
        wire, exchange, fault, completion = call.wire, call.exchange, call.fault, call.completion
        if fault is not None and fault.kind == "pause":  # the whole answer, that much later
            with contextlib.suppress(OSError):
                pause(fault.seconds, self.state.stopped, self.connection)
            fault = None
        cut = completion.tokens if fault is None else min(fault.after_tokens, completion.tokens)
        sent = completion.head(cut)
        output = Output.of(sent)
        if fault is None:
            body = wire.body(call.request, output, completion.finish, call.usage)
            for segment in sent.segments():
                exchange.record(segment).extend(segment.pieces)
                exchange.closed(segment)
            exchange.outcome, exchange.finish_reason = "finished", completion.finish
            exchange.status, exchange.response = 200, body
            self._send_json(200, body)
            return
        exchange.outcome, exchange.output_tokens_billed = fault.kind, cut
        if fault.kind == "error_event":
            self._send_error_reply(wire.error(wire.overload_status), exchange)
        elif fault.kind in ("truncate", "malformed", "sequence_skip", "sequence_repeat"):
            body = wire.body(call.request, output, None, call.usage)
            self._send_broken_json(dumps(body).encode(), truncate=fault.kind == "truncate")
            exchange.status = 200
        else:
            if fault.kind == "stall":
                with contextlib.suppress(OSError):  # the client went: so does the stall
                    pause(fault.seconds, self.state.stopped, self.connection)
            self._drop()

    def _send_broken_json(self, data: bytes, *, truncate: bool) -> None:
        """Half of ``data``: announced whole and then cut (truncate), or as the whole body
        (malformed: a complete response that is not valid JSON)."""
        half = data[: len(data) // 2]
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data) if truncate else len(half)))
        self.end_headers()
        self.wfile.write(half)
        if truncate:
            self._drop()

    # -- admin -----------------------------------------------------------------------------

    def _config(self) -> dict[str, Any]:
        config: dict[str, Any] = {
            "completion_tokens": self.state.completion_tokens,
            "token_delay_ms": self.state.token_delay_ms,
            **self.state.engine.describe(),
        }
        if self.state.chaos is not None:  # the key appears only while chaos is on
            config["chaos"] = self.state.chaos.describe()
        return config

    def _stats(self) -> dict[str, Any]:
        return {
            "cpu_seconds": self.state.cpu.seconds(),
            "threads": self.state.cpu.threads(),
            "paced_streams": self.server.pacer.active(),
        }

    def _admin(self, route: str, body: Any) -> None:
        state = self.state
        try:
            if route == "/_fake/faults":
                items = body.get("faults") if isinstance(body, Mapping) else body
                if not isinstance(items, list):
                    raise InvalidRequest(
                        'expected a JSON list of faults (or {"faults": [...]}); '
                        "GET /_fake/faults/schema describes one"
                    )
                queued = state.faults.queue(items)
                self._send_json(
                    200,
                    {
                        "queued": len(queued),
                        "ids": [q["id"] for q in queued],
                        "pending": state.faults.pending(),
                    },
                )
            elif route == "/_fake/reset":
                state.reset()
                self._send_json(200, {"ok": True})
            elif route == "/_fake/config":
                configure(state, body if isinstance(body, Mapping) else {})
                self._send_json(200, self._config())
            elif route == "/_fake/canonical":
                self._send_json(200, canonical_of(state, body))
            else:
                self._send_error_reply(OPENAI.error(404, f"no route POST {route}"))
        except ValidationError as exc:
            message = "; ".join(_problem(route, error) for error in exc.errors(include_url=False))
            self._send_json(422, {"error": {"message": message, "type": "invalid_request_error"}})
        except (InvalidRequest, TypeError) as exc:
            self._send_json(422, {"error": {"message": str(exc), "type": "invalid_request_error"}})


def _problem(route: str, error: Any) -> str:
    """One of pydantic's errors as a line naming where it is: ``faults[1].kind: ...`` for
    the second fault's kind, ``chaos.probability: ...`` for a ``/_fake/config`` key."""
    where = {"/_fake/faults": "faults", "/_fake/config": "chaos"}.get(route, "")
    for part in error["loc"]:
        if isinstance(part, int):
            where += f"[{part}]"
        elif where:
            where += f".{part}"
        else:
            where = str(part)
    return f"{where or 'body'}: {error['msg']}"


def _response_route(route: str) -> tuple[str, str] | None:
    """``/v1/responses/{id}`` → (id, ""); ``/v1/responses/{id}/cancel`` → (id, "cancel")."""
    parts = route.split("/")
    if len(parts) in (4, 5) and parts[1:3] == ["v1", "responses"] and parts[3]:
        return parts[3], parts[4] if len(parts) == 5 else ""
    return None


def _flag(query: Mapping[str, list[str]], name: str, default: bool) -> bool:
    values = query.get(name)
    return default if not values else values[-1].lower() in ("true", "1")


def _without_obfuscation(data: bytes) -> bytes:
    """An event as it goes out to a reader that asked for no obfuscation padding."""
    if b'"obfuscation"' not in data:
        return data
    head, _, rest = data.partition(b"data: ")
    event = json.loads(rest)
    event.pop("obfuscation", None)
    return head + b"data: " + dumps(event).encode() + b"\n\n"
