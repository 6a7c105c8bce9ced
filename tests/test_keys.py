"""Every per-job key carries the job id inside one hash tag."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from resumeq.store import keys


def test_job_keys_share_one_hash_tag() -> None:
    job_id = "0123abcd"
    tags = {re.search(r"\{([^}]*)\}", k).group(1) for k in keys.job_keys(job_id)}  # type: ignore[union-attr]
    assert tags == {job_id}
    assert len(set(keys.job_keys(job_id))) == 6
    assert all(k.startswith("resumeq:job:{0123abcd}") for k in keys.job_keys(job_id))


@pytest.mark.parametrize("bad", ["", "a}b", "a{b", "has space", "a:b", "x" * 65, "é"])
def test_malformed_job_ids_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="malformed job id"):
        keys.job(bad)


def test_idempotency_keys() -> None:
    assert keys.idempotency("order:17") == "resumeq:idem:order:17"
    with pytest.raises(ValueError):
        keys.idempotency("with space")


def test_no_other_module_spells_a_key() -> None:
    """Habit 1 of STYLE.md: nothing but keys.py writes a 'resumeq:' key string."""
    package = Path(keys.__file__).parent
    offenders = [
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if path.name != "keys.py" and re.search(r"resumeq:[A-Za-z{]", path.read_text())
    ]
    assert offenders == []
