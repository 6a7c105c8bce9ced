"""Cost against a naive replay: billed tokens, money and wall time, resumeq against a plain RQ
job with ``Retry(max=5)`` that re-sends the whole request when its stream is cut.

Both sides run the same jobs (``--jobs``, each with a ``--tokens``-token canonical answer
and a budget of ``--budget``) under the same seeded fault plan: the fake provider's chaos
mode cuts each request with ``--probability`` at a uniformly random token of what it would
send, with one RNG per conversation, so attempt n of job i meets the same draw on both
sides. Tokens are counted from the fake provider's journal (what a provider would bill),
never from resumeq's ledger. Side A is resumeq (flush every 32 tokens / 250 ms,
``max_attempts`` = 6 = the baseline's tries); side B the baseline users have today (the same
provider client, one replay per cut), the same number of streams at once on each side. Two
scenarios: a short prompt, and a ``--system-tokens`` system prompt (its own per job) where
resumeq also runs with ``resume_context = "tail:N"``. Sides alternate order between repeats
(seed + repeat); medians over repeats. Prints one JSON object, with ``wall_ratio``
(resumeq's wall time ÷ the replay's, short prompt) among its keys.

``--provider-kind responses-background``: resumeq on the Responses wire with background
responses (a cut is read on from the provider: ``reattach``), beside resumeq on the same
wire without them (a cut is continued: the prompt and the prefix are sent again) and the
naive replay; keys ``resumeq_output_ratio`` and ``resumeq_input_ratio`` (input billed ÷
one uncut request's input), and the continuation side's beside them.

    python benchmarks/cost.py [--jobs N] [--tokens N] [--budget N] [--probability P]
        [--workers N] [--repeats N] [--seed S] [--system-tokens N] [--tail N]
        [--provider-kind openai|responses-background]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _harness import (
    baseline_worker,
    ended_rq_jobs,
    enqueue_naive,
    journal_totals,
    median,
    money,
    rq_workers,
    wait_until,
)
from rq.job import Job
from rq.serializers import JSONSerializer

from resumeq.fake import VOCABULARY, FakeProvider, count_tokens
from resumeq.fake.conversation import conversation_of
from resumeq.fake.prompt import layout
from resumeq.producer.enqueue import enqueue_job
from resumeq.store import Store, keys
from resumeq.testing import RedisServer
from resumeq.testing.processes import Cluster, write_config

RESUMEQ_QUEUE = "resumeq"
BASELINE_QUEUE = "naive"
ENDED = {"done", "failed", "abandoned", "spilled", "cancelled", "dropped"}


def percentile(values: list[float], pct: float) -> float:
    """The nearest-rank percentile: the smallest value with ``pct`` % of them at or below."""
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]


def system_prompt(job: int, tokens: int) -> str:
    """A system prompt of exactly ``tokens`` fake tokens, its own for each job (the first
    tokens differ), so the prompt cache helps only across one job's own attempts."""
    text = f"House rules for job {job}."
    words = [" " + VOCABULARY[(job * 7919 + k * 31) % len(VOCABULARY)] for k in range(tokens)]
    return text + "".join(words[: tokens - count_tokens(text)])


def job_specs(args: argparse.Namespace, *, long_prompt: bool) -> list[dict[str, Any]]:
    specs = []
    for i in range(args.jobs):
        messages = [{"role": "user", "content": f"Job {i}: describe a harbour at dawn."}]
        if long_prompt:
            messages.insert(0, {"role": "system", "content": system_prompt(i, args.system_tokens)})
        specs.append(
            {
                "messages": messages,
                "provider": "fake",
                "model": "fake-model",
                "budget_tokens": args.budget,
                "exit": {"max_attempts": args.retries + 1},
            }
        )
    return specs


class Bench:
    def __init__(self, args: argparse.Namespace, store: Store, fake: FakeProvider) -> None:
        self.args = args
        self.store = store
        self.redis = store.redis
        self.fake = fake

    def _arm(self, seed: int) -> None:
        self.fake.reset()
        self.fake.chaos(self.args.probability, ["disconnect"], seed=seed, scope="conversation")

    def _deadline(self) -> float:
        return time.monotonic() + self.args.timeout_s

    def run_resumeq(self, specs: list[dict[str, Any]], seed: int, profile: str) -> dict[str, Any]:
        self._arm(seed)
        started = time.monotonic()
        ids = [enqueue_job(self.store, self.redis, {**s, "provider": profile}).id for s in specs]
        states: list[str] = []

        def ended() -> bool:
            nonlocal states
            with self.redis.pipeline(transaction=False) as pipe:
                for job_id in ids:
                    pipe.hget(keys.job(job_id), "state")
                states = [s.decode() for s in pipe.execute()]
            return all(s in ENDED for s in states)

        wait_until(ended, deadline=self._deadline(), interval_s=0.02, what="resumeq jobs")
        wall = time.monotonic() - started
        text_ok = sum(
            1
            for job_id, spec, state in zip(ids, specs, states, strict=True)
            if state == "done"
            and self.store.text(job_id) == self.fake.canonical_text(spec["messages"])
        )
        # Each job's time to answer: from its record's creation to its end (Redis's clock).
        records = [self.store.get(job_id) for job_id in ids]
        answers = [(r.finished_ms or r.updated_ms) - r.created_ms for r in records]
        return self._summary(wall, done=states.count("done"), text_ok=text_ok, answers_ms=answers)

    def run_baseline(self, specs: list[dict[str, Any]], seed: int) -> dict[str, Any]:
        self._arm(seed)
        before = ended_rq_jobs(self.redis, BASELINE_QUEUE)
        started = time.monotonic()
        ids = [
            enqueue_naive(self.redis, spec, queue=BASELINE_QUEUE, retries=self.args.retries)
            for spec in specs
        ]
        wait_until(
            lambda: ended_rq_jobs(self.redis, BASELINE_QUEUE) - before >= len(specs),
            deadline=self._deadline(),
            interval_s=0.02,
            what="baseline jobs",
        )
        wall = time.monotonic() - started
        finished = sum(1 for e in self.fake.journal() if e["outcome"] == "finished")
        # Each job's time to answer: from its creation to the end of its last try (RQ's
        # clock, this machine's: a retry enqueues it again, so not its enqueued_at).
        jobs = Job.fetch_many(ids, connection=self.redis, serializer=JSONSerializer)
        answers = [
            (job.ended_at - job.created_at).total_seconds() * 1000
            for job in jobs
            if job is not None and job.ended_at is not None and job.created_at is not None
        ]
        return self._summary(wall, done=finished, text_ok=None, answers_ms=answers)

    def _summary(
        self, wall: float, *, done: int, text_ok: int | None, answers_ms: list[float]
    ) -> dict[str, Any]:
        t = journal_totals(self.fake.journal())
        needed = self.args.jobs * self.args.tokens
        if len(answers_ms) != self.args.jobs:
            raise RuntimeError(f"{len(answers_ms)} of {self.args.jobs} jobs have an end time")
        out: dict[str, Any] = {
            "wall_s": round(wall, 2),
            "p50_s": round(percentile(answers_ms, 50) / 1000, 3),
            "p99_s": round(percentile(answers_ms, 99) / 1000, 3),
            "jobs_done": done,
            "requests": t["requests"],
            "requests_cut": t["cut"],
            "output_billed": t["output"],
            "output_needed": needed,
            "output_ratio": round(t["output"] / needed, 4),
            "input_billed": t["input"],
            "cached_input_billed": t["cached_input"],
            "money_usd": round(money(t["input"], t["cached_input"], t["output"]), 4),
        }
        if text_ok is not None:
            out["text_exact"] = text_ok
        return out


#: The provider profile each resumeq side runs on (``resumeq``: per ``--provider-kind``).
SIDE_PROFILES = {
    "resumeq_tail": "fake-tail",
    "resumeq_continuation": "fake-responses",
}
MAIN_PROFILE = {"openai": "fake", "responses-background": "fake-background"}


def scenario(
    bench: Bench, specs: list[dict[str, Any]], sides: list[str], repeats: int, seed: int
) -> dict[str, Any]:
    runs: list[dict[str, dict[str, Any]]] = []
    for r in range(repeats):
        order = sides if r % 2 == 0 else sides[::-1]
        run: dict[str, dict[str, Any]] = {}
        for side in order:
            if side == "baseline":
                run[side] = bench.run_baseline(specs, seed + r)
            else:
                profile = SIDE_PROFILES.get(side, MAIN_PROFILE[bench.args.provider_kind])
                run[side] = bench.run_resumeq(specs, seed + r, profile)
        runs.append(run)
    # The input of the same jobs with no cut at all (one request each), for the input side.
    first_input = sum(len(layout(conversation_of(s["messages"]))) for s in specs)
    summary: dict[str, Any] = {}
    for side in sides:
        keys_ = runs[0][side].keys()
        summary[side] = {k: median(run[side][k] for run in runs) for k in keys_}
        summary[side]["input_ratio"] = round(summary[side]["input_billed"] / first_input, 3)
    for side in sides:
        if side != "baseline":
            summary[f"{side}_vs_baseline_output"] = median(
                run[side]["output_billed"] / run["baseline"]["output_billed"] for run in runs
            )
            summary[f"{side}_vs_baseline_money"] = median(
                run[side]["money_usd"] / run["baseline"]["money_usd"] for run in runs
            )
            summary[f"{side}_vs_baseline_wall"] = median(
                run[side]["wall_s"] / run["baseline"]["wall_s"] for run in runs
            )
            for pct in ("p50", "p99"):
                summary[f"{side}_vs_baseline_{pct}"] = median(
                    run[side][f"{pct}_s"] / run["baseline"][f"{pct}_s"] for run in runs
                )
    summary["input_tokens_per_uncut_job"] = round(first_input / len(specs), 1)
    summary["runs"] = runs
    return summary


def _background_report(args: argparse.Namespace, bench: Bench) -> int:
    """Background responses beside continuations on the same wire, and the naive replay."""
    sides = ["resumeq", "resumeq_continuation", "baseline"]
    short = scenario(bench, job_specs(args, long_prompt=False), sides, args.repeats, args.seed)
    long = scenario(bench, job_specs(args, long_prompt=True), sides, args.repeats, args.seed)
    ours = short["resumeq"]
    result = {
        "provider_kind": "responses-background",
        "jobs": args.jobs,
        "output_tokens_per_job": args.tokens,
        "cut_probability": args.probability,
        "seed": args.seed,
        "repeats": args.repeats,
        "workers_per_side": args.workers,
        "resumeq_output_ratio": ours["output_ratio"],
        "resumeq_input_ratio": ours["input_ratio"],
        "resumeq_input_ratio_long_prompt": long["resumeq"]["input_ratio"],
        "continuation_output_ratio": short["resumeq_continuation"]["output_ratio"],
        "continuation_input_ratio": short["resumeq_continuation"]["input_ratio"],
        "continuation_input_ratio_long_prompt": long["resumeq_continuation"]["input_ratio"],
        "baseline_output_ratio": short["baseline"]["output_ratio"],
        "baseline_input_ratio": short["baseline"]["input_ratio"],
        "resumeq_requests": ours["requests"],
        "resumeq_text_exact": ours["text_exact"],
        "resumeq_vs_continuation_money": median(
            run["resumeq"]["money_usd"] / run["resumeq_continuation"]["money_usd"]
            for run in short["runs"]
        ),
        "wall_ratio_vs_continuation": median(
            run["resumeq"]["wall_s"] / run["resumeq_continuation"]["wall_s"]
            for run in short["runs"]
        ),
        "wall_ratio_vs_baseline": short["resumeq_vs_baseline_wall"],
        "target_resumeq_output_ratio_max": 1.02,
        "target_resumeq_input_ratio_max": 1.05,
        "target_met": ours["output_ratio"] <= 1.02 and ours["input_ratio"] <= 1.05,
        "short_prompt": {k: v for k, v in short.items() if k != "runs"},
        "long_prompt": {k: v for k, v in long.items() if k != "runs"},
    }
    print(json.dumps(result, indent=2))
    return 0 if result["target_met"] else 1


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--tokens", type=int, default=600, help="canonical answer length")
    parser.add_argument("--budget", type=int, default=800)
    parser.add_argument("--probability", type=float, default=0.5)
    parser.add_argument("--retries", type=int, default=5, help="the baseline's Retry(max=N)")
    parser.add_argument("--workers", type=int, default=4, help="per side")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--system-tokens", type=int, default=4000)
    parser.add_argument("--tail", type=int, default=256)
    parser.add_argument("--timeout-s", type=float, default=300.0, help="per side and run")
    parser.add_argument(
        "--provider-kind",
        choices=sorted(MAIN_PROFILE),
        default="openai",
        help="resumeq's side: the Chat Completions wire, or Responses with background responses",
    )
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.tokens < 1 or args.budget < args.tokens or args.repeats < 1:
        parser.error("need --jobs, --tokens, --repeats >= 1 and --budget >= --tokens")
    with (
        tempfile.TemporaryDirectory(prefix="resumeq-cost-") as tmp,
        RedisServer() as server,
        FakeProvider(completion_tokens=args.tokens) as fake,
    ):
        profile = {
            "kind": "openai",
            "base_url": fake.openai_base_url,
            "continue_mode": "instruction",
            "counting": "usage",
        }
        # The Responses wire has no usage in a cut stream: a continuation's cut attempt is
        # counted by the engine's /tokenize (vLLM's), as a careful user configures it.
        responses = {
            **profile,
            "kind": "openai-responses",
            "continue_mode": "continue_final_message",
            "counting": "usage+tokenizer",
        }
        config = write_config(
            Path(tmp) / "resumeq.toml",
            {
                "providers": {
                    "fake": profile,
                    "fake-tail": {**profile, "resume_context": f"tail:{args.tail}"},
                    "fake-responses": responses,
                    "fake-background": {**responses, "background": True},
                },
                "worker": {"flush_tokens": 32, "flush_ms": 250},
            },
        )
        cluster = Cluster(Path(tmp), redis_url=server.url, config=config, thread_caches_off=False)
        store = Store.from_url(server.url)
        bench = Bench(args, store, fake)
        try:
            # The same number of streams at once on each side: resumeq's worker processes
            # run one attempt each, as the baseline's forking RQ workers do.
            for _ in range(args.workers):
                cluster.worker(RESUMEQ_QUEUE, concurrency=1)
                baseline_worker(cluster, BASELINE_QUEUE)
            # Both sides' workers ready (registered with RQ) before either side's clock
            # starts: a start-up is no part of a job's time to answer.
            wait_until(
                lambda: rq_workers(store.redis) >= 2 * args.workers,
                deadline=time.monotonic() + 60,
                interval_s=0.05,
                what="workers to start",
            )
            if args.provider_kind == "responses-background":
                return _background_report(args, bench)
            short = scenario(
                bench,
                job_specs(args, long_prompt=False),
                ["resumeq", "baseline"],
                args.repeats,
                args.seed,
            )
            long = scenario(
                bench,
                job_specs(args, long_prompt=True),
                ["resumeq", "resumeq_tail", "baseline"],
                args.repeats,
                args.seed,
            )
        except TimeoutError:
            print(cluster.logs(), file=sys.stderr)
            raise
        finally:
            cluster.stop()
    ours, theirs = short["resumeq"]["output_ratio"], short["baseline"]["output_ratio"]
    result = {
        "jobs": args.jobs,
        "output_tokens_per_job": args.tokens,
        "budget_tokens": args.budget,
        "cut_probability": args.probability,
        "seed": args.seed,
        "repeats": args.repeats,
        "workers_per_side": args.workers,
        "baseline_retry_max": args.retries,
        "resumeq_max_attempts": args.retries + 1,
        "prices_per_million": {"input": 3.0, "cached_input": 0.3, "output": 15.0},
        "resumeq_output_ratio": ours,
        "baseline_output_ratio": theirs,
        "resumeq_vs_baseline_output": short["resumeq_vs_baseline_output"],
        "target_resumeq_output_ratio_max": 1.03,
        "target_vs_baseline_max": 0.75,
        "target_met": ours <= 1.03 and short["resumeq_vs_baseline_output"] <= 0.75,
        # Wall time, resumeq ÷ the naive replay, same run and fault plan (a continuation
        # generates fewer tokens than a replay, so the physical limit is below 1.0).
        "wall_ratio": short["resumeq_vs_baseline_wall"],
        "wall_ratio_long_prompt": long["resumeq_vs_baseline_wall"],
        "wall_ratio_long_prompt_tail": long["resumeq_tail_vs_baseline_wall"],
        "target_wall_ratio_max": 1.0,
        "target_wall_ratio_long_prompt_max": 1.1,
        # Per-job time to answer, each side's own percentile (seconds), and the ratios.
        "time_to_answer_s": {
            size: {
                side: {"p50": scenario_[side]["p50_s"], "p99": scenario_[side]["p99_s"]}
                for side in sides
            }
            for size, scenario_, sides in (
                ("short_prompt", short, ("resumeq", "baseline")),
                ("long_prompt", long, ("resumeq", "resumeq_tail", "baseline")),
            )
        },
        "p50_ratio": short["resumeq_vs_baseline_p50"],
        "p99_ratio": short["resumeq_vs_baseline_p99"],
        "p99_ratio_long_prompt": long["resumeq_vs_baseline_p99"],
        "target_p99_ratio_max": 1.0,
        "wall_target_met": short["resumeq_vs_baseline_wall"] <= 1.0
        and long["resumeq_vs_baseline_wall"] <= 1.1
        and short["resumeq_vs_baseline_p99"] <= 1.0
        and long["resumeq_vs_baseline_p99"] <= 1.0,
        "short_prompt": short,
        "long_prompt": {"system_tokens": args.system_tokens, "tail": args.tail, **long},
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
