"""The naming rules: what a job id, an idempotency key and a worker's connection name may be.
The keys built from them are :mod:`resumeq.store.keys`."""

from __future__ import annotations

import re

#: What every Redis key and connection name of resumeq starts with.
PREFIX = "resumeq"

#: Job ids: the same alphabet RQ accepts for its own job ids, so that an attempt's RQ job
#: id can be derived from ours; no braces, colons or white space.
JOB_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

#: Idempotency keys are chosen by producers: a bounded, printable alphabet.
IDEMPOTENCY_KEY_RE = re.compile(r"^[A-Za-z0-9_.:@/+=-]{1,200}$")


def check_job_id(job_id: str) -> str:
    """Return ``job_id`` if it is a well-formed job id, else raise ``ValueError``."""
    if not JOB_ID_RE.fullmatch(job_id):
        raise ValueError(f"malformed job id {job_id!r}")
    return job_id


#: What a worker process calls each of its Redis connections (``CLIENT SETNAME``): the
#: janitor reads ``CLIENT LIST`` to see which lease holders still have one.
WORKER_CLIENT_PREFIX = f"{PREFIX}:worker:"


def worker_client_name(worker: str) -> str:
    """The connection name of worker ``worker`` (its name in lease tokens,
    ``HOST-PID-NONCE``)."""
    if not worker or not re.fullmatch(r"[!-~]+", worker):
        raise ValueError(f"a worker name is printable, with no space: {worker!r}")
    return f"{WORKER_CLIENT_PREFIX}{worker}"


def worker_of_client(name: str) -> str | None:
    """The worker a connection name names, or None (not a worker's connection)."""
    if name.startswith(WORKER_CLIENT_PREFIX):
        return name[len(WORKER_CLIENT_PREFIX) :] or None
    return None
