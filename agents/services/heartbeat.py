"""A host's heartbeat, the slow path: liveness, GPU samples, volume usage, log tails and
container states, applied in order. Most heartbeats say "nothing changed" and are answered by
the fast path instead (`agents.fastpath`, the same rules in Redis and one flush); any change
comes here.

Freshness: heartbeats carry a seq per agent start; one at most SEQ_REORDER_WINDOW (agents.protocol)
behind the newest applied is a late duplicate, and gives liveness only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from agents.choices import HostState
from agents.models import Gpu, Host
from agents.protocol import SEQ_REORDER_WINDOW, Heartbeat, LogsRequest
from agents.selectors import (
    Hold,
    holds_of,
    holds_sql,
    host_attempts,
    host_holds,
    logs_requested_sql,
    logs_requests_of,
)
from agents.services.containers import containers_observe, containers_observed_times
from agents.services.gpus import GpuHealth, async_commit, gpu_samples_apply, gpus_fail_work
from agents.services.logs import container_logs_store
from agents.services.registration import TokenRefused
from agents.signals import volumes_reported
from gpucloud.lib.db import model_columns, model_from_row
from scheduler.hooks import cycle_wanted

logger = logging.getLogger(__name__)

@dataclass
class HeartbeatOutcome:
    applied: bool  # False: a late, reordered heartbeat; only liveness was taken from it
    transitions: list[tuple[str, str]] = field(default_factory=list)  # (workload id, new state)
    # The host's work as read before this heartbeat moved any of it (None: not read): the
    # answer's, as it is when nothing moved, else as `selectors.host_holds_after` confirms it.
    holds: list[Hold] | None = None
    # The token hash on the host row as locked here (the fast path caches a token only
    # when it was still the host's after the cache version was read).
    token_hash: str = ""
    unknown_gpus: bool = False  # a sample named a GPU this host does not have
    host: Host | None = None  # the host row as this heartbeat wrote it
    # The log tails wanted from the host as read with its row (None: not read, or this
    # heartbeat's own tails answered some); the answer's while nobody else moved the host.
    logs_requests: list[LogsRequest] | None = None
    # The answer's shared reads (agents.signals) as `BeatRead`s seeded them with the host's
    # row (None: not read); the answer's as the log tails are.
    answer_reads: dict | None = None


@dataclass(frozen=True)
class BeatRead:
    """A read for the heartbeat answer of an app above the agents (volumes), made in the
    heartbeat's own host UPDATE instead of a query of its own while the answer is built.

    `sql(host)`: one SQL expression of the host's id column `host`, with `params`;
    `seed(shared, host_id, value)`: what its value says, put in the answer's shared reads
    (the dict `agents.signals.removals` and `move_orders` hand their receivers)."""

    sql: Callable[[str], str]
    params: tuple[Any, ...]
    seed: Callable[[dict, Any, Any], None]


_beat_reads: list[BeatRead] = []


def on_beat(read: BeatRead) -> None:
    """Make `read` with every heartbeat's host UPDATE (PostgreSQL, the fast path's heartbeats)."""
    if read not in _beat_reads:
        _beat_reads.append(read)


def seq_is_fresh(seq: int, last_seq: int) -> bool:
    """Apply heartbeat `seq` after `last_seq`? (pure)

    Newer: yes. A 1, or a seq far behind: the agent restarted and counts again from 1,
    yes. Slightly behind or equal: a late or repeated request, no.
    """
    return seq > last_seq or seq == 1 or seq < last_seq - SEQ_REORDER_WINDOW



def _host_for_update(pk: object) -> Host:
    """`Host.objects.select_for_update().get(pk=pk)`; in written SQL on PostgreSQL, where every
    heartbeat that changes something takes it and building the ORM's query cost more CPU than
    running it."""
    if connection.vendor != "postgresql":
        return Host.objects.select_for_update().get(pk=pk)
    with connection.cursor() as cur:
        cur.execute(f"SELECT {model_columns(Host, 'h')} FROM {Host._meta.db_table} h WHERE h.id = %s FOR UPDATE",
                    [pk])
        row = cur.fetchone()
    if row is None:
        raise Host.DoesNotExist
    return model_from_row(Host, row)[0]


def _host_save(host: Host, fields: list[str]) -> None:
    """`host.save(update_fields=fields)`, in written SQL on PostgreSQL (as `_host_for_update`)."""
    if connection.vendor != "postgresql":
        host.save(update_fields=fields)
        return
    cols = [Host._meta.get_field(f) for f in fields]
    with connection.cursor() as cur:
        cur.execute(f"UPDATE {Host._meta.db_table} SET {', '.join(f'{c.column} = %s' for c in cols)} WHERE id = %s",
                    [*(c.get_db_prep_save(getattr(host, c.attname), connection) for c in cols), host.pk])


def _host_beat(pk: object, *, now: datetime, agent_version: str, seq: int | None, holds: bool
               ) -> tuple[Host, bool, GpuHealth, list[LogsRequest], dict, list[Hold] | None]:
    """The host row's part of a heartbeat whose freshness is decided already (the fast path's
    seq claim), as one locking UPDATE on PostgreSQL instead of a read and a write: liveness
    time, agent version, a DOWN host back as its admin state, `seq` when given. Returns the
    host as written, whether it was DOWN, its GPUs' health, the log tails wanted from it and
    the answer's shared reads seeded by the `BeatRead`s and, with `holds`, the host's work
    (`selectors.host_holds`; else None), read in the same statement. The same rules as
    `host_heartbeat`'s own.
    Its transaction commits asynchronously (`async_commit`): the statement's own, outside
    atomic(), else the caller's."""
    t = Host._meta.db_table
    reads = list(_beat_reads)
    extra = "".join(f", {r.sql('h.id')}" for r in reads)
    beat = (f"UPDATE {t} AS h SET last_heartbeat_at = GREATEST(h.last_heartbeat_at, %s), "
            "agent_version = COALESCE(NULLIF(%s, ''), h.agent_version), "
            "state = CASE WHEN h.state = %s THEN h.admin_state ELSE h.state END, "
            "down_since = CASE WHEN h.state = %s THEN NULL ELSE h.down_since END, "
            "last_seq = COALESCE(%s, h.last_seq) "
            f"FROM (SELECT id, state FROM {t} WHERE id = %s FOR UPDATE) AS o, "
            # `async_commit` in the same statement (SET LOCAL, as a function): one round trip
            "(SELECT set_config('synchronous_commit', 'off', true)) AS async_commit, "
            # and the GPUs' health, which the samples are checked against (`gpu_samples_apply`)
            "(SELECT ARRAY_AGG(uuid) AS uuids, ARRAY_AGG(healthy) AS healthy, ARRAY_AGG(ecc_uncorrected) AS ecc "
            f"FROM {Gpu._meta.db_table} WHERE host_id = %s) AS gh, "
            # and the log tails wanted (the answer's, `selectors.host_logs_requests`)
            f"({logs_requested_sql()}) AS lr(attempts, tails) "
            f"WHERE h.id = o.id RETURNING {model_columns(Host, 'h')}, o.state, gh.uuids, gh.healthy, gh.ecc, "
            f"lr.attempts, lr.tails{extra}")
    params = [now, agent_version[:50], HostState.DOWN, HostState.DOWN, seq, pk, pk, pk,
              *(p for r in reads for p in r.params)]
    width = len(Host._meta.concrete_fields) + 6 + len(reads)
    if holds:
        # and the host's work: one row per hold, each after the host's columns (one with
        # NULLs when it holds none), ordered by the hold's first allocation
        beat = f"WITH b AS ({beat}) SELECT * FROM b LEFT JOIN ({holds_sql()}) AS x ON true ORDER BY x.first"
        params.append(pk)
    with connection.cursor() as cur:
        cur.execute(beat, params)
        rows = cur.fetchall()
    if not rows:
        raise Host.DoesNotExist
    row = rows[0][:width]
    locked, end = model_from_row(Host, row)
    state, uuids, healthy, ecc, attempts, tails, *values = row[end:]
    shared: dict = {}
    for r, value in zip(reads, values, strict=True):
        r.seed(shared, locked.pk, value)
    return (locked, state == HostState.DOWN,
            dict(zip(uuids or (), zip(healthy or (), ecc or (), strict=True), strict=True)),
            logs_requests_of(attempts, tails), shared,
            holds_of([r for r in rows if r[width] is not None]) if holds else None)


def _host_beat_orm(pk: object, *, hb: Heartbeat, now: datetime, fresh: bool | None
                   ) -> tuple[Host, bool, HeartbeatOutcome]:
    """`_host_beat` read and written, where the freshness is decided here from `Host.last_seq`
    under the lock (no fast path), or off PostgreSQL. Heartbeats of one host decide their
    order one at a time; the liveness task's DOWN update waits for this too."""
    locked = _host_for_update(pk)
    applied = seq_is_fresh(hb.seq, locked.last_seq) if fresh is None else fresh
    outcome = HeartbeatOutcome(applied=applied, token_hash=locked.token_hash)
    fields = ["last_heartbeat_at", "agent_version"]
    locked.last_heartbeat_at = max(now, locked.last_heartbeat_at or now)
    locked.agent_version = (hb.agent_version or locked.agent_version)[:50]
    was_down = locked.state == HostState.DOWN
    if was_down:
        # Back as what the operator wants: a drain or cordon survives an outage.
        locked.state, locked.down_since = locked.admin_state, None
        fields += ["state", "down_since"]
    if outcome.applied:
        locked.last_seq = hb.seq
        fields.append("last_seq")
    _host_save(locked, fields)
    return locked, was_down, outcome


def host_heartbeat(
    *, host: Host, hb: Heartbeat, now: datetime | None = None, fresh: bool | None = None,
    bulk: bool = True, buffer_samples: bool = False, samples_later: list[bytes] | None = None,
) -> HeartbeatOutcome:
    """Record a heartbeat of `host` (already authenticated): liveness, samples, container states.

    The desired set is made afterwards (`selectors.host_desired_containers`), so it
    reflects the transitions made here: from `outcome.holds` (the host's work as read
    here, before the moves) with the moves applied, confirmed or read again (see
    agents/api/views.py). `host` may be a bare `Host(pk=...)`: its row is read (locked)
    here and returned as `outcome.host`; Host.DoesNotExist when it is gone, before anything
    is written. `fresh`: whether to apply it, when the caller
    already decided that from the seq (the fast path claims seqs in Redis, see
    agents/fastpath.py); None: decided here from `Host.last_seq`. `buffer_samples`: GPU
    samples that change no GPU's health may go to the fast path's buffer (see
    `gpu_samples_apply`; the view's, when the fast path is on); `samples_later`: their record
    goes there, for the caller to push (`gpu_samples_apply`'s `later`).
    """
    if hb.host_id != str(host.pk):
        raise TokenRefused("This host token belongs to another host.")
    now = now or timezone.now()
    # Three short steps, not one long transaction: holding the host row while writing its
    # GPU rows would take locks in the opposite order to the scheduler's apply (GPUs, then
    # host) and could deadlock with a placement on this host.
    if fresh is not None and connection.vendor == "postgresql":
        # One statement, a transaction of its own (no BEGIN and COMMIT round trips around it)
        # unless the caller's atomic() holds one.
        locked, was_down, health, logs, shared, holds = _host_beat(
            host.pk, now=now, agent_version=hb.agent_version, seq=hb.seq if fresh else None,
            holds=fresh and (hb.containers is not None or bool(hb.logs)))
        # (log tails in this heartbeat answer requests: the answer reads them again)
        outcome = HeartbeatOutcome(applied=fresh, token_hash=locked.token_hash,
                                   logs_requests=None if hb.logs else logs, answer_reads=shared, holds=holds)
    else:
        with transaction.atomic():
            async_commit()
            locked, was_down, outcome = _host_beat_orm(host.pk, hb=hb, now=now, fresh=fresh)
        health = None
    outcome.host = locked
    if was_down:
        logger.info("host back host=%s name=%s", locked.pk, locked.name)
        cycle_wanted(locked.region_id)  # capacity is back (after commit)
    if not outcome.applied:
        logger.info(
            "late heartbeat ignored host=%s seq=%d last=%d", host.pk, hb.seq, locked.last_seq
        )
        return outcome
    samples = gpu_samples_apply(host=locked, samples=hb.gpus, now=now, buffer=buffer_samples, health=health,
                                later=samples_later)
    outcome.unknown_gpus = samples.unknown_gpus
    if samples.failed:
        outcome.transitions += gpus_fail_work(gpus=samples.failed)
        outcome.holds = None  # (read with the host's row, before these moves: read again below)
    if hb.volumes is not None:
        with transaction.atomic():
            volumes_reported.send(sender=Host, host=locked, usage={v.volume: v.used_bytes for v in hb.volumes})
    if hb.containers is None and not hb.logs:
        return outcome  # the agent could not list its runtime: infer nothing
    # What this host runs, by container instance id (before this heartbeat's exits free it)
    if outcome.holds is None:
        outcome.holds = host_holds(host=locked)
    attempts = {h.attempt: h for h in outcome.holds}
    if hb.logs:
        container_logs_store(host=locked, tails=hb.logs, now=now,
                             attempts=host_attempts(host=locked, holds=outcome.holds))
    if hb.containers is None:
        return outcome  # the agent could not list its runtime: infer nothing
    outcome.transitions += containers_observe(host=locked, containers=hb.containers, attempts=attempts, now=now,
                                              bulk=bulk)
    if outcome.transitions:
        containers_observed_times(containers=hb.containers, attempts=attempts, transitions=outcome.transitions,
                                  now=now)
        logger.info("heartbeat host=%s seq=%d transitions=%s", host.pk, hb.seq, outcome.transitions)
    return outcome
