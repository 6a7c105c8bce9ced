"""How far a cut attempt's estimated output is from its truth: calibrated on exact counts
(``resumeq.core.calibration``) against the fixed bytes-per-token rule it replaces, side by side on
the same cut texts.

The texts are the fake provider's genres (prose of long tokens, code, tables, songs,
laughter, periodic patterns, lists, odd Unicode, a mixed answer, an HTML page: the repetitive
corpus of ``benchmarks/splice_corpus.py``), several seeds each, counted by the fake's own
tokenizer. Two wires: one token per chunk (the OpenAI wire and most OpenAI-compatible
engines) and deltas of one to four tokens (the Anthropic wire). A calibration is made from
``--answers`` exact answers of 200 to 600 tokens of any genre; then ``--cuts`` cut texts of
``--min-tokens`` to 600 tokens are estimated both ways. Reported per wire: the share of
estimates below the truth (target ≤ 1 %: an estimate that errs low can buy past the
budget), above 1.25 times it (target ≤ 5 %), and the median ratio; the fixed rule's the
same, on the same texts (4 bytes a token on the OpenAI wire, 2 on Anthropic's: the
defaults). Pure computation: no servers. Prints one JSON object.

    .venv/bin/python benchmarks/estimates.py [--answers 16] [--cuts 6000] [--min-tokens 50]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from typing import Any

from resumeq.core.calibration import Calibration, Sample, pieces
from resumeq.core.counting import estimate
from resumeq.fake.conversation import conversation_of
from resumeq.fake.genres import genre_tokens
from resumeq.fake.markers import GENRES

TEXT_TOKENS = 1_200
FIXED_BYTES_PER_TOKEN = {"one-per-chunk": 4.0, "grouped": 2.0}


def corpus(seeds: int) -> dict[str, list[list[str]]]:
    out = {}
    for genre in GENRES:
        out[genre] = []
        for seed in range(seeds):
            conversation = conversation_of([{"role": "user", "content": f"{genre} {seed}"}])
            out[genre].append(list(genre_tokens(genre, conversation.seed(), TEXT_TOKENS)))
    return out


def cut(
    rng: random.Random, texts: dict[str, list[list[str]]], wire: str, low: int, high: int
) -> Sample:
    tokens = rng.choice(texts[rng.choice(GENRES)])
    n = rng.randint(low, high)
    start = rng.randint(0, TEXT_TOKENS - n)
    text = "".join(tokens[start : start + n])
    if wire == "one-per-chunk":
        chunks = n
    else:  # the Anthropic wire's grouping: one to four tokens a delta
        chunks, left = 0, n
        while left > 0:
            left -= rng.randint(1, 4)
            chunks += 1
    return Sample(len(text.encode("utf-8")), chunks, pieces(text), n)


def shares(ratios: list[float]) -> dict[str, float]:
    ratios = sorted(ratios)
    return {
        "below_truth_pct": round(100 * sum(r < 1 for r in ratios) / len(ratios), 2),
        "over_1_25_pct": round(100 * sum(r > 1.25 for r in ratios) / len(ratios), 2),
        "median_ratio": round(statistics.median(ratios), 3),
        "p99_ratio": round(ratios[int(0.99 * (len(ratios) - 1))], 3),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    texts = corpus(args.seeds)
    out: dict[str, Any] = {"answers": args.answers, "cuts": args.cuts, "margin": args.margin}
    for wire in ("one-per-chunk", "grouped"):
        calibrated, fixed = [], []
        rounds = max(1, args.cuts // 200)
        for _ in range(rounds):
            seen = [cut(rng, texts, wire, 200, 600) for _ in range(args.answers)]
            calibration = Calibration.from_samples(seen, margin=args.margin)
            assert calibration is not None
            for _ in range(args.cuts // rounds):
                s = cut(rng, texts, wire, args.min_tokens, 600)
                got = calibration.estimate(
                    text_bytes=s.text_bytes, chunks=s.chunks, pieces=s.pieces
                )
                calibrated.append(got / s.tokens)
                old = estimate(s.chunks, s.text_bytes, counted=s.chunks,
                               bytes_per_token=FIXED_BYTES_PER_TOKEN[wire])  # fmt: skip
                fixed.append(old / s.tokens)
        out[wire] = {"calibrated": shares(calibrated), "fixed": shares(fixed)}
    grouped = out["grouped"]["calibrated"]
    out["targets_met"] = {
        "below_truth_le_1_pct": all(
            out[w]["calibrated"]["below_truth_pct"] <= 1.0 for w in ("one-per-chunk", "grouped")
        ),
        "over_1_25_le_5_pct": all(
            out[w]["calibrated"]["over_1_25_pct"] <= 5.0 for w in ("one-per-chunk", "grouped")
        ),
        "one_per_chunk_within_2_pct": out["one-per-chunk"]["calibrated"]["median_ratio"] <= 1.02,
    }
    out["grouped_median_vs_fixed"] = round(
        grouped["median_ratio"] / out["grouped"]["fixed"]["median_ratio"], 3
    )
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--answers", type=int, default=16, help="exact answers calibrated on")
    parser.add_argument("--cuts", type=int, default=6000)
    parser.add_argument("--min-tokens", type=int, default=50, help="the shortest cut text")
    parser.add_argument("--seeds", type=int, default=6)
    parser.add_argument("--margin", type=float, default=1.25)
    parser.add_argument("--seed", type=int, default=11)
    print(json.dumps(run(parser.parse_args(argv)), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
