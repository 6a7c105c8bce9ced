"""The console's spill lane: the list (filtered, a page at a time), its export, a requeue or
drop of the ticked jobs or of all that match (confirmed first), and one job's edit and
requeue."""

from __future__ import annotations

import time
from typing import Any

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from resumeq.core import names
from resumeq.core.errors import InvalidTransition, JobNotFound, ResumeqError, StaleRevision
from resumeq.producer.ops import (
    SPILL_SCAN_MAX,
    SpillFilter,
    drop_spilled,
    idle_queues,
    requeue_spilled,
    spill_export_lines,
    spill_page,
)
from resumeq.server.console.forms import (
    PAGE,
    cursor,
    describe,
    field,
    int_field,
    job_id_of,
    next_query,
    spill_filter,
    spill_form,
)
from resumeq.server.console.plumbing import Plumbing, record_of
from resumeq.server.console.render import PageError, back, render
from resumeq.server.console.session import Session
from resumeq.store import SPILL_QUEUE, check_queue

#: The most jobs one "all that match" action touches (the confirmation says how many).
BULK_MAX = 500


class SpillPages:
    """``/console/spill``: the list, its export, its actions, one job's edit."""

    def __init__(self, plumbing: Plumbing) -> None:
        self.plumbing = plumbing
        self.svc = plumbing.svc

    async def spill(self, request: Request, who: Session) -> Response:
        svc = self.svc
        where = spill_filter(request.query_params)
        after = cursor(request.query_params.get("cursor"), "cursor")
        items, position = await svc.run(spill_page, svc.store, where, limit=PAGE, after=after)
        return render(
            request,
            "spill.html",
            who=who,
            items=items,
            f=spill_form(request.query_params),
            next=next_query(request.query_params, "cursor", position),
            providers=sorted(svc.settings.file.providers),
            queues=[q for q in svc.settings.file.worker.queues if q != SPILL_QUEUE],
            now_ms=time.time() * 1000,
            bulk_max=BULK_MAX,
            first=after is None,
        )

    async def spill_export(self, request: Request, who: Session) -> Response:
        if who.principal.role != "operator":
            raise PageError(403, f"The {who.principal.role} role may not export.")
        svc = self.svc
        where = spill_filter(request.query_params)
        await svc.run(self.plumbing.audit, who, "export", [], describe(where))
        return StreamingResponse(
            spill_export_lines(svc.store, where),
            media_type="application/x-ndjson",
            headers={"Content-Disposition": 'attachment; filename="spill.jsonl"'},
        )

    async def spill_edit_form(self, request: Request, who: Session) -> Response:
        svc = self.svc
        job_id = job_id_of(request)
        record = await svc.run(record_of, svc.store, job_id)
        if record.state.value != "spilled":
            raise PageError(409, f"Job {job_id} is {record.state.value}, not spilled.")
        return render(
            request,
            "spill_edit.html",
            who=who,
            job=record,
            providers=sorted(svc.settings.file.providers),
        )

    async def spill_action(self, request: Request, who: Session, form: FormData) -> Response:
        svc = self.svc
        action = field(form, "action")
        if action not in ("requeue", "drop"):
            raise PageError(400, f"Unknown action {str(action)[:40]!r}: requeue or drop.")
        to, provider = self.target(form)

        sent_to: list[str] = []

        def one(job_id: str) -> Any:
            if action == "drop":
                reason = f"dropped by {who.principal.name} in the console"
                return drop_spilled(svc.store, job_id, reason=reason)
            sent_to.append(requeue_spilled(svc.store, job_id, queue=to, provider=provider))

        detail = " ".join(f"{k}={v}" for k, v in (("to", to), ("provider", provider)) if v)
        if field(form, "select") == "all":
            # All that match: the confirmation names how many, and carries exactly those
            # ids; the confirmed action acts on them (not on a new, larger match).
            where = spill_filter(form, prefix="filter_")
            matched, complete = await svc.run(_matching, svc.store, where)
            return render(
                request,
                "spill_confirm.html",
                who=who,
                action=action,
                ids=matched[:BULK_MAX],
                count=min(len(matched), BULK_MAX),
                capped=len(matched) > BULK_MAX,
                complete=complete,
                to=to or "",
                provider=provider or "",
                describe=describe(where),
            )
        ids = _selected(form)
        done: list[str] = []
        skipped: dict[str, str] = {}
        try:
            for job_id in ids:
                try:
                    await svc.run(one, job_id)
                    done.append(job_id)
                except (ResumeqError, ValueError) as exc:  # changed meanwhile, or gone
                    skipped[job_id] = str(exc)
        finally:  # what was done is in the audit log, even if Redis went away part-way
            if done:
                await svc.run(self.plumbing.audit, who, action, done, detail)
        return back(
            "/console/spill",
            "requeued" if action == "requeue" else "dropped",
            n=len(done),
            skipped=len(skipped),
            idle=await svc.run(idle_queues, svc.store, sent_to),
        )

    def target(self, form: FormData) -> tuple[str | None, str | None]:
        """Where a requeue sends jobs: a queue (not the spill lane) and a known provider."""
        to = field(form, "to") or None
        provider = field(form, "provider") or None
        if to is not None:
            if to == SPILL_QUEUE:
                raise PageError(400, "Requeue to the spill lane itself? Choose another queue.")
            try:
                check_queue(to)
            except ValueError:
                raise PageError(400, f"{to[:80]!r} is not a valid queue name.") from None
        providers = self.svc.settings.file.providers
        if provider is not None and provider not in providers:
            known = ", ".join(sorted(providers))
            raise PageError(400, f"Unknown provider {provider[:80]!r} (known: {known}).")
        return to, provider

    async def spill_edit(self, request: Request, who: Session, form: FormData) -> Response:
        svc = self.svc
        job_id = job_id_of(request)
        to, provider = self.target(form)
        budget = int_field(form, "budget_tokens")
        floor = int_field(form, "floor_tokens")
        record = await svc.run(record_of, svc.store, job_id)
        if budget == record.budget_tokens:
            budget = None
        if floor == record.floor_tokens:
            floor = None
        if provider == record.spec.provider:
            provider = None
        try:
            queue = await svc.run(
                requeue_spilled,
                svc.store,
                job_id,
                queue=to,
                provider=provider,
                budget=budget,
                floor=floor,
            )
        except JobNotFound:
            raise PageError(404, f"No job {job_id}: it is gone.") from None
        except (ValueError, InvalidTransition, StaleRevision) as exc:
            raise PageError(400, f"Not requeued: {exc}. Nothing was changed.") from None
        changes = {"to": to, "provider": provider, "budget": budget, "floor": floor}
        detail = " ".join(f"{k}={v}" for k, v in changes.items() if v is not None)
        await svc.run(self.plumbing.audit, who, "edit+requeue", [job_id], detail)
        idle = await svc.run(idle_queues, svc.store, [queue])
        return back(f"/console/jobs/{job_id}", "edited", idle=idle)


#: The most spilled jobs "all that match" reads to find its matches.
MATCH_SCAN_MAX = 20_000


def _matching(store: Any, where: SpillFilter) -> tuple[list[str], bool]:
    """The ids of the spilled jobs that match, oldest spill first, up to one past
    :data:`BULK_MAX`; and whether the whole lane was read (else the count is "at least")."""
    ids: list[str] = []
    after: tuple[int, str] | None = None
    read = 0
    while len(ids) <= BULK_MAX:
        items, after = spill_page(store, where, limit=BULK_MAX + 1 - len(ids), after=after)
        ids += [item["id"] for item in items]
        read += SPILL_SCAN_MAX
        if after is None:
            return ids, True
        if read >= MATCH_SCAN_MAX:
            return ids, False
    return ids, True


def _selected(form: FormData) -> list[str]:
    """The ticked rows (or the confirmed matches), every id checked before any is acted on."""
    ids = [str(i) for i in form.getlist("ids")]
    if not ids:
        raise PageError(400, "No job selected: tick some rows, or choose all that match.")
    if len(ids) > BULK_MAX:
        raise PageError(400, f"At most {BULK_MAX} jobs at once. Nothing was changed.")
    for job_id in ids:
        try:
            names.check_job_id(job_id)
        except ValueError:
            raise PageError(400, f"{job_id[:80]!r} is not a job id. Nothing was changed.") from None
    return list(dict.fromkeys(ids))
