"""Container logs: a tenant asks for a workload's log tail, the host's agent sends it with its
next heartbeat (and sends the last output of a container that exited unasked).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from django.db import connection
from django.utils import timezone

from agents import fastpath
from agents.models import ContainerLog, Host
from agents.protocol import ContainerLogTail
from agents.selectors import workload_attempt
from gpucloud.lib.db import pg_array
from scheduler.choices import HOLDING
from scheduler.models import Workload


@dataclass(frozen=True)
class LogTail:
    text: str
    captured_at: datetime | None
    pending: bool  # a fresh tail was asked for and arrives with the agent's next heartbeat


def workload_logs_request(
    *, workload: Workload, tail: int, now: datetime | None = None
) -> LogTail:
    """Ask the agent running `workload` for the last `tail` lines of its container's log.

    Returns the latest stored tail (maybe none yet). Only work holding GPUs has a
    container to ask about; for other work the stored tail is all there is.
    """
    now = now or timezone.now()
    log, _ = ContainerLog.objects.get_or_create(workload=workload)
    where = workload_attempt(workload=workload) if workload.state in HOLDING else None
    # `pending` while nothing answered yet: no text at all, or the last request still unanswered.
    # Once a tail arrived (the agent clears the request it answers) the text is current, though
    # every call asks again for a fresher one.
    waiting = where is not None and (log.captured_at is None or log.requested_at is not None)
    if where is not None:
        host_id, attempt = where
        ContainerLog.objects.filter(pk=log.pk).update(
            host_id=host_id, attempt_id=attempt, requested_tail=tail, requested_at=now
        )
        fastpath.hosts_changed(host_ids=[host_id])  # the request rides on the next answer
        log.refresh_from_db()
    return LogTail(text=log.text, captured_at=log.captured_at, pending=waiting)


def container_logs_store(*, host: Host, tails: list[ContainerLogTail], now: datetime,
                         attempts: dict[str, Workload]) -> None:
    """Log tails from `host`: answers to log requests, and the last output of containers
    that exited, which the agent sends unasked with the exit (`attempts`: the work this
    host runs, by container instance id; a tail of anything else is not stored).

    The rule, tail by tail in the order sent: a tail clears the request of the rows that
    hold its container on this host; one with text also replaces their text (captured
    `now`), or, where no row holds its container, becomes the log of the container's
    workload (whichever container that row held before). An empty one (the container was
    removed meanwhile) keeps the tail stored before. On PostgreSQL in at most two
    statements (`_container_logs_store_pg`), with the same outcome.
    """
    if not tails:
        return
    if connection.vendor == "postgresql":
        _container_logs_store_pg(host=host, tails=tails, now=now, attempts=attempts)
    else:
        _container_logs_store_orm(host=host, tails=tails, now=now, attempts=attempts)


def _container_logs_store_orm(*, host: Host, tails: list[ContainerLogTail], now: datetime,
                              attempts: dict[str, Workload]) -> None:
    """The rule as written, one tail after the other (up to three statements each)."""
    for t in tails:
        rows = ContainerLog.objects.filter(host=host, attempt_id=t.instance_id)
        if not t.text:
            rows.update(requested_at=None)
        elif not rows.update(text=t.text, captured_at=now, requested_at=None):
            w = attempts.get(t.instance_id)
            if w is not None:
                ContainerLog.objects.update_or_create(workload=w, defaults={
                    "host": host, "attempt_id": t.instance_id, "text": t.text, "captured_at": now,
                    "requested_at": None})


def _container_logs_store_pg(*, host: Host, tails: list[ContainerLogTail], now: datetime,
                             attempts: dict[str, Workload]) -> None:
    """`container_logs_store` in one UPDATE … RETURNING and at most one INSERT … ON CONFLICT.

    A heartbeat that ends six jobs carries six tails; one `update_or_create` each cost more
    of the web's CPU than the rest of the heartbeat. The UPDATE gives every row holding a
    tail's container on this host that container's last text (an empty tail only clears the
    request); what it returns, which rows held which container, is all the rule reads, so
    the tails are then replayed here in order and the rows whose outcome differs from the
    UPDATE's (a workload's log taking a new container, a row moved off a container before
    that container's own tail came) are written by one upsert.
    """
    table = ContainerLog._meta.db_table
    last: dict[str, str | None] = {}  # container -> its last text; None: only empty tails
    for t in tails:
        if t.text:
            last[t.instance_id] = t.text
        else:
            last.setdefault(t.instance_id, None)
    with connection.cursor() as cur:
        cur.execute(
            f"UPDATE {table} AS l SET text = COALESCE(v.text, l.text), "
            "captured_at = CASE WHEN v.text IS NULL THEN l.captured_at ELSE %s END, requested_at = NULL "
            "FROM unnest(%s::text[], %s::text[]) AS v(attempt_id, text) "
            "WHERE l.host_id = %s AND l.attempt_id = v.attempt_id RETURNING l.workload_id, l.attempt_id",
            [now, pg_array(last), pg_array(last.values()), host.pk],
        )
        held = cur.fetchall()
        writes = _log_takeovers(tails=tails, attempts=attempts, held=held, last=last)
        if not writes:
            return
        ids = list(writes)
        cur.execute(
            f"INSERT INTO {table} (workload_id, host_id, attempt_id, requested_tail, requested_at, text, captured_at) "
            "SELECT v.w, %s, v.a, 0, NULL, v.t, %s FROM unnest(%s::uuid[], %s::text[], %s::text[]) AS v(w, a, t) "
            "ON CONFLICT (workload_id) DO UPDATE SET host_id = EXCLUDED.host_id, attempt_id = EXCLUDED.attempt_id, "
            "requested_at = NULL, text = EXCLUDED.text, captured_at = EXCLUDED.captured_at",
            [host.pk, now, pg_array(ids), pg_array(writes[w][0] for w in ids),
             pg_array(writes[w][1] for w in ids)],
        )


def _log_takeovers(*, tails: list[ContainerLogTail], attempts: dict[str, Workload],
                   held: list[tuple[UUID, str]], last: dict[str, str | None]) -> dict[UUID, tuple[str, str]]:
    """The rule replayed over `tails` from `held` (workload, container: the rows on this host
    holding a tail's container before): workload -> (container, text) for each row that
    must end otherwise than the UPDATE left it (each held row: its container's last text)."""
    rows: dict[str, set[UUID]] = defaultdict(set)  # container -> the workloads whose row holds it
    holds: dict[UUID, str] = {}  # workload -> the container its row holds, as the replay goes
    for w, a in held:
        rows[a].add(w)
        holds[w] = a
    final: dict[UUID, tuple[str, str]] = {}
    for t in tails:
        if not t.text:
            continue  # clears requests only, which the UPDATE did for every row it can reach
        if rows[t.instance_id]:
            for w in rows[t.instance_id]:
                final[w] = (t.instance_id, t.text)
            continue
        workload = attempts.get(t.instance_id)
        if workload is None:
            continue
        before = holds.get(workload.pk)
        if before is not None:  # the workload's row leaves the container it held on this host
            rows[before].discard(workload.pk)
        rows[t.instance_id].add(workload.pk)
        holds[workload.pk] = t.instance_id
        final[workload.pk] = (t.instance_id, t.text)
    updated = {w: (a, last[a]) for w, a in held}
    return {w: v for w, v in final.items() if updated.get(w) != v}
