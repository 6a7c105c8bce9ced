"""Bad input, fuzzed: every invalid spec is refused with an error naming a field, through
the Client and through the CLI; nothing is written; nothing crashes."""

from __future__ import annotations

from typing import Any

import redis
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from resumeq.cli import cli
from resumeq.core.errors import InvalidSpec
from resumeq.core.spec import JobSpec
from resumeq.producer.client import Client
from resumeq.testing import RedisServer

FIELDS = sorted(JobSpec.model_fields)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
VALID: dict[str, Any] = {"prompt": "hello", "provider": "local", "model": "m", "budget_tokens": 50}


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    changes=st.dictionaries(
        st.sampled_from([*FIELDS, "base_url", "api_key", "headers", "url"]), json_values, max_size=4
    ),
    drop=st.lists(st.sampled_from(sorted(VALID)), max_size=2),
)
def test_client_refuses_or_accepts_cleanly(
    redis_client: redis.Redis, changes: dict[str, Any], drop: list[str]
) -> None:
    redis_client.flushall()
    spec = {k: v for k, v in {**VALID, **changes}.items() if k not in drop}
    client = Client(redis_client)
    try:
        job_id = client.enqueue(spec)
    except InvalidSpec as exc:
        assert exc.errors and all(e.field and e.message for e in exc.errors)
        named = {e.field.split(".")[0] for e in exc.errors}
        assert named <= {*spec, *FIELDS, "spec"}, named
        assert list(redis_client.scan_iter("*")) == []
    else:
        assert client.get(job_id).state.value == "queued"


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    opts=st.fixed_dictionaries(
        {
            "--budget": st.text(max_size=12) | st.integers(-10, 10**9).map(str),
            "--provider": st.text(max_size=40),
            "--model": st.text(max_size=40),
            "--prompt": st.text(max_size=60),
        },
        optional={
            "--floor": st.text(max_size=6) | st.integers(-5, 10**6).map(str),
            "--on-cut": st.text(max_size=8) | st.sampled_from(["resume", "abandon", "spill"]),
            "--max-attempts": st.text(max_size=4) | st.integers(-3, 100).map(str),
            "--on-invalid": st.text(max_size=6) | st.sampled_from(["retry", "spill", "fail"]),
        },
    )
)
def test_cli_enqueue_refuses_cleanly_and_writes_nothing(
    redis_server: RedisServer, redis_client: redis.Redis, opts: dict[str, str]
) -> None:
    redis_client.flushall()
    args = ["--redis-url", redis_server.url, "enqueue", "--json"]
    for flag, value in opts.items():
        args += [flag, value]
    result = CliRunner().invoke(cli, args)
    if result.exit_code == 0:
        assert '"id"' in result.output
        return
    # Refused: a usage error (2) or resumeq's one-line error (1), never a crash.
    assert result.exit_code in (1, 2), (result.exit_code, result.output, result.exception)
    assert isinstance(result.exception, SystemExit)
    assert list(redis_client.scan_iter("*")) == []
