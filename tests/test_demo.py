"""``resumeq demo --json`` runs in the suite, as a real process, and its numbers agree."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.timeout(120)
def test_demo_json_is_consistent() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "resumeq", "demo", "--json"],
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    s = json.loads(out.stdout)
    for key in (
        "jobs", "done", "abandoned", "spilled", "output_tokens_billed", "output_tokens_needed",
        "naive_output_tokens_billed", "input_tokens_billed", "naive_input_tokens_billed",
    ):  # fmt: skip
        assert key in s, key
    assert s["jobs"] == len(s["per_job"]) == 8
    assert s["done"] + s["spilled"] + s["abandoned"] + s["failed"] == s["jobs"]
    plan = [(job["name"], job["state"], job["kinds"]) for job in s["per_job"]]
    # The plan: one job falls under its floor; the kill cuts the one stream it is meant to.
    assert s["spilled"] == 1 and s["done"] == 7, plan
    by_name = {name: (state, kinds) for name, state, kinds in plan}
    assert by_name["spills"] == ("spilled", ["fresh"]), plan
    assert by_name["clean"] == ("done", ["fresh"]), plan
    assert by_name["killed-worker"] == ("done", ["fresh", "resume"]), plan
    assert s["output_tokens_billed"] >= s["output_tokens_needed"] > 0
    assert s["naive_output_tokens_billed"] >= s["output_tokens_billed"]
    for job in s["per_job"]:
        assert job["output_billed"] >= job["output_needed"], job
        assert job["naive_output_billed"] >= job["output_billed"], job
        if job["name"] != "clean" and job["state"] == "done":
            assert job["attempts"] >= 2, job
    assert "⟦resume #2⟧" in s["splice_example"]
    assert s["seconds"] < 20
