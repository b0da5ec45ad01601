"""Reads for the agent API: who a host token belongs to, and what should run on a host.

Container ids sent to agents are *attempt* ids, `<workload id>.<allocation id>`: the
id of the workload's first active allocation on that host. A job that failed and was
placed again gets new allocations, hence a new id, so a remembered exit of the previous
attempt (the agent keeps those, see docs/agent.md) can never end the new one.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections import defaultdict
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any, Final
from uuid import UUID

import orjson
from django.conf import settings
from django.db import connection
from django.db.models import Avg, Count, Min, Q
from django.db.models.functions import Floor
from django.utils import timezone

from agents.choices import HostState
from agents.instance_env import platform_env
from agents.models import ContainerLog, Gpu, GpuSample, GpuSampleMinute, Host
from agents.protocol import LOG_TAIL_MAX_LINES, DesiredContainer, LogsRequest, Mount
from gpucloud.catalogue.models import InstanceType, Price, Region
from gpucloud.catalogue.selectors import prices_in_force
from gpucloud.lib.db import Epoch, model_columns, model_from_row, pg_array
from scheduler import core, snapshot
from scheduler.choices import HOLDING, State
from scheduler.core import blockers
from scheduler.cycle import policy_for
from scheduler.feasibility import fleet_capabilities, unsatisfiable_reason
from scheduler.models import Allocation, Workload

# Workload states whose container the agent must run. STOPPING is absent on purpose:
# leaving the desired set is how the agent learns to stop a container.
DESIRED_STATES = (State.SCHEDULED, State.STARTING, State.RUNNING)

LABEL_WORKLOAD = "gpucloud.workload"
LABEL_NAME = "gpucloud.name"
# Simulation hooks: a workload's env may say how long its simulated container runs and
# how it ends (`agents.host.sim`). Real runtimes ignore these labels.
SIM_ENV_LABELS = {
    "GPUCLOUD_SIM_DURATION_S": "gpucloud.sim.duration_s",
    "GPUCLOUD_SIM_EXIT_CODE": "gpucloud.sim.exit_code",
}


def hash_token(raw: str) -> str:
    """SHA-256 hex of a secret. Tokens are 256-bit random, so no slow KDF is needed."""
    return hashlib.sha256(raw.encode()).hexdigest()


def host_by_token(*, raw: str) -> Host | None:
    """The host whose token is `raw`, or None.

    `Host.objects.filter(token_hash=...).first()` in written SQL: every heartbeat after a
    change of its host's work asks (the version that changed also retires the token that
    Redis knew), and building the ORM's query cost more CPU than running it."""
    if not raw:
        return None
    digest = hash_token(raw)
    with connection.cursor() as cur:
        cur.execute(f"SELECT {model_columns(Host, 'h')} FROM {Host._meta.db_table} h "
                    "WHERE h.token_hash = %s ORDER BY h.id LIMIT 1", [digest])
        row = cur.fetchone()
    host = None if row is None else model_from_row(Host, row)[0]
    if host is None or not hmac.compare_digest(host.token_hash, digest):
        return None
    return host


def host_by_pk(pk: UUID | str) -> Host | None:
    """`Host.objects.filter(pk=pk).first()` in written SQL: the agent API reads it for every
    heartbeat and long poll that Redis authenticated but the fast path cannot answer."""
    with connection.cursor() as cur:
        cur.execute(f"SELECT {model_columns(Host, 'h')} FROM {Host._meta.db_table} h WHERE h.id = %s",
                    [Host._meta.pk.get_db_prep_value(pk, connection)])
        row = cur.fetchone()
    return None if row is None else model_from_row(Host, row)[0]


def attempt_id(workload_id: UUID | str, allocation_id: int) -> str:
    return f"{workload_id}.{allocation_id}"


def tenant_network(tenant_id: UUID | str) -> str:
    """The tenant's bridge network on every host: tenants never share one."""
    return f"gpucloud-t-{tenant_id}"


# The workload's fields a heartbeat and its answer read, all that the hold reads select (the
# one-by-one steps, the gangs and the log tails get the whole model, `Hold.workload`, read when
# first asked for).
_HOLD_FIELDS: Final = ("id", "state", "kind", "nodes", "stop_by", "tenant_id", "name", "image", "command", "env",
                       "ports", "mounts", "checkpoint_signal", "checkpoint_grace_s")
_JSON_FIELDS: Final = frozenset({"command", "env", "ports", "mounts"})
_HOLD_ATTRS: Final = tuple("_state" if n == "state" else "_stop_by" if n == "stop_by" else "pk" if n == "id" else n
                           for n in _HOLD_FIELDS)
_HOLD_JSON: Final = tuple(i for i, n in enumerate(_HOLD_FIELDS) if n in _JSON_FIELDS)


class Hold:
    """One workload's hold on a host: what a heartbeat reads of the host's work, one row per
    workload (not per GPU). `first`: its first active allocation here (the attempt id's
    second half); `gpus`: the GPUs' UUIDs by index; `milli`: the first allocation's share;
    `vcpus` / `memory_mib`: its booking here, the instance type's when the rows carry none
    (hand-made rows); `xmin`: the workload row's version as read (`host_holds_after`).

    The workload's fields that heartbeats read (`_HOLD_FIELDS`) are attributes (`pk`,
    `state`, `kind`, `nodes`, `stop_by`, `env`, ...); `workload` is the model, read when a step
    first needs it, for every hold of the same read at once (`_models_load`: most heartbeats
    never need it, and 42 columns per workload cost more to load than the rest of the read).
    `state` and `stop_by` are the model's once it is built."""

    __slots__ = ("_model", "_group", "_state", "_stop_by", "first", "gpus", "milli", "vcpus", "memory_mib", "xmin",
                 "pk", "kind", "nodes", "tenant_id", "name", "image", "command", "env", "ports", "mounts",
                 "checkpoint_signal", "checkpoint_grace_s")

    def __init__(self, row: tuple, *, first: int, gpus: list[str], milli: int, vcpus: int, memory_mib: int,
                 xmin: str) -> None:
        """`row`: the `_HOLD_FIELDS` in that order."""
        self._model: Workload | None = None
        self._group: list[Hold] | None = None  # the holds read with it, whose models load together
        self.first, self.gpus, self.milli, self.vcpus, self.memory_mib, self.xmin = (
            first, gpus, milli, vcpus, memory_mib, xmin)
        for attr, value in zip(_HOLD_ATTRS, row, strict=True):
            setattr(self, attr, value)
        for i in _HOLD_JSON:
            if isinstance(row[i], str):
                setattr(self, _HOLD_ATTRS[i], _json(row[i]))

    @property
    def workload(self) -> Workload:
        if self._model is None:
            _models_load(self._group or [self])
        assert self._model is not None
        return self._model

    @property
    def state(self) -> str:
        return self._model.state if self._model is not None else self._state

    @state.setter
    def state(self, value: str) -> None:
        self._state = value
        if self._model is not None:
            self._model.state = value

    @property
    def stop_by(self) -> datetime | None:
        return self._model.stop_by if self._model is not None else self._stop_by

    @stop_by.setter
    def stop_by(self, value: datetime | None) -> None:
        self._stop_by = value
        if self._model is not None:
            self._model.stop_by = value

    @property
    def attempt(self) -> str:
        return attempt_id(self.pk, self.first)


def _models_load(holds: list[Hold]) -> None:
    """The workload models of `holds` that have none yet, in one query, each with the state
    and notice its hold has now (a heartbeat's own moves included). A workload deleted since
    the read gets a model of the hold's fields alone: no guarded update finds its row."""
    todo = [h for h in holds if h._model is None]
    if not todo:
        return
    with connection.cursor() as cur:
        if connection.vendor == "postgresql":
            cur.execute(f"SELECT {model_columns(Workload, 'w')} FROM {Workload._meta.db_table} w "
                        "WHERE w.id = ANY(%s::uuid[])", [pg_array(h.pk for h in todo)])
        else:
            cur.execute(f"SELECT {model_columns(Workload, 'w')} FROM {Workload._meta.db_table} w "
                        f"WHERE w.id IN ({', '.join(['%s'] * len(todo))})",
                        [Workload._meta.pk.get_db_prep_value(h.pk, connection) for h in todo])
        rows = cur.fetchall()
    models = {}
    for row in rows:
        m = model_from_row(Workload, row)[0]
        models[m.pk] = m
    for h in todo:
        m = models.get(h.pk)
        if m is None:
            m = Workload(**{f: getattr(h, a) for f, a in zip(_HOLD_FIELDS, _HOLD_ATTRS, strict=True)})
        m.state, m.stop_by = h._state, h._stop_by
        h._model = m


def _json(text: str) -> Any:
    """A JSON column's value, as JSONField.from_db_value gives it (orjson: a fifth of the time;
    the standard parser for what orjson refuses, such as integers past 64 bits)."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


def _grouped(holds: list[Hold]) -> list[Hold]:
    for h in holds:
        h._group = holds
    return holds


def host_holds(*, host: Host) -> list[Hold]:
    """The work holding active allocations on `host`, one `Hold` per workload, ordered by
    its first allocation: what `host_attempts` and `host_desired_containers` read, so a
    heartbeat reads it once.

    One query, in written SQL that groups the allocations in the database (a GPU's index
    instead of its row) and reads only the workload's `_HOLD_FIELDS`: every heartbeat that
    changes something reads it, and a model instance per allocation, its workload and its
    GPU cost more CPU than PostgreSQL took."""
    if connection.vendor != "postgresql":
        return _host_holds_portable(host)
    with connection.cursor() as cur:
        cur.execute(holds_sql(), [Host._meta.pk.get_db_prep_value(host.pk, connection)])
        return holds_of(cur.fetchall())


def holds_of(rows: list[tuple]) -> list[Hold]:
    """The holds of `holds_sql`'s rows (or of rows that end with its columns: a heartbeat reads
    them in its host's UPDATE, `agents.services.heartbeat`)."""
    width = len(_HOLD_FIELDS)
    out = []
    for row in rows:
        row = row[-HOLDS_WIDTH:]
        first, milli, gpus, vcpus, mem, it_vcpus, it_mem_gib, xmin = row[width:]
        out.append(Hold(row[:width], first=first, gpus=list(gpus), milli=milli, vcpus=int(vcpus or it_vcpus),
                        memory_mib=int(mem or it_mem_gib * 1024), xmin=xmin))
    return _grouped(out)


def _host_holds_portable(host: Host) -> list[Hold]:
    """`host_holds` elsewhere than on PostgreSQL (the SQLite demo): the allocations row by
    row, grouped here, each workload loaded as the ORM loads it; no row version (so
    `host_holds_after` reads again)."""
    a, g, it = Allocation._meta.db_table, Gpu._meta.db_table, InstanceType._meta.db_table
    with connection.cursor() as cur:
        cur.execute(
            f"SELECT {model_columns(Workload, 'w')}, a.id, a.milli, a.gpu_id, g.\"index\", a.vcpus, a.memory_mib, "
            f"it.vcpus, it.memory_gib FROM {a} a JOIN {g} g ON g.uuid = a.gpu_id "
            f"JOIN {Workload._meta.db_table} w ON w.id = a.workload_id JOIN {it} it ON it.id = w.instance_type_id "
            "WHERE a.host_id = %s AND a.active ORDER BY a.id",
            [Host._meta.pk.get_db_prep_value(host.pk, connection)])
        rows = cur.fetchall()
    width = len(Workload._meta.concrete_fields)
    # workload id -> [model, first, milli, [(index, id, gpu)], vcpus, mem, it_vcpus, it_mem]
    groups: dict[Any, list] = {}
    for row in rows:
        aid, milli, gpu, index, vcpus, mem, it_vcpus, it_mem_gib = row[width:]
        got = groups.get(row[0])
        if got is None:
            got = groups[row[0]] = [model_from_row(Workload, row)[0], aid, milli, [], 0, 0, it_vcpus, it_mem_gib]
        got[3].append((index, aid, gpu))
        got[4] += vcpus or 0
        got[5] += mem or 0
    out = []
    for w, first, milli, gpus, vcpus, mem, it_vcpus, it_mem_gib in groups.values():
        h = Hold(tuple(getattr(w, name) for name in _HOLD_FIELDS), first=first,
                 gpus=[gpu for _i, _a, gpu in sorted(gpus)], milli=milli, vcpus=int(vcpus or it_vcpus),
                 memory_mib=int(mem or it_mem_gib * 1024), xmin="")
        h._model = w
        out.append(h)
    return _grouped(out)


def host_holds_after(*, host: Host, holds: list[Hold], moved: set[str]) -> list[Hold]:
    """`host_holds(host=host)` after this heartbeat moved the workloads `moved` (ids as text):
    `holds` (read before the moves) confirmed by a narrow read, else read again.

    The narrow read gives each holding workload's first allocation, GPUs, state, notice and
    row version. A workload still held as read (same allocations; a row version unchanged
    unless this heartbeat moved it) keeps what was read of it, with the state and notice
    read now; a hold that is gone is left out; anything else (new work placed here meanwhile,
    a row changed by someone else) reads everything again."""
    if connection.vendor != "postgresql":
        return host_holds(host=host)
    with connection.cursor() as cur:
        cur.execute(_HOLDS_NOW_SQL(), [Host._meta.pk.get_db_prep_value(host.pk, connection)])
        rows = cur.fetchall()
    before = {str(h.pk): h for h in holds}
    out = []
    for wid, first, gpus, state, stop_by, xmin in rows:
        h = before.get(str(wid))
        if h is None or h.first != first or h.gpus != list(gpus) or (str(wid) not in moved and h.xmin != xmin):
            return host_holds(host=host)
        h.state, h.stop_by, h.xmin = state, stop_by, xmin
        out.append(h)
    return out


def holds_moved(holds: list[Hold], transitions: list[tuple[str, str]]) -> list[Hold]:
    """`holds` after the heartbeat's own `transitions` ((workload id, new state), in order),
    when they were the only change to the host since `holds` were read (the caller knows:
    `agents.fastpath.only_own`). Work that left the holding states is left out (its
    allocations are released); the rest is as read, in its new state."""
    last = dict(transitions)
    out = []
    for h in holds:
        state = last.get(str(h.pk))
        if state is not None:
            if state not in HOLDING:
                continue
            h.state = state
        out.append(h)
    return out


def _holds_from() -> str:
    """The FROM of both hold reads: a host's active allocations grouped per workload."""
    a, g = Allocation._meta.db_table, Gpu._meta.db_table
    return (f"(SELECT a.workload_id, MIN(a.id) AS first, (ARRAY_AGG(a.milli ORDER BY a.id))[1] AS milli, "
            "ARRAY_AGG(a.gpu_id ORDER BY g.index, a.id) AS gpus, SUM(a.vcpus) AS vcpus, "
            f"SUM(a.memory_mib) AS mem FROM {a} a JOIN {g} g ON g.uuid = a.gpu_id "
            "WHERE a.host_id = %s AND a.active GROUP BY a.workload_id) f "
            f"JOIN {Workload._meta.db_table} w ON w.id = f.workload_id ")


@cache
def holds_sql() -> str:
    """`host_holds`' query on PostgreSQL: the holds of the host whose id is its one `%s`, in
    order, `HOLDS_WIDTH` columns; `holds_of` reads its rows."""
    cols = ", ".join(f'w."{Workload._meta.get_field(name).column}"' for name in _HOLD_FIELDS)
    return (f"SELECT {cols}, f.first, f.milli, f.gpus, f.vcpus, f.mem, "
            f"it.vcpus, it.memory_gib, w.xmin::text FROM {_holds_from()}"
            f"JOIN {InstanceType._meta.db_table} it ON it.id = w.instance_type_id ORDER BY f.first")


HOLDS_WIDTH: Final = len(_HOLD_FIELDS) + 8


@cache
def _HOLDS_NOW_SQL() -> str:  # noqa: N802
    return f"SELECT w.id, f.first, f.gpus, w.state, w.stop_by, w.xmin::text FROM {_holds_from()}ORDER BY f.first"


def host_attempts(
    *,
    host: Host,
    states: tuple[str, ...] | None = None,
    holds: list[Hold] | None = None,
) -> dict[str, Workload]:
    """Attempt id -> workload, for the workloads holding an active allocation on `host`."""
    if holds is None:
        holds = host_holds(host=host)
    return {h.attempt: h.workload for h in holds if states is None or h.state in states}


# A multi-host job's parts learn their place in it (as torchrun's NODE_RANK / NNODES).
ENV_NODE_RANK = "GPUCLOUD_NODE_RANK"
ENV_NUM_NODES = "GPUCLOUD_NUM_NODES"


def gang_parts(*, workload_ids: list[UUID]) -> dict[UUID, dict[str, tuple[UUID, int]]]:
    """Workload -> {attempt id: (host id, rank)} of its current attempt's parts, one per host.

    Ranks count 0.. in the order of the parts' first allocations: fixed for an attempt.
    One query.
    """
    firsts: dict[UUID, list[tuple[int, UUID]]] = defaultdict(list)
    for wid, host_id, first in (
        Allocation.objects.filter(workload_id__in=workload_ids, active=True)
        .values("workload_id", "host_id").annotate(first=Min("id"))
        .values_list("workload_id", "host_id", "first")
    ):
        firsts[wid].append((first, host_id))
    return {wid: {attempt_id(wid, first): (host_id, rank) for rank, (first, host_id) in enumerate(sorted(rows))}
            for wid, rows in firsts.items()}


def _per_rank(value: str, rank: int) -> str:
    """A simulation hook's value for one part: `"3600,1"` gives rank 0 3600 and rank 1 (and
    later ranks) 1, so a test can make one part of a gang end differently."""
    values = value.split(",")
    return values[min(rank, len(values) - 1)].strip()


def host_desired_containers(*, host: Host, holds: list[Hold] | None = None) -> list[DesiredContainer]:
    """The whole desired set of `host` (the heartbeat answer). One query, or none when
    the caller passes `host_holds(host=host)` read after its last write (or confirmed since,
    `host_holds_after`)."""
    if holds is None:
        holds = host_holds(host=host)
    wanted = sorted((h for h in holds if h.state in DESIRED_STATES), key=lambda h: str(h.pk))
    gangs = [h.pk for h in wanted if h.nodes > 1]
    ranks = gang_parts(workload_ids=gangs) if gangs else {}
    out = []
    for w in wanted:
        iid = w.attempt
        env = {str(k): str(v) for k, v in w.env.items()}
        rank = 0
        if w.nodes > 1:
            rank = ranks.get(w.pk, {}).get(iid, (None, 0))[1]
            env.update({ENV_NODE_RANK: str(rank), ENV_NUM_NODES: str(w.nodes)})
        labels = {LABEL_WORKLOAD: str(w.pk), LABEL_NAME: w.name[:63]}
        for env_name, label in SIM_ENV_LABELS.items():
            if env_name in w.env:
                labels[label] = _per_rank(str(w.env[env_name]), rank)
        out.append(
            DesiredContainer(
                instance_id=iid,
                tenant_id=str(w.tenant_id),
                kind=w.kind,
                image=w.image,
                command=[str(c) for c in w.command],
                env={**platform_env(w), **env},
                ports=[int(p) for p in w.ports],
                gpu_uuids=list(w.gpus),
                gpu_milli=w.milli,
                # The host's CPU and memory booking rides on the allocation rows (the scheduler
                # puts it on the first GPU's row); the instance type's for hand-made rows.
                vcpus=float(w.vcpus),
                memory_mib=int(w.memory_mib),
                pids_limit=settings.AGENT_PIDS_LIMIT,
                network=tenant_network(w.tenant_id),
                labels=labels,
                mounts=[Mount(volume=m["name"], path=m["path"], read_only=bool(m.get("read_only")))
                        for m in w.mounts],
                checkpoint_signal=w.checkpoint_signal or None,
                checkpoint_grace_s=w.checkpoint_grace_s or 0,
                # under a notice: a checkpointing job gets its signal (the agent sends it once)
                stop_by=_iso(w.stop_by) if w.stop_by is not None and w.checkpoint_signal else None,
            )
        )
    return out


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).isoformat().replace("+00:00", "Z")


def workload_attempt(*, workload: Workload) -> tuple[UUID, str] | None:
    """(host id, attempt id) of the container running `workload` now, or None."""
    first = (
        Allocation.objects.filter(workload=workload, active=True)
        .order_by("id")
        .values_list("host_id", "id")
        .first()
    )
    return None if first is None else (first[0], attempt_id(workload.pk, first[1]))


def host_logs_requests(*, host: Host) -> list[LogsRequest]:
    """Log tails wanted from `host` (sent in the heartbeat answer). One indexed query (written
    SQL: every answer that is not cached asks, and the ORM's query cost more to build than to
    run); a changed heartbeat's host UPDATE reads the same (`logs_requested_sql`)."""
    pk = Host._meta.pk.get_db_prep_value(host.pk, connection)
    with connection.cursor() as cur:
        if connection.vendor == "postgresql":
            cur.execute(logs_requested_sql(), [pk])
            return logs_requests_of(*cur.fetchone())
        # elsewhere (the SQLite demo): one row per tail, in the same order
        cur.execute(f"SELECT attempt_id, requested_tail FROM {ContainerLog._meta.db_table} "
                    "WHERE host_id = %s AND requested_at IS NOT NULL ORDER BY requested_at, workload_id", [pk])
        rows = cur.fetchall()
    return logs_requests_of([r[0] for r in rows], [r[1] for r in rows])


@cache
def logs_requested_sql() -> str:
    """One row: the attempt ids and tails wanted from host %s, oldest first (a tail that did
    not fit last time goes first), as two arrays (NULL when none): `logs_requests_of`."""
    order = "ORDER BY requested_at, workload_id"  # one order for both arrays, ties included
    return (f"SELECT ARRAY_AGG(attempt_id {order}), ARRAY_AGG(requested_tail {order}) "
            f"FROM {ContainerLog._meta.db_table} WHERE host_id = %s AND requested_at IS NOT NULL")


def logs_requests_of(attempts: list[str] | None, tails: list[int] | None) -> list[LogsRequest]:
    return [LogsRequest(iid, max(1, min(tail, LOG_TAIL_MAX_LINES)))
            for iid, tail in zip(attempts or (), tails or (), strict=True)]


# --- metrics ------------------------------------------------------------------------------

METRICS = ("gpu_util", "mem_util", "mem_used_mib", "temperature_c", "power_w")
MAX_POINTS = 1440  # per series: a day at one minute, an hour at 2.5 s


def workload_metrics(
    *, workload: Workload, since: datetime, step: int, now: datetime | None = None
) -> dict:
    """Utilisation of `workload`'s GPUs since `since`, averaged per `step` seconds.

    Per GPU it held (any attempt, only while it held it), and the average over its GPUs
    per step ("what the instance used"). Raw samples serve a range they still cover (the
    default, the last hour, included: so points show within a workload's first minute,
    before any roll-up); otherwise the 1-minute averages. One query per source.
    Precondition: `workload` was read through a tenant-scoped selector.
    """

    now = now or timezone.now()
    raw_from = now - timedelta(seconds=settings.GPU_SAMPLE_RAW_RETENTION_S)
    # (a minute of slack: "the last hour" computed a moment earlier still counts)
    use_raw = since >= raw_from - timedelta(seconds=60)
    model, tcol = (GpuSample, "time") if use_raw else (GpuSampleMinute, "minute")
    spans = list(
        Allocation.objects.filter(workload=workload)
        .values_list("gpu_id", "gpu__index", "created_at", "released_at")
        .order_by("gpu__index", "id")
    )
    held = Q(pk__in=[])
    for gpu_id, _, start, end in spans:
        # A minute row covers [minute, minute + 60 s): count it if it overlaps the hold.
        lo = start if use_raw else start - timedelta(seconds=59)
        span = Q(gpu_id=gpu_id, **{f"{tcol}__gte": lo})
        if end is not None:
            span &= Q(**{f"{tcol}__lte": end})
        held |= span
    rows = (
        model.objects.filter(held, **{f"{tcol}__gte": since, f"{tcol}__lte": now})
        .annotate(bucket=Floor(Epoch(tcol) / step) * step)
        .values("gpu_id", "bucket")
        .annotate(**{m: Avg(m) for m in METRICS})
        .order_by("gpu_id", "bucket")
    )
    series: dict[str, list[dict]] = defaultdict(list)
    per_bucket: dict[float, list[dict]] = defaultdict(list)
    for r in rows:
        t = datetime.fromtimestamp(int(r["bucket"]), tz=timezone.get_current_timezone())
        point = {"t": t, **{m: _round(r[m]) for m in METRICS}}
        series[r["gpu_id"]].append(point)
        per_bucket[r["bucket"]].append(point)
    index = {gpu_id: idx for gpu_id, idx, _, _ in spans}
    average = [
        {
            "t": points[0]["t"],
            **{m: _mean([p[m] for p in points]) for m in METRICS},
            "gpus": len(points),
        }
        for _, points in sorted(per_bucket.items())
    ]
    return {
        "since": since,
        "until": now,
        "step": step,
        "source": "raw" if use_raw else "minute",
        "gpus": [
            {"uuid": uuid, "index": index[uuid], "points": series.get(uuid, [])}
            for uuid in sorted(index, key=lambda u: index[u])
        ],
        "average": average,
    }


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return _round(sum(known) / len(known)) if known else None


def _round(v: float | None) -> float | None:
    return None if v is None else round(float(v), 2)


# --- capacity for the console's catalogue ----------------------------------------------------


def launchable_counts(
    *, instance_types: list, region_codes: list[str] | None = None
) -> dict[tuple[int, str], int]:
    """{(instance type id, region code): how many of it would fit on READY hosts right now}.

    An estimate for people choosing what to rent, not a reservation: per host it counts
    free healthy GPUs of the type's model (whole GPUs for whole types, free shares of
    unshared-or-shared GPUs for fractional ones) and free vCPUs and memory; NVLink islands
    and the queue ahead are the scheduler's business. Two queries whatever the fleet size.
    """
    hosts = Host.objects.filter(state=HostState.READY)
    if region_codes:
        hosts = hosts.filter(region__code__in=region_codes)
    free_cpu_mem = {
        pk: (region, vcpus - used_v, (mem - used_m) / 1024)
        for pk, region, vcpus, used_v, mem, used_m in hosts.values_list(
            "pk", "region__code", "vcpus", "used_vcpus", "memory_mib", "used_memory_mib")
    }
    # per host and GPU model: free whole GPUs, and the free milli of each GPU not held whole
    whole: dict[tuple[UUID, str], int] = defaultdict(int)
    shares: dict[tuple[UUID, str], list[int]] = defaultdict(list)
    for host_id, model, used, is_whole in Gpu.objects.filter(
        host_id__in=list(free_cpu_mem), healthy=True
    ).values_list("host_id", "gpu_model__code", "used_milli", "whole"):
        if used == 0:
            whole[(host_id, model)] += 1
        if not is_whole:
            shares[(host_id, model)].append(1000 - used)
    out: dict[tuple[int, str], int] = defaultdict(int)
    for it in instance_types:
        model = it.gpu_model.code
        for host_id, (region, vcpus, mem_gib) in free_cpu_mem.items():
            if it.gpu_share_milli >= 1000:
                by_gpu = whole.get((host_id, model), 0) // it.gpu_count
            else:
                free_shares = shares.get((host_id, model), [])
                by_gpu = sum(free // it.gpu_share_milli for free in free_shares)
            fit = min(by_gpu, int(vcpus // it.vcpus), int(mem_gib // it.memory_gib))
            out[(it.pk, region)] += max(0, fit)
    return dict(out)


def regions_that_could_host(instance_type) -> set[str]:
    """Region codes where some host (in any state) has enough GPUs of the type's model for one.

    Elsewhere the scheduler refuses the type outright ("the fleet has no … GPUs in …"), so the
    console warns before launch.
    """
    need = instance_type.gpu_count if instance_type.gpu_share_milli >= 1000 else 1
    # the GPUs the scheduler's snapshot counts: a broken GPU only while it still holds a booking
    counted = Q(healthy=True) | Q(whole=True) | Q(used_milli__gt=0)
    return set(
        Gpu.objects.filter(counted, gpu_model_id=instance_type.gpu_model_id)
        .values("host_id", "host__region__code").annotate(n=Count("uuid")).filter(n__gte=need)
        .values_list("host__region__code", flat=True)
    )


# --- availability: what would start now, per instance type and region ----------------------

# What-if launches counted per (type, region): `available_now` is at most this many.
AVAILABILITY_COUNT_MAX = 256
_PROBE = "availability-probe"


@dataclass(frozen=True)
class Availability:
    instance_type: Any  # gpucloud.catalogue.models.InstanceType
    region: str
    available_now: int  # launches of one node that would start in the next cycle
    can_host: bool  # some host of the region could ever run one
    reason: str  # why it never could ("" when it can)

    @property
    def availability(self) -> str:
        """available, busy or never (`scheduler.core.blockers.availability`)."""
        return blockers.availability(can_host=self.can_host, available_now=self.available_now)


def availability(*, instance_types: list, region_codes: list[str] | None = None, tenant=None,
                 now: datetime | None = None, prices: dict | None = None) -> list[Availability]:
    """Per instance type and region where it is priced: how many launches would start now, and
    whether the region's fleet could ever run it (and why not).

    `available_now` is the scheduler's own answer, not an estimate: `launchable_counts` bounds it
    from above (free GPUs, vCPUs, memory), then the region's next cycle is planned by the core
    with that many one-node launches (on demand, standard class) added behind the queue, and
    the ones it would place are counted. So the queue ahead, NVLink islands, reservations,
    quotas and the GPU-sharing rule (a GPU's shares go to one tenant unless its model allows
    cross-tenant sharing) count as they will. For `tenant` (the API's `/availability`) its own
    shared GPUs, quotas and budget count; without one (the public catalogue), a new tenant's.
    Nothing is written. Queries: prices (unless `prices`, from `prices_in_force`, is given), fleet
    capabilities, then only where some host could run one: regions, free capacity, and one
    snapshot per region where something is free; never one per instance type.
    """
    now = now or timezone.now()
    types = list(instance_types)
    if prices is None:
        prices = prices_in_force(instance_types=types, at=now)
    pairs = [(it, code) for it in types for code in sorted({p.region for p in prices.get(it.pk, ())})
             if not region_codes or code in region_codes]
    if not pairs:
        return []
    caps = fleet_capabilities(region_codes=sorted({code for _, code in pairs}),
                              gpu_model_ids=list({it.gpu_model_id for it, _ in pairs}))
    reasons = {(it.pk, code): unsatisfiable_reason(instance_type=it, region=code,
                                                   hosts=caps.get((code, it.gpu_model.code), []))
               for it, code in pairs}
    could = [(it, code) for it, code in pairs if not reasons[(it.pk, code)]]
    upper = launchable_counts(instance_types=list({it.pk: it for it, _ in could}.values()),
                              region_codes=sorted({code for _, code in could})) if could else {}
    todo: dict[str, list[tuple[Any, int]]] = defaultdict(list)
    for it, code in could:
        n = min(upper.get((it.pk, code), 0), AVAILABILITY_COUNT_MAX)
        if n > 0:
            todo[code].append((it, n))
    regions = {r.code: r for r in Region.objects.filter(code__in=list(todo))} if todo else {}
    placed: dict[tuple[int, str], int] = {}
    t = now.timestamp()
    for code, items in todo.items():
        region = regions[code]
        cycle = snapshot.build(region_id=region.pk)
        snap = cycle.snapshot
        tenant_id = _PROBE if tenant is None else str(tenant.pk)
        if tenant is not None and all(v.tenant_id != tenant_id for v in snap.tenants):
            snap = replace(snap, tenants=(*snap.tenants, *snapshot.tenant_views({tenant_id})))
        policy = policy_for(region.pk)
        for it, n in items:
            fractional = it.gpu_share_milli < 1000
            probes = tuple(core.PlacementRequest(
                request_id=f"{_PROBE}-{i}", tenant_id=tenant_id, gpu_model=it.gpu_model.code,
                gpus_per_node=0 if fractional else it.gpu_count, gpu_milli=it.gpu_share_milli, nodes=1,
                vcpus=it.vcpus, memory_mib=it.memory_gib * 1024, region=code, kind="instance",
                priority="standard", billing="on_demand", submitted_at=t,
            ) for i in range(n))
            plan = core.plan(snap, (*cycle.queue, *probes), policy, now=t)
            placed[(it.pk, code)] = sum(1 for d in plan.decisions
                                        if isinstance(d, core.Place) and d.request_id.startswith(_PROBE))
    return [Availability(instance_type=it, region=code, available_now=placed.get((it.pk, code), 0),
                         can_host=not reasons[(it.pk, code)], reason=reasons[(it.pk, code)])
            for it, code in pairs]


# --- the tenant metrics API (GET /api/v1/metrics) ------------------------------------------

# metric -> (column of GpuSample / GpuSampleMinute, unit); cost_rate comes from the prices.
SERIES_METRICS: dict[str, tuple[str, str]] = {
    "gpu_util": ("gpu_util", "percent"),
    "gpu_mem_used": ("mem_used_mib", "MiB"),
    "gpu_temp": ("temperature_c", "celsius"),
    "power": ("power_w", "watts"),
}
SERIES_STATS = ("avg", "max", "min", "p95")
# (+ "sum", which alarms use and GET /api/v1/metrics does not offer)
_PG_STAT = {"avg": "AVG(v)", "max": "MAX(v)", "min": "MIN(v)", "sum": "SUM(v)",
            "p95": "percentile_cont(0.95) WITHIN GROUP (ORDER BY v)"}


def _epoch_sql(col: str, vendor: str) -> str:
    if vendor == "postgresql":
        return f"EXTRACT(EPOCH FROM {col})::float8"
    # rounded to the millisecond: julianday's float would put a sample on a step's edge in the step before
    return f"ROUND((julianday({col}) - 2440587.5) * 86400.0, 3)"


def _p95(values: list[float]) -> float:
    """percentile_cont(0.95): linear interpolation between the closest ranks."""
    s = sorted(values)
    pos = 0.95 * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def workload_series(
    *, workload: Workload, metric: str, stat: str, start: datetime, end: datetime, step: int,
    now: datetime | None = None,
) -> dict:
    """One series of `workload`: `metric` per `step` seconds from `start` to `end`, as `stat`.

    GPU metrics: the statistic over every sample of the GPUs it held (each only while it
    held it) in the step: the 1-minute roll-ups up to the last rolled-up minute, the raw
    samples after it (the last minute or two, which the roll-up has not reached yet; all of
    a range within the raw retention when `step` is under a minute). One query.
    `cost_rate`: the hourly price (billing's, for its instance type, region and billing kind)
    in force at each step while it held GPUs in that step, else 0; `stat` does not apply.
    Precondition: `workload` was read through a tenant-scoped selector.
    """
    now = now or timezone.now()
    end = min(end, now)
    spans = list(
        Allocation.objects.filter(workload=workload, created_at__lte=end)
        .filter(Q(released_at__isnull=True) | Q(released_at__gte=start))
        .values_list("gpu_id", "created_at", "released_at").order_by("id")
    )
    out = {"workload": workload.pk, "metric": metric, "stat": stat, "from": start, "to": end, "step": step}
    first = int(start.timestamp()) // step * step

    def at(bucket: float) -> datetime:
        return datetime.fromtimestamp(int(bucket), tz=timezone.get_current_timezone())

    if metric == "cost_rate":
        out["unit"] = f"{settings.BILLING_CURRENCY}/hour"
        out["points"] = _cost_points(workload, spans, first, end, step, now, at)
        return out
    col, out["unit"] = SERIES_METRICS[metric]
    if not spans:
        out["points"] = []
        return out
    gpus = sorted({g for g, _, _ in spans})
    vendor = connection.vendor
    raw_from = now - timedelta(seconds=settings.GPU_SAMPLE_RAW_RETENTION_S)
    if step < 60 and start >= raw_from - timedelta(seconds=60):
        cut = start  # all raw
    else:
        last = (GpuSampleMinute.objects.filter(gpu_id__in=gpus, minute__gte=start - timedelta(seconds=59))
                .order_by("-minute").values_list("minute", flat=True).first())
        cut = max(start, last + timedelta(seconds=60)) if last else max(start, raw_from)
    held_sql, held_params = [], []
    for gpu, created, released in spans:
        held_sql.append("(gpu_id = %s AND t >= %s" + (" AND at <= %s)" if released else ")"))
        held_params += [gpu, created] + ([released] if released else [])
    minute_t, raw_t = GpuSampleMinute._meta.db_table, GpuSample._meta.db_table
    # A row covers [at, t]: a raw sample one instant, a minute row [minute, minute + 59 s]; it
    # counts while it overlaps a hold of its GPU.
    union = (
        f"SELECT gpu_id, minute + INTERVAL '59 seconds' AS t, minute AS at, {col} AS v FROM {minute_t} "
        f"WHERE gpu_id = ANY(%s) AND minute >= %s AND minute < %s AND {col} IS NOT NULL "
        f"UNION ALL SELECT gpu_id, time AS t, time AS at, {col} AS v FROM {raw_t} "
        f"WHERE gpu_id = ANY(%s) AND time >= %s AND time <= %s AND {col} IS NOT NULL"
    )
    params = [gpus, start - timedelta(seconds=59), cut, gpus, cut, end]
    bucket = f"FLOOR({_epoch_sql('at', vendor)} / {int(step)}) * {int(step)}"
    where = " OR ".join(held_sql)
    if vendor == "postgresql":
        sql = (f"SELECT {bucket} AS b, {_PG_STAT[stat]} FROM ({union}) s WHERE {where} "
               "GROUP BY b ORDER BY b")
        with connection.cursor() as cur:
            cur.execute(sql, params + held_params)
            rows = cur.fetchall()
    else:  # SQLite (the demo): no arrays, intervals or percentiles; the demo's few rows in Python
        union = (union.replace("gpu_id = ANY(%s)", f"gpu_id IN ({','.join(['%s'] * len(gpus))})")
                 .replace("minute + INTERVAL '59 seconds'", "datetime(minute, '+59 seconds')"))
        params = [*gpus, start - timedelta(seconds=59), cut, *gpus, cut, end]
        # raw SQL: datetimes as the ORM stores them (naive UTC text), or comparisons go wrong
        params = [connection.ops.adapt_datetimefield_value(p) if isinstance(p, datetime) else p
                  for p in params + held_params]
        with connection.cursor() as cur:
            cur.execute(f"SELECT {bucket} AS b, v FROM ({union}) s WHERE {where} ORDER BY b", params)
            grouped: dict[float, list[float]] = defaultdict(list)
            for b, v in cur.fetchall():
                grouped[b].append(v)
        agg = {"avg": lambda v: sum(v) / len(v), "max": max, "min": min, "sum": sum, "p95": _p95}[stat]
        rows = [(b, agg(v)) for b, v in sorted(grouped.items())]
    out["points"] = [{"t": at(b), "value": _round(v)} for b, v in rows if b >= first]
    return out


def _cost_points(workload: Workload, spans: list, first: int, end: datetime, step: int, now: datetime,
                 at) -> list[dict]:
    holds = [(c.timestamp(), (r or now).timestamp()) for _, c, r in spans]
    prices = list(
        Price.objects.filter(instance_type_id=workload.instance_type_id, region_id=workload.region_id,
                             kind=workload.billing, effective_from__lte=end)
        .order_by("effective_from").values_list("effective_from", "per_hour")
    )
    points = []
    b = first
    last = end.timestamp()
    while b <= last:
        lo, hi = b, b + step
        overlap = [max(lo, s) for s, e in holds if s < hi and e >= lo]
        value = 0.0
        if overlap:
            when = min(overlap)
            in_force = [p for t, p in prices if t.timestamp() <= when]
            value = float(in_force[-1]) if in_force else 0.0
        points.append({"t": at(b), "value": round(value, 4)})
        b += step
    return points
