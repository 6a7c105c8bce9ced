"""``resumeq demo``: the whole product on its embedded default, no server needed.

It runs an embedded Redis (fakeredis, with Lua) on a loopback port, the fake provider,
two real worker processes and a janitor; enqueues a batch of jobs; cuts streams on
purpose (mid-stream disconnects, a truncation, a 429, a worker killed mid-stream, one job
whose remaining budget falls under its floor and spills); lets resumeq resume them; and
reports what the provider billed — read from the provider's own journal — against what
the answers needed and what a naive full replay would have billed under the same cuts.
"""

from __future__ import annotations

import contextlib
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fakeredis

from resumeq.core.models import holder_pid
from resumeq.fake import FakeProvider, count_tokens
from resumeq.producer.client import Client
from resumeq.testing import free_port
from resumeq.testing.processes import Cluster, Proc, descendants, wait_for, write_config

RESTING = {"done", "failed", "abandoned", "spilled", "cancelled", "dropped"}
#: The queue of the job whose worker is killed, served by a worker of its own: the kill cuts
#: that stream alone, as planned (a worker that also ran the others cut whichever of them
#: happened to be in flight, and the job meant to spill ran out of budget instead).
KILL_QUEUE = "resumeq-demo-kill"


@dataclass(frozen=True)
class DemoJob:
    name: str
    topic: str
    budget: int = 1000
    fault: dict[str, Any] | None = None
    #: Kill the worker streaming it once the provider has sent this many output tokens.
    kill_after: int | None = None
    exit: dict[str, Any] = field(default_factory=dict)

    @property
    def prompt(self) -> str:
        return f"[{self.name}] Write a short field guide entry about {self.topic}."


PLAN = (
    DemoJob("clean", "lighthouses"),
    DemoJob("disconnect", "tide pools", fault={"kind": "disconnect", "after_tokens": 70}),
    DemoJob("disconnect-late", "barn owls", fault={"kind": "disconnect", "after_tokens": 180}),
    DemoJob("truncated", "glaciers", fault={"kind": "truncate", "after_tokens": 110}),
    DemoJob("overloaded", "comets", fault={"kind": "error_event", "after_tokens": 90}),
    DemoJob(
        "rate-limited", "kelp forests", fault={"kind": "status", "status": 429, "retry_after": 1}
    ),
    # The provider pauses after 48 tokens, as real ones do under load, and the worker is
    # killed in that pause: in the middle of the stream, never after a short answer has
    # ended. The pause outlasts a busy machine's delay before the kill (at 1 s, a kill that
    # came after it cut the continuation instead); the kill ends it at once.
    DemoJob(
        "killed-worker",
        "salt marshes",
        fault={"kind": "stall", "after_tokens": 48, "seconds": 4},
        kill_after=48,
    ),
    DemoJob(
        "spills",
        "river deltas",
        budget=110,
        fault={"kind": "disconnect", "after_tokens": 90},
    ),
)


@dataclass
class JobReport:
    name: str
    id: str
    state: str
    attempts: int
    output_billed: int
    output_needed: int
    input_billed: int
    naive_output_billed: int
    naive_input_billed: int
    kinds: list[str]


@contextlib.contextmanager
def embedded_redis() -> Iterator[str]:
    """fakeredis (with Lua) serving the Redis protocol on a loopback port."""
    port = free_port()
    server = fakeredis.TcpFakeServer(("127.0.0.1", port))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="embedded-redis", daemon=True)
    thread.start()
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        server.shutdown()
        server.server_close()


def _sent(fake: FakeProvider, prompt: str) -> int:
    """The output tokens the provider has sent so far for ``prompt``'s first request (what
    the worker has checkpointed of them depends on its flush timing)."""
    return max(
        (
            r["tokens_emitted"]
            for r in fake.journal()
            if not r["is_continuation"] and prompt in str(r["body"])
        ),
        default=0,
    )


def _kill_streaming_worker(client: Client, job_id: str, workers: list[Proc]) -> Proc:
    """SIGKILL the worker process streaming ``job_id`` (it serves :data:`KILL_QUEUE`
    alone); the janitor resumes the job."""
    holder = holder_pid(client.get(job_id).record.lease_token)
    victim = next(w for w in workers if holder in (w.pid, *descendants(w.pid)))
    victim.kill()
    workers.remove(victim)
    return victim


def _report(client: Client, fake: FakeProvider, job: DemoJob, job_id: str) -> JobReport:
    view = client.get(job_id)
    ledger = client.store.ledger(job_id)
    requests = [
        r
        for r in fake.journal()
        if any(job.prompt in str(m.get("content")) for m in (r["body"] or {}).get("messages", []))
    ]
    # What the answer as delivered needed: its own tokens (the fake's tokenizer is exact).
    needed = count_tokens(view.text)
    billed = sum(r["output_tokens_billed"] for r in requests)
    paid = [r for r in requests if r["input_tokens_billed"] > 0]
    fresh_input = paid[0]["input_tokens_billed"] if paid else 0
    # A naive replay re-sends the whole request after every cut: it pays each cut
    # attempt's output again, then the whole answer; and the full prompt every time.
    cut_output = sum(r["output_tokens_billed"] for r in requests[:-1])
    return JobReport(
        name=job.name,
        id=job_id,
        state=view.state.value,
        attempts=len(requests),
        output_billed=billed,
        output_needed=needed,
        input_billed=sum(r["input_tokens_billed"] for r in requests),
        naive_output_billed=cut_output + needed,
        naive_input_billed=fresh_input * len(paid),
        kinds=[a["kind"] for a in ledger],
    )


def marked_text(client: Client, job_id: str, context: int = 160) -> str:
    """The job's text around each place a continuation was spliced on, marked."""
    text = client.get(job_id).text
    raw = text.encode("utf-8")
    pieces, at = [], 0
    ledger = client.store.ledger(job_id)
    for n, attempt in enumerate(ledger, start=1):
        end = at + attempt.get("bytes_persisted", 0)
        if n < len(ledger):
            before = raw[:end].decode("utf-8", errors="ignore")[-context:]
            after = raw[end:].decode("utf-8", errors="ignore")[:context]
            pieces.append(f"…{before}⟦{ledger[n]['kind']} #{n + 1}⟧{after}…")
        at = end
    return "\n".join(pieces) or text[: 2 * context]


def run_demo(*, progress: Any = None, timeout_s: float = 60.0) -> dict[str, Any]:
    """Run the demo; answers the summary (the ``--json`` object)."""
    say = progress or (lambda _msg: None)
    started = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix="resumeq-demo-") as tmp,
        embedded_redis() as url,
        FakeProvider(token_delay_ms=1.5) as fake,
    ):
        config = write_config(
            Path(tmp) / "resumeq.toml",
            {
                "providers": {
                    "demo": {
                        "kind": "openai",
                        "base_url": fake.openai_base_url,
                        "continue_mode": "instruction",
                        "counting": "usage",
                        "stall_timeout_s": 5.0,
                    }
                },
                "worker": {
                    "flush_tokens": 16,
                    "flush_ms": 250,
                    "lease_ttl_ms": 1500,
                    "queues": ["resumeq", KILL_QUEUE],
                },
                "janitor": {"interval_s": 0.25},
            },
        )
        cluster = Cluster(Path(tmp), redis_url=url, config=config)
        client = Client.from_url(url)
        try:
            say("starting an embedded Redis, the fake provider, 2 workers and a janitor")
            workers = [cluster.worker("resumeq"), cluster.worker(KILL_QUEUE)]
            cluster.janitor(interval_s=0.25)
            fake.add_faults([{**j.fault, "match": j.prompt} for j in PLAN if j.fault])
            ids = {}
            for job in PLAN:
                spec = {
                    "prompt": job.prompt,
                    "provider": "demo",
                    "model": "demo-model",
                    "budget_tokens": job.budget,
                    "exit": job.exit,
                }
                queue = KILL_QUEUE if job.kill_after is not None else "resumeq"
                ids[job.name] = client.enqueue(spec, queue=queue)
            say(f"enqueued {len(PLAN)} jobs; cutting streams on purpose")
            for job in PLAN:
                if job.kill_after is not None:
                    job_id = ids[job.name]
                    wait_for(
                        lambda: _sent(fake, job.prompt) >= job.kill_after,  # noqa: B023
                        timeout_s=timeout_s,
                        interval_s=0.01,
                    )
                    _kill_streaming_worker(client, job_id, workers)
                    say(f"killed the worker streaming {job.name!r} (SIGKILL)")
                    workers.append(cluster.worker(KILL_QUEUE))
            deadline = time.monotonic() + timeout_s
            for job in PLAN:
                left = max(0.1, deadline - time.monotonic())
                client.wait(ids[job.name], timeout=left)
                say(f"{job.name}: {client.get(ids[job.name]).state.value}")
            reports = [_report(client, fake, job, ids[job.name]) for job in PLAN]
            shown = ids["killed-worker"]
            splice = marked_text(client, shown)
        finally:
            cluster.stop()
            client.redis.close()
    return summarize(reports, splice, time.monotonic() - started)


def summarize(reports: list[JobReport], splice: str, seconds: float) -> dict[str, Any]:
    states = [r.state for r in reports]
    return {
        "jobs": len(reports),
        "done": states.count("done"),
        "abandoned": states.count("abandoned"),
        "spilled": states.count("spilled"),
        "failed": states.count("failed"),
        "attempts": sum(r.attempts for r in reports),
        "output_tokens_billed": sum(r.output_billed for r in reports),
        "output_tokens_needed": sum(r.output_needed for r in reports),
        "naive_output_tokens_billed": sum(r.naive_output_billed for r in reports),
        "input_tokens_billed": sum(r.input_billed for r in reports),
        "naive_input_tokens_billed": sum(r.naive_input_billed for r in reports),
        "seconds": round(seconds, 2),
        "per_job": [r.__dict__ for r in reports],
        "splice_example": splice,
    }


def render(summary: dict[str, Any]) -> str:
    """The human table."""
    lines = [
        f"{'job':<16} {'outcome':<9} {'attempts':>8} {'out billed':>10} {'needed':>7} "
        f"{'naive out':>9} {'in billed':>9} {'naive in':>8}  attempts",
    ]
    for r in summary["per_job"]:
        lines.append(
            f"{r['name']:<16} {r['state']:<9} {r['attempts']:>8} {r['output_billed']:>10} "
            f"{r['output_needed']:>7} {r['naive_output_billed']:>9} {r['input_billed']:>9} "
            f"{r['naive_input_billed']:>8}  {' > '.join(r['kinds'])}"
        )
    s = summary
    lines.append(
        f"{'total':<16} {'':<9} {s['attempts']:>8} {s['output_tokens_billed']:>10} "
        f"{s['output_tokens_needed']:>7} {s['naive_output_tokens_billed']:>9} "
        f"{s['input_tokens_billed']:>9} {s['naive_input_tokens_billed']:>8}"
    )
    saved = s["naive_output_tokens_billed"] - s["output_tokens_billed"]
    lines += [
        "",
        f"{s['done']} done, {s['spilled']} spilled, {s['abandoned']} abandoned, "
        f"{s['failed']} failed in {s['seconds']} s",
        f"output tokens: billed {s['output_tokens_billed']} for {s['output_tokens_needed']} "
        f"needed; a naive full replay would have billed {s['naive_output_tokens_billed']} "
        f"({saved} more)",
        f"input tokens: billed {s['input_tokens_billed']} (continuations re-send the prompt and "
        f"the prefix); a naive replay {s['naive_input_tokens_billed']}",
        "",
        "the killed worker's job, with its splice point marked:",
        s["splice_example"],
    ]
    return "\n".join(lines)
