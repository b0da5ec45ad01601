"""Heartbeat reports about one part of a multi-host job, applied by the gang rule.

A single-host workload follows its one container (scheduler.container). A gang
(`nodes > 1`) follows all its parts: each report is recorded as the part's state
(`GangPart`), then `scheduler.gang.gang_next` decides from every part of the current
attempt, under the workload's row lock, so two hosts reporting at the same moment are
judged one after the other and the second sees the first's part.
"""
from __future__ import annotations

from datetime import datetime

from django.db import transaction

from agents.models import Host
from agents.selectors import gang_parts
from scheduler import gang
from scheduler.choices import State
from scheduler.cycle import notice_served
from scheduler.models import GangPart, Workload
from scheduler.services import workload_requeue_or_end, workload_stopped, workload_transition


@transaction.atomic
def gang_report(*, host: Host, workload: Workload, attempt: str, state: str, exit_code: int | None = None,
                error: str = "", now: datetime) -> list[tuple[str, str]]:
    """Record what `host` reports of its part `attempt` of `workload`; move the gang as its
    parts say. Returns the transitions made, as (workload id, new state)."""
    w = Workload.objects.select_for_update().get(pk=workload.pk)
    parts = gang_parts(workload_ids=[w.pk]).get(w.pk, {})
    if parts.get(attempt, (None,))[0] != host.pk:
        return []  # an earlier attempt, or another host's part: not this host's to report
    values = {"state": state, "exit_code": exit_code, "error": error[:500]}
    row = GangPart.objects.filter(attempt_id=attempt).first()
    if row is None:
        GangPart.objects.create(workload=w, attempt_id=attempt, host=host, updated_at=now, **values)
    elif (row.state, row.exit_code, row.error) != tuple(values.values()):
        GangPart.objects.filter(pk=row.pk).update(updated_at=now, **values)
    reported = {p.attempt_id: p for p in GangPart.objects.filter(attempt_id__in=list(parts))}
    view = []
    for iid, (_host, rank) in parts.items():
        p = reported.get(iid)
        view.append(gang.Part(rank) if p is None else gang.Part(rank, p.state, p.exit_code, p.error))
    moved: list[tuple[str, str]] = []
    for move in gang.gang_next(w.state, view):
        old = w.state
        extra = {} if move.exit_code is None else {"exit_code": move.exit_code}
        if move.to == State.FAILED:
            if extra:
                Workload.objects.filter(pk=w.pk, state=old).update(**extra)
            if w.stop_by is not None:
                # a part ended under a preemption notice (stopped after its checkpoint grace):
                # the gang is preempted and requeued, as when the notice runs out
                workload_requeue_or_end(workload=w, ended=State.PREEMPTED, reason=notice_served(w.reason))
            else:
                workload_requeue_or_end(workload=w, ended=State.FAILED, reason=move.reason)
            ok = w.state != old
        elif move.to == State.STOPPED:
            ok = workload_stopped(workload=w, reason=move.reason, now=now, **extra)
        else:
            ok = workload_transition(workload=w, to=move.to, reason=move.reason, now=now, **extra)
        if not ok:
            break
        moved.append((str(w.pk), State.FAILED if move.to == State.FAILED else w.state))
    # keep the caller's object in step (it may look at the state again)
    workload.state, workload.reason = w.state, w.reason
    return moved
