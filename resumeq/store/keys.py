"""Every Redis key resumeq uses, built in one place.

A job's own keys share the hash tag ``{<job id>}``, so that in a sharded deployment they
would all live in one slot and a script touching them stays legal. The few global keys
(the leases and index zsets, the idempotency keys) are named constants or builders here;
nothing else in the package spells a key.
"""

from __future__ import annotations

import hashlib
import re

from resumeq.core.names import IDEMPOTENCY_KEY_RE, PREFIX, check_job_id

#: The RQ queue jobs go to unless told otherwise (RQ keys it ``rq:queue:resumeq``).
DEFAULT_QUEUE = "resumeq"
#: The spill lane: an RQ queue that normal workers do not serve.
SPILL_QUEUE = "resumeq-spill"

#: Job id → lease deadline (ms since the epoch, Redis server time): what the janitor scans.
LEASES = f"{PREFIX}:leases"
#: Job id → time it became queued: queued jobs, for the janitor's vanished-RQ-job sweep.
QUEUED = f"{PREFIX}:queued"
#: Job id → time it spilled: the spill lane's index.
SPILLED = f"{PREFIX}:spilled"
#: Job id → time its outbox got its oldest entry still pending: what the janitor completes.
OUTBOX = f"{PREFIX}:outbox"
#: Job id → time it entered the state: running (a worker holds it), stalled (a janitor
#: does), ended (terminal, its events stream not yet trimmed). With QUEUED and SPILLED,
#: every job that is not terminal is in exactly one of these indexes.
RUNNING = f"{PREFIX}:running"
STALLED = f"{PREFIX}:stalled"
ENDED = f"{PREFIX}:ended"
#: Job id → when it was created: every job, newest last, for listings (an entry whose job
#: expired is removed by whoever meets it: a listing, the janitor).
JOBS = f"{PREFIX}:jobs"
#: ``job_id response_id provider`` → when it was added: background responses that may still
#: be generating for nobody (their job ended, spilled, or went on without them), for the
#: janitor to cancel at the provider.
STOP_RESPONSES = f"{PREFIX}:responses:stop"
#: What operators did (who, when, what, which jobs): a capped stream (:mod:`resumeq.store.audit`).
AUDIT = f"{PREFIX}:audit"
#: A console session, by the SHA-256 of its cookie (:mod:`resumeq.server.console`).
CONSOLE_SESSION = f"{PREFIX}:console:session"
#: Running totals over every ledger record written (tokens, attempts, cuts) and jobs ended
#: by state: what ``stats`` and the metrics read, in O(1).
TOTALS = f"{PREFIX}:totals"
#: The histograms the workers add their observations to (:mod:`resumeq.store.metrics`).
METRICS = f"{PREFIX}:metrics"
#: RQ job id of a delayed attempt → the time it falls due (ms, Redis server time): the
#: due-time index (:mod:`resumeq.queue.due`); and the list that wakes a scheduler to look again.
DUE = f"{PREFIX}:due"
DUE_WAKE = f"{PREFIX}:due:wake"
#: What a janitor writes before it waits for a replica (``WAIT 1`` covers the writes of its
#: own connection, and every earlier write with them).
DURABILITY_PROBE = f"{PREFIX}:durability:probe"
#: A short-lived key a test deployment writes to see its replica acknowledge writes
#: (``resumeq.testing.sentinel``).
REPLICATION_PROBE = f"{PREFIX}:test:replication-probe"


def due_stop(token: str) -> str:
    """The list one scheduler also waits on, so that stopping it wakes exactly it."""
    return f"{DUE}:stop:{token}"


def _job_base(job_id: str) -> str:
    return f"{PREFIX}:job:{{{check_job_id(job_id)}}}"


def job(job_id: str) -> str:
    """The job hash: spec, prompt hash, state, budget, cursor, revision, attempt …"""
    return _job_base(job_id)


def text(job_id: str) -> str:
    """The durable prefix; every flush APPENDs its delta."""
    return f"{_job_base(job_id)}:text"


def lease(job_id: str) -> str:
    """The current owner's fencing token, with a PX TTL."""
    return f"{_job_base(job_id)}:lease"


def events(job_id: str) -> str:
    """A stream with one entry per revision: what followers read."""
    return f"{_job_base(job_id)}:events"


def ledger(job_id: str) -> str:
    """A list of attempt records (JSON)."""
    return f"{_job_base(job_id)}:ledger"


def outbox(job_id: str) -> str:
    """What must follow the job's last commit: the next attempt's enqueue, its hooks."""
    return f"{_job_base(job_id)}:outbox"


def hook_lease(job_id: str, hook: str) -> str:
    """The lease of a hook run in progress (a janitor runs it again once it expires)."""
    return f"{_job_base(job_id)}:hook:{hook}"


def job_keys(job_id: str) -> tuple[str, str, str, str, str, str]:
    """All per-job keys: job, text, lease, events, ledger, outbox."""
    return (
        job(job_id),
        text(job_id),
        lease(job_id),
        events(job_id),
        ledger(job_id),
        outbox(job_id),
    )


def idempotency(key: str) -> str:
    """Idempotency key → ``<job id>:<prompt hash>``; it expires with its job."""
    if not IDEMPOTENCY_KEY_RE.fullmatch(key):
        raise ValueError(f"malformed idempotency key {key!r}")
    return f"{PREFIX}:idem:{key}"


def totals_day(day: str) -> str:
    """The totals of the ledger records written on ``day`` (``YYYY-MM-DD``, UTC)."""
    return f"{TOTALS}:day:{day}"


#: Calibration samples' key → when it was last written: the pairs of provider profile and
#: model whose exact counts are kept (:mod:`resumeq.store.calibrations`; the least recent go).
CALIBRATIONS = f"{PREFIX}:calibration"


def calibration(provider: str, model: str) -> str:
    """The exact-count samples of one provider profile and model (a list)."""
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", provider):
        raise ValueError(f"malformed provider profile name {provider!r}")
    digest = hashlib.sha256(model.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{CALIBRATIONS}:{provider}:{digest}"


#: Provider profile → when its totals were first written: the profiles whose series the
#: metrics show (from what Redis holds, not from a process's config).
PROVIDERS = f"{TOTALS}:providers"


def totals_of(provider: str) -> str:
    """The running totals of one provider profile (names as profiles allow: no braces)."""
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", provider):
        raise ValueError(f"malformed provider profile name {provider!r}")
    return f"{TOTALS}:provider:{provider}"


#: A pattern matching every job hash (not its text, lease, events or ledger).
JOB_PATTERN = f"{PREFIX}:job:{{*}}"

#: A pattern matching every key resumeq owns (for scans in tools and tests).
ALL_PATTERN = f"{PREFIX}:*"


def presence(worker: str) -> str:
    """A live worker process's presence key, set again every tenth of a second with a
    short TTL (:mod:`resumeq.store.presence`): the janitor's second sign that it lives."""
    if not worker or not re.fullmatch(r"[!-~]+", worker):
        raise ValueError(f"a worker name is printable, with no space: {worker!r}")
    return f"{PREFIX}:alive:{worker}"


#: What a process calls the connection it asks Redis's capabilities on, at start
#: (:mod:`resumeq.store.capabilities`).
PROBE_CLIENT_NAME = f"{PREFIX}:probe"
