"""A heartbeat's container report -> workload transitions: the container rule
(`scheduler.container.container_next`, pure) applied, and the gang rule for the parts of
multi-host jobs (`agents.gangs`).

Workload states change only through `scheduler.services` (`workload_transition`,
`workloads_transition`, `workload_requeue_or_end`, `workload_stopped`); GPU booking counters
are the scheduler's and never written here. Two appliers of the one rule: the common moves of
a heartbeat (containers seen running, jobs that exited 0) go in bulk, one UPDATE per group;
every other step is its own guarded update and transaction. tests/agents/test_heartbeat_bulk.py
checks that both store the same.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from contextlib import nullcontext
from datetime import datetime
from typing import Final

from django.conf import settings
from django.db import connection, transaction

from agents.gangs import gang_report
from agents.models import Host
from agents.protocol import ObservedContainer
from agents.selectors import Hold
from gpucloud.lib.db import pg_array, pg_cursor
from scheduler.bulk import state_with_events_is_one_statement
from scheduler.choices import HOLDING, TERMINAL, State, WorkloadKind
from scheduler.container import END, EVENT, MOVE, NOTE, STOP, Report, Seen, Step, container_next, needs_history
from scheduler.hooks import cycle_wanted
from scheduler.lifecycle import can_transition
from scheduler.models import Workload
from scheduler.notice import notice_served
from scheduler.services import (
    container_event_record,
    container_history,
    workload_note,
    workload_requeue_or_end,
    workload_stopped,
    workload_transition,
    workloads_transition,
)

# What goes in bulk: the common moves (a container seen running, a job that exited 0). The
# rest goes one by one: a created container (seen for a moment, seldom) and the ends (a
# failure may requeue, a stop ends as the scheduler decides).
_BULK_TO: Final = frozenset({State.RUNNING, State.SUCCEEDED})
_PART_STATES: Final = (State.SCHEDULED, State.STARTING, State.RUNNING, State.STOPPING)


def containers_observe(*, host: Host, containers: list[ObservedContainer], attempts: Mapping[str, Hold],
                       now: datetime, bulk: bool = True) -> list[tuple[str, str]]:
    """Move the work of `host` as its report of `containers` says; returns the transitions
    made, as (workload id, new state).

    `attempts`: what the host runs, by container instance id (read before this heartbeat's
    exits free it, `agents.selectors.host_holds`); a report of anything else is an earlier
    attempt, or work that is no longer here: the agent stops it. `bulk`: the common moves in
    bulk (the default; False: one by one, as before). The bulk moves read the holds' own
    fields; a step one by one gets the workload's model.
    """
    mover = _Mover(host, now)
    reported = set()
    groups: dict[tuple[str, str, str, int | None], list[Hold]] = defaultdict(list)
    for o in containers:
        reported.add(o.instance_id)
        h = attempts.get(o.instance_id)
        if h is None:
            continue
        if h.nodes > 1:
            mover.part(h.workload, o.instance_id, o.state, o.exit_code, o.error or "")
            continue
        steps = _container_steps(h, o.state, exit_code=o.exit_code, error=o.error or "", report=o)
        if not (bulk and _bulk_moves(h, steps, groups)):
            mover.apply(h.workload, steps)
    if groups:
        _apply_bulk(host, groups, now, mover.transitions)
    # A container the report leaves out matters to stopping work alone (other work's
    # container is the agent's to start).
    for iid, h in attempts.items():
        if iid not in reported and h.state == State.STOPPING:
            if h.nodes > 1:
                mover.part(h.workload, iid, "gone")
            else:
                mover.apply(h.workload, _container_steps(h, "gone"))
    return mover.transitions


def _container_steps(w: Workload | Hold, state: Report, exit_code: int | None = None, error: str = "",
                     report: ObservedContainer | None = None) -> list[Step]:
    seen = None
    if report is not None:
        losses = restarts_seen = 0
        if needs_history(w.state, state, error=error, restarts=report.restarts):
            # (rare: a lost or restarted container) the run's recorded events, one query
            losses, restarts_seen = container_history(workload=w.workload if isinstance(w, Hold) else w)
        seen = Seen(start_attempts=report.start_attempts, max_attempts=settings.WORKLOAD_START_ATTEMPTS,
                    restarts=report.restarts, note=report.note or "", losses=losses,
                    restarts_seen=restarts_seen, max_losses=settings.WORKLOAD_CONTAINER_LOSSES)
    return container_next(w.state, state, job=w.kind == WorkloadKind.JOB, on_notice=w.stop_by is not None,
                          exit_code=exit_code, error=error, seen=seen)


class _Mover:
    """Applies the steps of one heartbeat one by one; each is a guarded update in its own
    transaction. Collects the transitions made."""

    def __init__(self, host: Host, now: datetime) -> None:
        self.host, self.now = host, now
        self.transitions: list[tuple[str, str]] = []

    def apply(self, w: Workload, steps: list[Step]) -> None:
        for step in steps:
            if step.how == END:
                self.end(w, step)
            elif step.how == STOP:
                self.stopped(w, step)
            elif step.how == NOTE:
                workload_note(workload=w, reason=step.reason)
            elif step.how == EVENT:
                if w.state == step.to:  # (still as the report found it)
                    container_event_record(workload=w, kind=step.event, count=step.count, detail=step.reason,
                                           now=self.now)
            else:
                self.to(w, step)

    def to(self, w: Workload, step: Step) -> None:
        if not can_transition(w.state, step.to):
            return
        # Not a state: the exit code is a fact reported alongside it.
        facts = {} if step.exit_code is None else {"exit_code": step.exit_code}
        if workload_transition(workload=w, to=step.to, reason=step.reason, now=self.now, **facts):
            self.transitions.append((str(w.pk), step.to))

    def end(self, w: Workload, step: Step) -> None:
        """FAILED or PREEMPTED, requeued when a job may (scheduler.services decides: a failure
        spends a retry, a preemption does not)."""
        if not can_transition(w.state, step.to):
            return
        reason = notice_served(w.stop_cause) if step.to == State.PREEMPTED else step.reason
        old = w.state
        with transaction.atomic():
            if step.exit_code is not None:
                Workload.objects.filter(pk=w.pk, state=old).update(exit_code=step.exit_code)
            workload_requeue_or_end(workload=w, ended=step.to, reason=reason)
        if w.state != old:
            self.transitions.append((str(w.pk), step.to))

    def stopped(self, w: Workload, step: Step) -> None:
        """A STOPPING workload's container is gone; scheduler.services says what it ends as."""
        facts = {} if step.exit_code is None else {"exit_code": step.exit_code}
        if workload_stopped(workload=w, reason=step.reason, now=self.now, **facts):
            self.transitions.append((str(w.pk), w.state))

    def part(self, w: Workload, iid: str, state: str, exit_code: int | None = None, error: str = "") -> None:
        """A report about one part of a multi-host job: the gang rule decides (agents.gangs)."""
        if w.state in _PART_STATES:
            self.transitions += gang_report(host=self.host, workload=w, attempt=iid, state=state,
                                            exit_code=exit_code, error=error, now=self.now)


def _bulk_moves(w: Hold, steps: list[Step], groups: dict) -> bool:
    """Put `w`'s steps in `groups` when they are all common moves (`_BULK_TO`), to apply many
    at once (`_apply_bulk`); False for the rest, which `_Mover` applies one by one."""
    if not steps or any(s.how != MOVE or s.to not in _BULK_TO for s in steps):
        return False
    old = w.state
    for s in steps:
        groups[(old, s.to, s.reason, s.exit_code)].append(w)
        old = s.to
    return True


def _apply_bulk(host: Host, groups: dict, now: datetime, transitions: list[tuple[str, str]]) -> None:
    """The grouped moves: per group one guarded UPDATE, one INSERT of events, one release of
    allocations (scheduler.services.workloads_transition), RUNNING before the ends."""
    order = sorted(groups, key=lambda k: k[1] != State.RUNNING)
    freed = False
    for key in order:
        old, to, reason, exit_code = key
        # Not a state: the exit code is a fact reported alongside it.
        facts = None if exit_code is None else {"exit_code": exit_code}
        # On PostgreSQL each group is one statement: the workloads' UPDATE, their events' INSERT
        # and, for a move that frees the GPUs, their release (this host's work, `hosts`); a
        # transaction of its own without the BEGIN and COMMIT round trips (and the fast path's
        # hosts bumped once, after it).
        alone = state_with_events_is_one_statement(len(groups[key]))
        with nullcontext() if alone else transaction.atomic():
            moved = set(workloads_transition(ids=[w.pk for w in groups[key]], old=old, to=to, reason=reason,
                                             now=now, facts=facts, hosts=[host.pk]))
            freed = freed or (bool(moved) and to not in HOLDING)
        for w in groups[key]:
            if w.pk in moved:
                w.state = to
                transitions.append((str(w.pk), to))
    if freed:
        cycle_wanted(host.region_id)  # GPUs are free


def _parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        t = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo is not None else None


def containers_observed_times(*, containers: list[ObservedContainer], attempts: Mapping[str, Hold],
                              transitions: list[tuple[str, str]], now: datetime) -> None:
    """Run time as the agent saw it: a workload that started or ended in this heartbeat gets
    the container's own start and finish (a job that ran 20 s shows 20 s, not the span
    between two heartbeats). Trusted only between its queueing (or start) and now: a host
    clock off by more keeps the control plane's times. `transitions`: this heartbeat's, as
    (workload id, new state)."""
    terminal = {str(s) for s in TERMINAL}
    moved: dict[str, set[str]] = defaultdict(set)
    for wid, state in transitions:
        moved[wid].add(str(state))
    seen: dict[object, ObservedContainer] = {}
    for o in containers:
        w = attempts.get(o.instance_id)
        # (a report without times has nothing to set: no read for it)
        if w is not None and w.nodes == 1 and str(w.pk) in moved and (o.started_at or o.finished_at):
            seen[w.pk] = o
    if not seen:
        return
    rows = _times_of(list(seen))
    updates: dict[tuple[str, ...], list[tuple[object, ...]]] = defaultdict(list)
    for row in rows:
        o, states = seen[row["pk"]], moved[str(row["pk"])]
        fields: dict[str, datetime] = {}
        started, finished = _parse_time(o.started_at), _parse_time(o.finished_at)
        floor = row["queued_at"]
        if (str(State.RUNNING) in states and row["started_at"] is not None and started is not None
                and (floor is None or started >= floor) and started <= now):
            fields["started_at"] = started
        begun = fields.get("started_at", row["started_at"])
        if (str(row["state"]) in terminal and states & terminal and row["ended_at"] is not None
                and finished is not None and begun is not None and begun <= finished <= now):
            fields["ended_at"] = finished
        if fields:
            cols = tuple(sorted(fields))
            updates[cols].append((row["pk"], row["state"], *(fields[c] for c in cols)))
    for cols, values in updates.items():
        _set_times(cols, values)


def _times_of(ids: list) -> list[dict]:
    """pk, state, queued_at, started_at and ended_at of workloads `ids`; in written SQL on
    PostgreSQL, where every heartbeat that moves work reads them (the ORM's query cost more
    to build than to run)."""
    fields = ("pk", "state", "queued_at", "started_at", "ended_at")
    if connection.vendor != "postgresql":
        return list(Workload.objects.filter(pk__in=ids).values(*fields))
    with pg_cursor() as cur:
        cur.execute(f"SELECT id, state, queued_at, started_at, ended_at FROM {Workload._meta.db_table} "
                    "WHERE id = ANY(%s::uuid[])", [pg_array(ids)])
        return [dict(zip(fields, row, strict=True)) for row in cur.fetchall()]


def _set_times(cols: tuple[str, ...], values: list[tuple[object, ...]]) -> None:
    """`cols` of each (workload id, state it was read in, *values), guarded on that state."""
    if connection.vendor != "postgresql":
        for pk, state, *times in values:
            Workload.objects.filter(pk=pk, state=state).update(**dict(zip(cols, times, strict=True)))
        return
    sets = ", ".join(f"{c} = v.{c}" for c in cols)
    arrays = ", ".join("%s::timestamptz[]" for _ in cols)
    with pg_cursor() as cur:
        cur.execute(
            f"UPDATE {Workload._meta.db_table} AS w SET {sets} "
            f"FROM unnest(%s::uuid[], %s::text[], {arrays}) AS v(id, state, {', '.join(cols)}) "
            "WHERE w.id = v.id AND w.state = v.state",
            [[v[0] for v in values], [str(v[1]) for v in values],
             *([v[2 + i] for v in values] for i in range(len(cols)))],
        )
