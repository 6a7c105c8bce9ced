"""How often the ``instruction``-mode repeat rule deletes real text, and how often it catches
a model restating the end of its answer, on a corpus of texts that repeat themselves.

The corpus is the fake provider's genres (code with repeated lines, tables with repeated
rows, songs with a chorus, laughter, periodic patterns, lists, odd Unicode, a mixed answer,
prose), several seeds each. Every text is cut at every token boundary (or a sample of them):

- **false deletions**: the continuation is the rest of the text exactly; whatever the rule
  drops is real text lost.
- **repeats caught**: the continuation first restates the end of the prefix as a model asked
  to continue sometimes does — its last 3 to 8 words, its last line, its last sentence —
  then goes on; caught means exactly the restatement was dropped.

Rules compared: the rule before (the longest start of the continuation that the prefix ends
with, at least 16 characters), and the rule now (``resumeq.core.splice.overlap``: at least 16,
starting and ending on word boundaries, a passage that occurs once and does not repeat
itself), with the minimum at 24 and 32 for reference. Pure computation: no servers.

    .venv/bin/python benchmarks/splice_corpus.py [--seeds 4] [--cuts 300]
"""

from __future__ import annotations

import argparse
import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from resumeq.core.splice import overlap
from resumeq.fake.conversation import conversation_of
from resumeq.fake.genres import genre_tokens
from resumeq.fake.markers import GENRES

Rule = Callable[[str, str], int]
WINDOW = 2_000


def before(prefix: str, continuation: str) -> int:
    """The rule resumeq had: the longest start of the continuation the prefix ends with."""
    tail = prefix[-WINDOW:]
    for k in range(min(len(tail), len(continuation)), 15, -1):
        if tail.endswith(continuation[:k]):
            return k
    return 0


def now(min_overlap: int) -> Rule:
    return lambda p, c: overlap(p, c, min_overlap=min_overlap, window=WINDOW)


RULES: dict[str, Rule] = {
    "before (>= 16, any match)": before,
    "now (>= 16, word boundaries, unique, aperiodic)": now(16),
    "now with >= 24": now(24),
    "now with >= 32": now(32),
}


def restatements(prefix: str) -> list[str]:
    """What a model restating the end of ``prefix`` writes first."""
    out = []
    words = re.findall(r"\s*\S+", prefix)
    for n in (3, 5, 8):
        if len(words) > n:
            out.append("".join(words[-n:]))
    line = prefix.rstrip("\n").rsplit("\n", 1)[-1]
    if line.strip():
        out.append(line if prefix.endswith(line) else line + prefix[len(prefix.rstrip("\n")) :])
    sentence = re.split(r"(?<=[.!?])\s", prefix.rstrip())[-1]
    if sentence.strip() and prefix.endswith(sentence):
        out.append(" " + sentence if not sentence.startswith((" ", "\n")) else sentence)
    return [r for r in out if prefix.endswith(r.lstrip(" ")) or prefix.endswith(r)]


@dataclass
class Tally:
    cuts: int = 0
    cuts_with_deletion: int = 0
    chars_deleted: int = 0
    repeats: int = 0
    caught: int = 0
    by_genre: dict[str, list[int]] = field(default_factory=dict)
    caught_by_genre: dict[str, list[int]] = field(default_factory=dict)

    def report(self) -> dict[str, float | int | dict[str, float]]:
        return {
            "cuts": self.cuts,
            "false_deletion_rate": round(self.cuts_with_deletion / max(1, self.cuts), 4),
            "chars_deleted_per_1000_cuts": round(1000 * self.chars_deleted / max(1, self.cuts), 1),
            "repeats": self.repeats,
            "repeats_caught_rate": round(self.caught / max(1, self.repeats), 4),
            "false_deletion_rate_by_genre": {
                g: round(d / max(1, n), 4) for g, (n, d) in sorted(self.by_genre.items())
            },
            "repeats_caught_rate_by_genre": {
                g: round(c / max(1, n), 4) for g, (n, c) in sorted(self.caught_by_genre.items())
            },
        }


def corpus(seeds: int) -> list[tuple[str, str, list[int]]]:
    """(genre, text, token boundaries) for each genre and seed."""
    out = []
    for genre in GENRES:
        for seed in range(seeds):
            prompt = f"corpus text {seed} [fake:{genre}]" if genre != "prose" else f"prose {seed}"
            conversation = conversation_of([{"role": "user", "content": prompt}])
            tokens = genre_tokens(genre, conversation.seed(), 1_200)
            offsets, at = [], 0
            for token in tokens:
                at += len(token)
                offsets.append(at)
            out.append((genre, "".join(tokens), offsets[:-1]))
    return out


def run(seeds: int, cuts: int) -> dict[str, object]:
    rnd = random.Random(1)
    tallies = {name: Tally() for name in RULES}
    for genre, text, boundaries in corpus(seeds):
        sample = boundaries if len(boundaries) <= cuts else rnd.sample(boundaries, cuts)
        for cut in sample:
            prefix, rest = text[:cut], text[cut:]
            repeats = restatements(prefix)
            for name, rule in RULES.items():
                t = tallies[name]
                t.cuts += 1
                dropped = rule(prefix, rest)
                t.cuts_with_deletion += bool(dropped)
                t.chars_deleted += dropped
                seen = t.by_genre.setdefault(genre, [0, 0])
                seen[0] += 1
                seen[1] += bool(dropped)
                caught = t.caught_by_genre.setdefault(genre, [0, 0])
                for repeat in repeats:
                    hit = rule(prefix, repeat + rest) == len(repeat)
                    t.repeats += 1
                    t.caught += hit
                    caught[0] += 1
                    caught[1] += hit
    return {"rules": {name: t.report() for name, t in tallies.items()}, "seeds": seeds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--cuts", type=int, default=300, help="cut points sampled per text")
    args = parser.parse_args()
    print(json.dumps(run(args.seeds, args.cuts), indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
