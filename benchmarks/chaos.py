"""The chaos soak: jobs streaming through worker deaths, provider faults and a Redis restart.

Workers are killed, frozen and sent SIGTERM (a deploy), worker processes exit at failpoints
between a commit and what must follow it, the provider injects random faults and Redis (AOF,
appendfsync always) restarts; then the checks.

    python benchmarks/chaos.py [--duration S] [--jobs N] [--workers N] [--fault-probability P]
                               [--failpoint-probability P] [--handoff-every S]
                               [--read-pause-ms MS] [--failovers N]
                               [--durability primary|replica] [--keep DIR]

``--failovers N`` runs Redis as a Sentinel deployment (a primary, its replica, three
sentinels) and fails it over N times (the primary SIGKILLed, its last writes not on the
replica) instead of restarting it.

Prints one JSON object: jobs, terminal, canonical, lost, duplicated_text, gap,
inconsistent_events, over_billed, hook_runs, hook_reruns, hooks_missing, hooks_rerun_differed,
fenced_writes_refused, worker_kills, commit_kills, worker_freezes, worker_handoffs,
handoffs_unclean, handed_off_attempts, redis_restarts, failovers,
faults_injected and more. Exits 1 if any job was lost, spliced wrong or left inconsistent,
or a done job's hook did not have its effect exactly once, with its final text.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from resumeq.testing.soak import SoakConfig, run_soak


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=300.0, help="seconds of chaos")
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--fault-probability", type=float, default=0.2)
    parser.add_argument(
        "--failpoint-probability",
        type=float,
        default=0.05,
        help="chance per hit of the failpoint each worker arms (0: none)",
    )
    parser.add_argument("--kill-every", type=float, default=4.0, help="seconds between kills")
    parser.add_argument(
        "--handoff-every", type=float, default=6.0, help="seconds between SIGTERMs (deploys)"
    )
    parser.add_argument(
        "--read-pause-ms", type=int, default=0, help="the workers' paced reads (0: off)"
    )
    parser.add_argument(
        "--failovers", type=int, default=0, help="Sentinel failovers instead of a restart"
    )
    parser.add_argument("--durability", choices=("primary", "replica"), default="primary")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--keep", type=Path, default=None, help="run in DIR and keep its logs and Redis data"
    )
    args = parser.parse_args(argv)
    if args.duration <= 0 or args.jobs < 1 or args.workers < 2:
        parser.error("--duration > 0, --jobs >= 1 and --workers >= 2 are needed")
    if not 0 <= args.failpoint_probability < 1:
        parser.error("--failpoint-probability must be in [0, 1)")
    if args.failovers < 0:
        parser.error("--failovers must be at least 0")
    if not 0 <= args.read_pause_ms <= 1000:
        parser.error("--read-pause-ms must be in [0, 1000]")
    result = run_soak(
        SoakConfig(
            jobs=args.jobs,
            workers=args.workers,
            duration_s=args.duration,
            fault_probability=args.fault_probability,
            failpoint_probability=args.failpoint_probability,
            kill_every_s=args.kill_every,
            handoff_every_s=args.handoff_every,
            read_pause_ms=args.read_pause_ms,
            failovers=args.failovers,
            durability=args.durability,
            seed=args.seed,
        ),
        keep=args.keep,
    )
    print(json.dumps(result))
    broken = result["lost"] + result["duplicated_text"] + result["gap"]
    hooks = (
        result["hooks_missing"]
        + result["hooks_rerun_differed"]
        + result["hooks_stale_text"]
        + result["hooks_unexpected"]
    )
    inconsistent = result["inconsistent_events"] or result["terminal"] != result["jobs"]
    unclean = result["handoffs_unclean"]  # a deploy's SIGTERM that did not end in a handoff
    return 1 if broken or hooks or inconsistent or unclean else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
