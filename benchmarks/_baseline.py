"""The baseline users have today: a plain RQ job that streams a generation with resumeq's own
provider client and, when the stream is cut, raises so that RQ's ``Retry`` runs the whole
request again (a replay). Nothing is checkpointed; the answer is the RQ job's result.

RQ imports this module in its work horses: the benchmarks start plain ``rq worker``
processes with this directory on ``PYTHONPATH`` (:func:`_harness.baseline_worker`).
"""

from __future__ import annotations

import time
from typing import Any

import httpx

from resumeq.core.continuation import plan_request
from resumeq.core.settings import load_settings
from resumeq.core.spec import JobSpec
from resumeq.providers import TextDelta, make_client

#: Loaded once where the worker preloads this module, as resumeq's worker does with its own:
#: both sides pay for the CA bundle once, not per attempt.
_SSL_CONTEXT = httpx.create_ssl_context()


def naive_attempt(spec: dict[str, Any]) -> dict[str, Any]:
    """One attempt of a naive job: the whole request, streamed to the end or raising.

    Like resumeq's work horse, each attempt reads the settings (``RESUMEQ_CONFIG``) and
    opens its own HTTP client: a connection pool is never shared across RQ's fork.
    """
    settings = load_settings()
    job = JobSpec.model_validate(spec)
    profile = settings.profile(job.provider)
    plan = plan_request(job, profile, prefix="", remaining_tokens=job.budget_tokens)
    pieces: list[str] = []
    tokens = 0
    with httpx.Client(verify=_SSL_CONTEXT) as http:
        client = make_client(profile, http)
        started = time.time()
        with client.open(plan) as stream:  # a cut raises StreamCut: RQ retries the job
            for event in stream:
                if isinstance(event, TextDelta):
                    pieces.append(event.text)
                    tokens += event.tokens
    return {
        "text": "".join(pieces),
        "tokens": tokens,
        "started": started,
        "ended": time.time(),
    }
