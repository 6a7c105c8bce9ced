"""HTTP/1.1 or HTTP/2 for the worker's provider client: client CPU per token, memory per
stream, connections and time to first token, at S streams on one shared ``httpx.Client``.

The provider is hypercorn (a process of its own, so its CPU is not the client's) serving a
small ASGI app over TLS on loopback, ALPN offering ``h2`` and ``http/1.1``, with a
self-signed certificate made at run time by the ``openssl`` CLI. ``POST
/v1/chat/completions`` streams Server-Sent Events in OpenAI's chat-completions chunk shape,
one ``data: {...}`` event per token, one token every ``--token-delay-ms`` (paced against
the stream's start, so a late server bursts rather than drifts), then a ``stop`` chunk, a
usage chunk and ``data: [DONE]``.

Each side is one client process holding all S streams: S threads, one shared
``httpx.Client(http2=..., limits=httpx.Limits(max_connections=S,
max_keepalive_connections=S, keepalive_expiry=60))`` (httpx's default expiry, 5 s, drops
warm HTTP/1.1 connections while a slow wave finishes), trusting the certificate through an
``ssl.SSLContext``, reading events with the worker's own SSE parser
(``resumeq.providers.sse.iter_events``) and ``json.loads`` per event. A warm-up wave (3
tokens a stream) opens the connections; the measured wave then streams ``--tokens`` tokens
on each of S streams on warm connections, as a long-running worker would. Each stream reads
on past ``data: [DONE]`` to the body's end (``--no-drain``: it closes at ``[DONE]``, and
HTTP/1.1 cannot reuse that connection). The sides:

- ``http1``: ``http2=False``: one TCP+TLS connection per stream.
- ``http2``: ``http2=True`` against a server advertising ``SETTINGS_MAX_CONCURRENT_STREAMS``
  = ``--h2-max-streams`` (100, hypercorn's default and RFC 9113's recommended floor).
  httpcore 1.0 puts every request of an origin on ONE connection and queues streams beyond
  min(the server's limit, its own local 100) on a semaphore, never opening a second
  connection (encode/httpcore#248): above 100, streams wait for earlier ones to end.
- ``http2_wide``: the same against a server allowing 10 x S streams (the server's limit
  out of the way; httpcore's own 100 still holds).
- ``http2_serial``: ``http2_wide`` with stream opening serialised under one lock in the
  benchmark (request sent and response headers read), against httpcore's unlocked stream-id
  allocation and HEADERS sending from many threads (encode/httpx#3072, #3324): a peer that
  sees stream ids out of order ends the whole connection with GOAWAY PROTOCOL_ERROR.

Per side (medians over ``--repeats``; the sides run one after another, the order rotating):

- ``cpu_us_per_token``: client process CPU (``time.process_time``, every thread, less the
  sampling thread's own) over the measured wave ÷ tokens delivered in it.
  ``http2_cpu_ratio`` = the ``http2`` side's ÷ the ``http1`` side's, the median of the
  ratios within each repeat (``http2_wide_cpu_ratio``, ``http2_serial_cpu_ratio`` likewise).
- ``setup_cpu_ms``: client CPU of the warm-up wave (TCP, TLS handshakes, 3 tokens a stream).
- ``pss_kb_per_stream`` / ``rss_kb_per_stream``: the highest PSS/RSS sampled during the
  measured wave (``/proc/self/smaps_rollup``) minus the same before the first request
  (modules imported, client built), ÷ S. Thread stacks count on every side alike.
- ``delivered_ratio``: tokens delivered ÷ offered (S x ``--tokens``) before the wave's
  deadline (1.5 x the ideal stream time + 1 s; streams still open then are closed).
- ``connections_opened`` (httpcore's ``connection.connect_tcp.complete`` trace events,
  both waves) and ``connections_peak`` (sockets the client process holds, sampled
  every 0.5 s).
- ``ttft_ms_p50/p99``: from a stream's request to its first token, measured wave;
  ``cold_ttft_ms_*`` the same in the warm-up wave (connection setup included).
- ``server_cpu_us_per_token``: the server process's CPU over the measured wave ÷ tokens.

Prints one JSON object.

    python benchmarks/http2.py [--streams 50 200] [--tokens 300] [--token-delay-ms 20]
                               [--repeats 3] [--h2-max-streams 100] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from resumeq.providers.sse import iter_events
from resumeq.testing import free_port
from resumeq.testing.processes import Proc, wait_for

PATH = "/v1/chat/completions"
WARM_TOKENS = 3


@dataclass(frozen=True)
class Side:
    http2: bool
    wide: bool  # the server allows 10 x S concurrent streams, not --h2-max-streams
    serial_open: bool = False


SIDES = {
    "http1": Side(http2=False, wide=False),
    "http2": Side(http2=True, wide=False),
    "http2_wide": Side(http2=True, wide=True),
    "http2_serial": Side(http2=True, wide=True, serial_open=True),
}
_TICKS = os.sysconf("SC_CLK_TCK")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


# --- the provider: hypercorn and a tiny ASGI app ------------------------------------------


def chunk(index: int, delta: dict[str, str], finish: str | None) -> bytes:
    body = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": "bench-model",
        "system_fingerprint": "fp_bench",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


class SseApp:
    """``POST /v1/chat/completions`` with ``max_tokens`` N: N token events, paced."""

    def __init__(self, token_delay_s: float) -> None:
        self.token_delay_s = token_delay_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        if scope["path"] == PATH:
            await self._stream(int(json.loads(body)["max_tokens"]), send)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _stream(self, tokens: int, send: Send) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        for i in range(tokens):
            await asyncio.sleep(max(0.0, start + (i + 1) * self.token_delay_s - loop.time()))
            event = chunk(i, {"content": f" tok{i}"}, None)
            await send({"type": "http.response.body", "body": event, "more_body": True})
        usage = {"prompt_tokens": 12, "completion_tokens": tokens, "total_tokens": tokens + 12}
        tail = chunk(tokens, {}, "stop") + b"data: " + json.dumps({"usage": usage}).encode()
        tail += b"\n\ndata: [DONE]\n\n"
        await send({"type": "http.response.body", "body": tail, "more_body": True})


def serve(port: int, cert: str, key: str, max_streams: int, token_delay_ms: float) -> None:
    from hypercorn.asyncio import serve as hypercorn_serve  # noqa: PLC0415 - the server only
    from hypercorn.config import Config  # noqa: PLC0415

    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.certfile, config.keyfile = cert, key
    config.h2_max_concurrent_streams = max_streams
    config.keep_alive_timeout = 300.0  # warm-up connections stay open for the measured wave
    config.backlog = 4096  # S connects at once: no SYN dropped (a 1 s retransmit)
    config.accesslog = None

    async def run() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        app = SseApp(token_delay_ms / 1000)
        await hypercorn_serve(app, config, shutdown_trigger=stop.wait, mode="asgi")  # type: ignore[arg-type]

    asyncio.run(run())


# --- the client side: one process, S threads, one shared httpx.Client ---------------------


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def memory_kb() -> tuple[int, int]:
    """(PSS, RSS) of this process, from ``/proc/self/smaps_rollup``."""
    values = {}
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("Pss", "Rss"):
            values[name] = int(rest.split()[0])
    return values["Pss"], values["Rss"]


def sockets_open() -> int:
    """Sockets this process holds (in a client process: its connections to the server)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            continue
    return count


@dataclass
class StreamRecord:
    tokens: int = 0
    started: float = 0.0
    first: float | None = None
    finished: bool = False
    http_version: str = ""
    error: str = ""


class Wave:
    """S streams released together; each stops at ``deadline`` (perf_counter)."""

    def __init__(
        self, client: httpx.Client, url: str, streams: int, tokens: int, args: argparse.Namespace
    ) -> None:
        self.client, self.url, self.tokens = client, url, tokens
        self.records = [StreamRecord() for _ in range(streams)]
        self.barrier = threading.Barrier(streams + 1)
        self.deadline = 0.0
        self.connects: list[str] = []
        self.drain = not args.no_drain
        self.open_lock = threading.Lock() if args.serial_open else contextlib.nullcontext()

    def trace(self, event: str, info: dict[str, Any]) -> None:
        if event == "connection.connect_tcp.complete":
            self.connects.append(event)  # list.append is atomic

    def run_one(self, rec: StreamRecord) -> None:
        self.barrier.wait()
        rec.started = time.perf_counter()
        body = {"model": "bench-model", "stream": True, "max_tokens": self.tokens,
                "messages": [{"role": "user", "content": "benchmark"}]}  # fmt: skip
        request = self.client.build_request(
            "POST", self.url, json=body, extensions={"trace": self.trace}
        )
        try:
            with self.open_lock:  # --serial-open: one stream opens at a time
                response = self.client.send(request, stream=True)
            try:
                rec.http_version = response.http_version
                response.raise_for_status()
                chunks = response.iter_bytes()
                self._read(chunks, rec)
                if rec.finished and self.drain:
                    for _ in chunks:  # to the body's end: HTTP/1.1 keeps the connection
                        pass
            finally:
                response.close()
        except httpx.HTTPError as exc:
            rec.error = repr(exc)

    def _read(self, chunks: Iterator[bytes], rec: StreamRecord) -> None:
        for sse in iter_events(chunks):
            if sse.data == "[DONE]":
                rec.finished = True
                return
            data = json.loads(sse.data)
            choices = data.get("choices") or [{}]
            if choices[0].get("delta", {}).get("content"):
                if rec.first is None:
                    rec.first = time.perf_counter()
                rec.tokens += 1
            if time.perf_counter() > self.deadline:
                return  # leaving the with-block closes the stream

    def run(self, budget_s: float, server_pid: int) -> dict[str, Any]:
        threads = [threading.Thread(target=self.run_one, args=(r,)) for r in self.records]
        for t in threads:
            t.start()
        peak = (*memory_kb(), sockets_open())
        cpu0, sys0 = time.process_time(), resource.getrusage(resource.RUSAGE_SELF).ru_stime
        sampler0 = time.thread_time()  # this thread only samples: its CPU is not the streams'
        server0, wall0 = proc_cpu_s(server_pid), time.perf_counter()
        self.deadline = wall0 + budget_s
        self.barrier.wait()
        while any(t.is_alive() for t in threads):
            time.sleep(0.5)
            now = (*memory_kb(), sockets_open())
            peak = tuple(max(a, b) for a, b in zip(peak, now, strict=True))
        for t in threads:
            t.join()
        sampler = time.thread_time() - sampler0
        cpu, wall = time.process_time() - cpu0 - sampler, time.perf_counter() - wall0
        system = resource.getrusage(resource.RUSAGE_SELF).ru_stime - sys0
        server = proc_cpu_s(server_pid) - server0
        pss, rss, sockets = peak
        return {"cpu_s": cpu, "sys_s": system, "wall_s": wall, "server_cpu_s": server,
                "pss_peak_kb": pss, "rss_peak_kb": rss, "connections_peak": sockets}  # fmt: skip


def pct(values: list[float], q: float) -> float:
    if not values:
        return -1.0
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)


def ttft_ms(records: list[StreamRecord]) -> list[float]:
    return [(r.first - r.started) * 1000 for r in records if r.first is not None]


def client_side(args: argparse.Namespace) -> dict[str, Any]:
    """One side: a warm-up wave, then the measured wave; the figures as one dict."""
    context = ssl.create_default_context(cafile=args.cafile)
    limits = httpx.Limits(
        max_connections=args.streams, max_keepalive_connections=args.streams, keepalive_expiry=60
    )
    timeout = httpx.Timeout(30.0, pool=None)
    url = f"https://localhost:{args.port}{PATH}"
    ideal_s = args.tokens * args.token_delay_ms / 1000
    with httpx.Client(verify=context, http2=args.http2, limits=limits, timeout=timeout) as client:
        pss0, rss0 = memory_kb()
        warm = Wave(client, url, args.streams, WARM_TOKENS, args)
        warm_figures = warm.run(60.0, args.server_pid)
        wave = Wave(client, url, args.streams, args.tokens, args)
        figures = wave.run(1.5 * ideal_s + 1.0, args.server_pid)
    tokens = sum(r.tokens for r in wave.records)
    errors = [r.error for r in wave.records + warm.records if r.error]
    return {
        "cpu_us_per_token": round(figures["cpu_s"] / max(tokens, 1) * 1e6, 2),
        "setup_cpu_ms": round(warm_figures["cpu_s"] * 1000, 1),
        "pss_kb_per_stream": round((figures["pss_peak_kb"] - pss0) / args.streams, 1),
        "rss_kb_per_stream": round((figures["rss_peak_kb"] - rss0) / args.streams, 1),
        "delivered_ratio": round(tokens / (args.streams * args.tokens), 4),
        "streams_finished": sum(r.finished for r in wave.records),
        "connections_opened": len(warm.connects) + len(wave.connects),
        "connections_peak": max(warm_figures["connections_peak"], figures["connections_peak"]),
        "ttft_ms_p50": pct(ttft_ms(wave.records), 0.5),
        "ttft_ms_p99": pct(ttft_ms(wave.records), 0.99),
        "cold_ttft_ms_p50": pct(ttft_ms(warm.records), 0.5),
        "cold_ttft_ms_p99": pct(ttft_ms(warm.records), 0.99),
        "client_cpu_util": round(figures["cpu_s"] / figures["wall_s"], 3),
        "client_sys_share": round(figures["sys_s"] / max(figures["cpu_s"], 1e-9), 3),
        "server_cpu_us_per_token": round(figures["server_cpu_s"] / max(tokens, 1) * 1e6, 2),
        "server_cpu_util": round(figures["server_cpu_s"] / figures["wall_s"], 3),
        "wall_s": round(figures["wall_s"], 2),
        "http_versions": sorted({r.http_version for r in wave.records if r.http_version}),
        "errors": len(errors),
        "first_error": errors[0] if errors else "",
    }


# --- the orchestrator -------------------------------------------------------------------


def make_certificate(directory: Path) -> tuple[str, str]:
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    return str(cert), str(key)


@dataclass
class Server:
    proc: Proc
    port: int


def start_server(directory: Path, cert: str, key: str, max_streams: int, delay: float) -> Server:
    port = free_port()
    args = [sys.executable, __file__, "--serve", "--port", str(port), "--cafile", cert]
    args += ["--keyfile", key, "--h2-max-streams", str(max_streams)]
    args += ["--token-delay-ms", str(delay)]
    log = directory / f"server-{port}.log"
    return Server(Proc(args, env={**os.environ, "PYTHONUNBUFFERED": "1"}, log=log), port)


def wait_ready(server: Server, cert: str) -> None:
    context = ssl.create_default_context(cafile=cert)

    def ready() -> bool:
        if not server.proc.alive():
            raise RuntimeError(f"the server exited: {server.proc.output()[-2000:]}")
        try:
            response = httpx.get(f"https://localhost:{server.port}/health", verify=context)
        except httpx.TransportError:
            return False
        return response.status_code == 200

    wait_for(ready, timeout_s=30, interval_s=0.1, what="the hypercorn server")


def run_side(
    side: str, streams: int, server: Server, *, cert: str, args: argparse.Namespace, tmp: Path
) -> dict[str, Any]:
    """One client process for ``side``; its JSON line."""
    cmd = [sys.executable, __file__, "--client", "--port", str(server.port), "--cafile", cert]
    cmd += ["--server-pid", str(server.proc.pid), "--streams", str(streams)]
    cmd += ["--tokens", str(args.tokens), "--token-delay-ms", str(args.token_delay_ms)]
    if SIDES[side].http2:
        cmd.append("--http2")
    if SIDES[side].serial_open:
        cmd.append("--serial-open")
    if args.no_drain:
        cmd.append("--no-drain")
    log = tmp / f"client-{side}-{streams}.log"
    proc = Proc(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"}, log=log)
    try:
        status = proc.wait(timeout=120 + 3 * args.tokens * args.token_delay_ms / 1000)
    finally:
        proc.stop()
    lines = proc.output().strip().splitlines()
    if status != 0 or not lines:
        raise RuntimeError(f"the {side} client failed ({status}): {proc.output()[-3000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def summarise(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for side, results in runs.items():
        figures: dict[str, Any] = {}
        for key, value in results[0].items():
            if isinstance(value, int | float):
                figures[key] = round(statistics.median(r[key] for r in results), 3)
            else:
                figures[key] = value
        out[side] = figures
    for side in list(SIDES)[1:]:
        pairs = zip(runs[side], runs["http1"], strict=True)
        ratios = [a["cpu_us_per_token"] / b["cpu_us_per_token"] for a, b in pairs]
        out[f"{side}_cpu_ratio"] = round(statistics.median(ratios), 3)
    return out


def measure(args: argparse.Namespace, directory: Path, cert: str, key: str) -> dict[str, Any]:
    servers: list[Server] = []
    try:
        capped = start_server(directory, cert, key, args.h2_max_streams, args.token_delay_ms)
        servers.append(capped)
        wide = start_server(directory, cert, key, 10 * max(args.streams), args.token_delay_ms)
        servers.append(wide)
        for server in servers:
            wait_ready(server, cert)
        out: dict[str, Any] = {}
        for streams in args.streams:
            runs: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
            names = list(SIDES)
            for i in range(args.repeats):
                for side in names[i % 4 :] + names[: i % 4]:  # the order rotating
                    server = wide if SIDES[side].wide else capped
                    got = run_side(side, streams, server, cert=cert, args=args, tmp=directory)
                    runs[side].append(got)
                    print(f"... S={streams} {side}: {json.dumps(got)}", file=sys.stderr)
            out[str(streams)] = summarise(runs)
        return out
    finally:
        for server in servers:
            server.proc.stop()


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, nargs="+", default=[50, 200])
    parser.add_argument("--tokens", type=int, default=300, help="tokens per stream")
    parser.add_argument("--token-delay-ms", type=float, default=20.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--h2-max-streams", type=int, default=100)
    parser.add_argument("--quick", action="store_true", help="50 streams, 60 tokens, 1 repeat")
    # internal: the server process and the client processes
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--no-drain", action="store_true", help="close each stream at [DONE], before its end"
    )
    parser.add_argument("--http2", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--serial-open", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--cafile", help=argparse.SUPPRESS)
    parser.add_argument("--keyfile", help=argparse.SUPPRESS)
    parser.add_argument("--server-pid", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.streams, args.tokens, args.repeats = [50], 60, 1
    if args.client:
        args.streams = args.streams[0]
    return args


def main(argv: list[str]) -> int:
    args = parse(argv)
    if args.serve:
        serve(args.port, args.cafile, args.keyfile, args.h2_max_streams, args.token_delay_ms)
        return 0
    if args.client:
        print(json.dumps(client_side(args)))
        return 0
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="resumeq-http2-") as tmp:
        cert, key = make_certificate(Path(tmp))
        by_streams = measure(args, Path(tmp), cert, key)
    top = {
        "token_delay_ms": args.token_delay_ms,
        "tokens_per_stream": args.tokens,
        "repeats": args.repeats,
        "h2_max_streams": args.h2_max_streams,
        "http2_cpu_ratio": {s: v["http2_cpu_ratio"] for s, v in by_streams.items()},
        **{
            f"{side}_cpu_ratio": {s: v[f"{side}_cpu_ratio"] for s, v in by_streams.items()}
            for side in ("http2_wide", "http2_serial")
        },
        "streams": by_streams,
        "load_avg_1m_before": round(load_before, 2),
        "load_avg_1m_after": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(top))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
