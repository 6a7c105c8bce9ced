"""The fenced job store: one :class:`Store` composing the pieces, each a small class over
the one script transport (:mod:`resumeq.store.transport`: request ids, re-sends, refusals
as exceptions).

- :mod:`~resumeq.store.jobs`: a job's lifecycle (create, cancel, fail, purge) and its reads;
- :mod:`~resumeq.store.leases`: acquire, renew, reap, one job or many;
- :mod:`~resumeq.store.attempts`: an attempt's writes under its lease (flush, finish,
  release) and the ledger records written apart from an exit;
- :mod:`~resumeq.store.follow_ups`: the outbox and the hook runs;
- :mod:`~resumeq.store.spill`: the spill lane (pages, requeue, drop);
- :mod:`~resumeq.store.indexes`: the state indexes, the totals, the provider series;
- :mod:`~resumeq.store.ended`: ended jobs (events trimmed, revisions marked durable);
- :mod:`~resumeq.store.responses`: background responses to stop at the provider.

Every method is one round trip (one script, or one read). The store offers each piece's
methods as its own (``store.flush(...)`` is ``store.attempts.flush(...)``), and
:meth:`Store.write_many` sends any of its writes together.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, Self, TypeVar, overload

import redis

from resumeq.core.defaults import STORE_DEFAULTS, LimitDefaults, StoreDefaults
from resumeq.core.errors import StoreError
from resumeq.store.attempts import Attempts
from resumeq.store.connection import connect
from resumeq.store.ended import EndedJobs
from resumeq.store.follow_ups import FollowUps
from resumeq.store.indexes import Indexes
from resumeq.store.jobs import Jobs
from resumeq.store.leases import Leases
from resumeq.store.responses import Responses
from resumeq.store.spill import Spill
from resumeq.store.transport import Planner, ScriptCall, Transport, planned, refused

if TYPE_CHECKING:
    from resumeq.core.settings import StoreSettings
    from resumeq.core.spec import Limits

P = ParamSpec("P")
R = TypeVar("R")


class _Via(Generic[P, R]):
    """A method of one of the store's pieces, offered as the store's own: ``store.NAME``
    is ``store.PIECE.NAME``, with its signature and docstring."""

    def __init__(self, piece: str, method: Callable[Concatenate[Any, P], R]) -> None:
        self.piece, self.name = piece, method.__name__
        self.__doc__ = method.__doc__

    def __set_name__(self, owner: type[Any], name: str) -> None:
        if name != self.name:
            raise TypeError(f"{owner.__name__}.{name} would offer {self.piece}.{self.name}")

    @overload
    def __get__(self, store: None, owner: type[Any]) -> Self: ...
    @overload
    def __get__(self, store: object, owner: type[Any]) -> Callable[P, R]: ...
    def __get__(self, store: object | None, owner: type[Any]) -> Self | Callable[P, R]:
        if store is None:
            return self
        method: Callable[P, R] = getattr(getattr(store, self.piece), self.name)
        return method


class Store:
    """Jobs in Redis, written only through fenced scripts."""

    def __init__(
        self,
        client: redis.Redis,
        *,
        settings: StoreSettings | StoreDefaults | None = None,
        limits: Limits | LimitDefaults | None = None,
    ) -> None:
        transport = Transport(client, settings or STORE_DEFAULTS)
        self._compose(transport, limits, Indexes(transport))

    def _compose(
        self, transport: Transport, limits: Limits | LimitDefaults | None, indexes: Indexes
    ) -> None:
        self.transport = transport
        self.redis = transport.redis
        self.settings: StoreSettings | StoreDefaults = transport.settings
        #: The limits specs are validated against (None: the defaults); a config file's
        #: digest gives them as plain values (:mod:`resumeq.core.config_digest`).
        self.limits = limits
        self.indexes = indexes
        self.jobs = Jobs(transport, limits)
        self.leases = Leases(transport)
        self.attempts = Attempts(transport, indexes)
        self.follow_ups = FollowUps(transport)
        self.spill = Spill(transport, self.jobs)
        self.ended = EndedJobs(transport)
        self.responses = Responses(transport)

    @property
    def replicated(self) -> bool:
        """Whether a write counts only once a replica acknowledged it (``[store]
        durability = "replica"``)."""
        return self.transport.replicated

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> Store:
        try:
            client = connect(url)
        except ValueError as exc:
            raise StoreError(f"invalid Redis URL: {exc}") from None
        return cls(client, **kwargs)

    # -- a job's lifecycle and its reads (resumeq.store.jobs) ----------------------------

    create = _Via("jobs", Jobs.create)
    cancel = _Via("jobs", Jobs.cancel)
    fail_unreadable = _Via("jobs", Jobs.fail_unreadable)
    purge = _Via("jobs", Jobs.purge)
    ping = _Via("jobs", Jobs.ping)
    get = _Via("jobs", Jobs.get)
    get_many = _Via("jobs", Jobs.get_many)
    records = _Via("jobs", Jobs.records)
    texts = _Via("jobs", Jobs.texts)
    text_size = _Via("jobs", Jobs.text_size)
    snapshot = _Via("jobs", Jobs.snapshot)
    text = _Via("jobs", Jobs.text)
    text_bytes = _Via("jobs", Jobs.text_bytes)
    attempt_texts = _Via("jobs", Jobs.attempt_texts)
    ledger = _Via("jobs", Jobs.ledger)

    # -- leases (resumeq.store.leases) ---------------------------------------------------

    acquire = _Via("leases", Leases.acquire)
    renew = _Via("leases", Leases.renew)
    renew_many = _Via("leases", Leases.renew_many)
    reap = _Via("leases", Leases.reap)
    reap_many = _Via("leases", Leases.reap_many)
    expired_leases = _Via("leases", Leases.expired_leases)
    leases_held_by = _Via("leases", Leases.leases_held_by)

    # -- an attempt's writes (resumeq.store.attempts) ------------------------------------

    flush = _Via("attempts", Attempts.flush)
    note_response = _Via("attempts", Attempts.note_response)
    forget_response = _Via("attempts", Attempts.forget_response)
    finish = _Via("attempts", Attempts.finish)
    release = _Via("attempts", Attempts.release)
    append_ledger = _Via("attempts", Attempts.append_ledger)
    amend_ledger = _Via("attempts", Attempts.amend_ledger)

    # -- the outbox and the hook runs (resumeq.store.follow_ups) --------------------------

    outbox = _Via("follow_ups", FollowUps.outbox)
    outboxes = _Via("follow_ups", FollowUps.outboxes)
    outbox_done = _Via("follow_ups", FollowUps.outbox_done)
    outbox_prune = _Via("follow_ups", FollowUps.outbox_prune)
    outbox_replace = _Via("follow_ups", FollowUps.outbox_replace)
    outbox_pending = _Via("follow_ups", FollowUps.outbox_pending)
    claim_hook = _Via("follow_ups", FollowUps.claim_hook)
    renew_hook = _Via("follow_ups", FollowUps.renew_hook)
    hook_done = _Via("follow_ups", FollowUps.hook_done)
    hook_ran = _Via("follow_ups", FollowUps.hook_ran)
    hook_running = _Via("follow_ups", FollowUps.hook_running)

    # -- the spill lane (resumeq.store.spill) --------------------------------------------

    requeue = _Via("spill", Spill.requeue)
    drop = _Via("spill", Spill.drop)
    spilled = _Via("spill", Spill.spilled)
    spilled_after = _Via("spill", Spill.spilled_after)

    # -- indexes and totals (resumeq.store.indexes) --------------------------------------

    live_counts = _Via("indexes", Indexes.live_counts)
    in_state = _Via("indexes", Indexes.in_state)
    queued_before = _Via("indexes", Indexes.queued_before)
    totals = _Via("indexes", Indexes.totals)
    providers = _Via("indexes", Indexes.providers)
    forget_provider = _Via("indexes", Indexes.forget_provider)

    # -- ended jobs (resumeq.store.ended) ------------------------------------------------

    ended_before = _Via("ended", EndedJobs.ended_before)
    trim_events = _Via("ended", EndedJobs.trim_events)
    mark_ended = _Via("ended", EndedJobs.mark_ended)
    forget_expired = _Via("ended", EndedJobs.forget_expired)

    # -- background responses to stop at the provider (resumeq.store.responses) -----------

    responses_to_stop = _Via("responses", Responses.responses_to_stop)
    stop_responses = _Via("responses", Responses.stop_responses)
    responses_stopped = _Via("responses", Responses.responses_stopped)

    # -- many writes at once (see resumeq.store.transport) --------------------------------

    def write_many(
        self,
        writes: Sequence[Callable[[Store], object]],
        *,
        idempotency: Mapping[str, str | None] | None = None,
    ) -> list[int | Exception]:
        """Many fenced writes in one round trip, each given as a call of one of this
        store's write methods whose script answers ``{'ok', n, ...}`` on success (release,
        finish, flush, outbox_done, …), e.g. ``lambda s: s.release(lease, to=…)``.
        Answers, for each, ``n`` (the new revision, the entries left) or the error.

        ``idempotency`` (job id → its idempotency key, from a record just read) spares
        the read that finish and release to ``abandoned`` make for it."""
        planner = self._planner(idempotency or {})
        calls = [planned(functools.partial(write, planner)) for write in writes]
        sent = [c for c in calls if isinstance(c, ScriptCall)]
        answers = iter(self.transport.run_many(sent, "write_many"))
        out: list[int | Exception] = []
        for call in calls:
            if not isinstance(call, ScriptCall):
                out.append(call)
                continue
            reply = next(answers)
            if isinstance(reply, Exception):
                out.append(reply)
                continue
            try:
                status, *rest = reply
                if status != "ok":
                    refused(status, rest, call.job_id, call.name)
                out.append(int(rest[0]))
            except (StoreError, ValueError) as exc:
                out.append(exc)
        return out

    def _planner(self, idempotency: Mapping[str, str | None]) -> Store:
        """This store over a :class:`~resumeq.store.transport.Planner`: each write raises
        the script call it would make; reads, and the providers this process registered,
        are this store's."""
        planner = Store.__new__(Store)
        planner._compose(Planner(self.transport, idempotency), self.limits, self.indexes)
        return planner
