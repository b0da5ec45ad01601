"""Set-based writes for the scheduling cycle.

On PostgreSQL the hot writes of a cycle (thousands of allocations, events, wait
reasons, state changes) go as COPY and `UPDATE ... FROM unnest(...)`: one round
trip each instead of Django building an expression per row, which at 10,000
placements was most of a cycle's time. Elsewhere (the SQLite demo) the ORM does
the same work row by row.
"""
from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from django.db import connection

from gpucloud.lib.db import copy_text, pg_array, pg_cursor  # noqa: F401  (bulk.pg_cursor and friends)
from scheduler.models import Allocation, Workload, WorkloadEvent

_CHUNK = 5000


def _pg() -> bool:
    return connection.vendor == "postgresql"


def _copy(table: str, columns: Sequence[str], data: bytes) -> None:
    """COPY rows already written in the text format, in one write.

    Building the lines with one f-string per row costs a third of psycopg's `write_row`,
    which converts and escapes value by value in Python.
    """
    connection.ensure_connection()
    raw = connection.connection  # the psycopg connection, inside Django's transaction
    with raw.cursor() as cur, cur.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
        copy.write(data)


def insert_allocations(rows: list[tuple], *, now: datetime) -> None:
    """Active allocations from (gpu, host, workload, milli, vcpus, memory_mib) tuples."""
    if not _pg():
        Allocation.objects.bulk_create(
            [Allocation(gpu_id=g, host_id=h, workload_id=w, milli=m, vcpus=v, memory_mib=mem, created_at=now)
             for g, h, w, m, v, mem in rows], batch_size=2000)
        return
    at = now.isoformat()
    _copy(Allocation._meta.db_table,
          ["gpu_id", "host_id", "workload_id", "milli", "vcpus", "memory_mib", "active", "created_at"],
          # host and workload are UUIDs the snapshot read, the numbers ints: only GPU ids are free text
          "".join([f"{copy_text(g)}\t{h}\t{w}\t{m:d}\t{v:d}\t{mem:d}\tt\t{at}\n"
                   for g, h, w, m, v, mem in rows]).encode())


def insert_events(rows: list[tuple]) -> None:
    """Events from (workload_id, from_state, to_state, reason, actor, created_at) tuples."""
    if not _pg():
        WorkloadEvent.objects.bulk_create(
            [WorkloadEvent(workload_id=w, from_state=f, to_state=t, reason=r, actor=a, created_at=c)
             for w, f, t, r, a, c in rows], batch_size=2000)
        return
    _copy(WorkloadEvent._meta.db_table, ["workload_id", "from_state", "to_state", "reason", "actor", "created_at"],
          "".join([f"{w}\t{f}\t{t}\t{copy_text(r)}\t{copy_text(a)}\t{c.isoformat()}\n"
                   for w, f, t, r, a, c in rows]).encode())


def set_state(ids: list[UUID], *, old: str, values: dict[str, Any]) -> list[UUID]:
    """UPDATE the workloads still in `old`; returns those that moved."""
    moved: list[UUID] = []
    if not _pg():
        for i in range(0, len(ids), _CHUNK):
            chunk = ids[i:i + _CHUNK]
            got = list(Workload.objects.filter(pk__in=chunk, state=old).values_list("pk", flat=True))
            Workload.objects.filter(pk__in=got).update(**values)
            moved.extend(got)
        return moved
    table = Workload._meta.db_table
    sets = ", ".join(f"{col} = %s" for col in values)
    with pg_cursor() as cur:
        for i in range(0, len(ids), _CHUNK):
            cur.execute(
                f"UPDATE {table} SET {sets}, updated_at = now() WHERE id = ANY(%s::uuid[]) AND state = %s RETURNING id",
                [*values.values(), pg_array(ids[i:i + _CHUNK]), old],
            )
            moved.extend(r[0] for r in cur.fetchall())
    return moved


def state_with_events_is_one_statement(n: int) -> bool:
    """Is `set_state_with_events` of `n` ids one statement (a transaction of its own outside
    atomic())? On PostgreSQL, up to a chunk."""
    return _pg() and n <= _CHUNK


def set_state_with_events(ids: list[UUID], *, old: str, values: dict[str, Any], reason: str, actor: str,
                          now: datetime) -> list[UUID]:
    """`set_state`, then `insert_events` of one reason for those that moved, in one statement on
    PostgreSQL (the UPDATE's RETURNING feeds the INSERT): a heartbeat's transitions are a few
    workloads, where the second round trip cost as much as either write."""
    if not _pg() or len(ids) > _CHUNK:
        moved = set_state(ids, old=old, values=values)
        insert_events([(pk, old, values["state"], reason, actor, now) for pk in moved])
        return moved
    sql, params = moved_with_events_ctes(ids, old=old, values=values, reason=reason, actor=actor, now=now)
    with pg_cursor() as cur:
        cur.execute(f"WITH {sql} SELECT workload_id FROM ev", params)
        return [r[0] for r in cur.fetchall()]


def moved_with_events_ctes(ids: list[UUID], *, old: str, values: dict[str, Any], reason: str, actor: str,
                           now: datetime) -> tuple[str, list[Any]]:
    """`set_state_with_events` as two CTEs for a statement of PostgreSQL's to go on from:
    `moved` (the workloads' UPDATE) and `ev` (their events' INSERT, RETURNING workload_id: the
    ids that moved), with their parameters."""
    sets = ", ".join(f"{col} = %s" for col in values)
    return (
        f"moved AS (UPDATE {Workload._meta.db_table} SET {sets}, updated_at = now() "
        "WHERE id = ANY(%s::uuid[]) AND state = %s RETURNING id), "
        f"ev AS (INSERT INTO {WorkloadEvent._meta.db_table} "
        "(workload_id, from_state, to_state, reason, actor, created_at) "
        "SELECT id, %s, %s, %s, %s, %s FROM moved RETURNING workload_id)",
        [*values.values(), pg_array(ids), old, old, values["state"], reason, actor, now],
    )


def set_wait_reasons(changes: dict[str, tuple[str, int]]) -> None:
    """Reason and queue position of workloads that are still PENDING."""
    if not changes:
        return
    if not _pg():
        rows = [Workload(pk=pk, reason=r, queue_position=p) for pk, (r, p) in changes.items()]
        pending = Workload.objects.filter(pk__in=list(changes), state="pending")
        still = set(map(str, pending.values_list("pk", flat=True)))
        Workload.objects.bulk_update([w for w in rows if str(w.pk) in still], ["reason", "queue_position"],
                                     batch_size=2000)
        return
    # Rows another transaction holds are skipped, never waited for: a reason is advice, the
    # next cycle writes it, and waiting here could deadlock a cycle running without the lock.
    items = sorted(changes.items())
    table = Workload._meta.db_table
    with pg_cursor() as cur:
        for i in range(0, len(items), _CHUNK):
            chunk = items[i:i + _CHUNK]
            cur.execute(
                f"UPDATE {table} AS w SET reason = v.reason, queue_position = v.pos "
                "FROM unnest(%s::uuid[], %s::text[], %s::int[]) AS v(id, reason, pos) "
                f"WHERE w.id = v.id AND w.id IN (SELECT id FROM {table} WHERE id = ANY(%s::uuid[]) "
                "AND state = 'pending' ORDER BY id FOR UPDATE SKIP LOCKED)",
                [pg_array(pk for pk, _ in chunk), pg_array(r for _, (r, _p) in chunk),
                 pg_array(p for _, (_r, p) in chunk), pg_array(pk for pk, _ in chunk)],
            )
