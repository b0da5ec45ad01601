"""GPU measurements: a heartbeat's samples (stored raw, each GPU's last measurement on its
row), the health rule that takes a failing GPU out of service and fails its work, and the
rollup of raw samples into minutes. The fast path (`agents.fastpath`) buffers unchanged
heartbeats' samples in Redis and writes them as these do.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Final

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Avg, Count, Max, Min
from django.db.models.functions import TruncMinute
from django.utils import timezone

from agents import fastpath
from agents.models import Gpu, GpuSample, GpuSampleMinute, Host
from agents.protocol import FATAL_XIDS, IDLE_BELOW, utilisation_fraction
from agents.protocol import GpuSample as GpuSampleMsg
from gpucloud.lib.db import model_columns, model_from_row
from scheduler.choices import State
from scheduler.models import Allocation
from scheduler.services import workload_requeue_or_end

logger = logging.getLogger(__name__)


def gpu_fault(sample: GpuSampleMsg, ecc_before: int | None) -> str | None:
    """Why this sample takes its GPU out of service, or None (pure).

    A lost GPU (the agent says unhealthy), a fatal XID (agents.protocol.FATAL_XIDS: the
    GPU needs a reset; application XIDs such as 13 or 43 are the program's fault), or an
    uncorrectable ECC count above the last one seen (counts are volatile: they reset with
    the driver, which is also what repairs the GPU).
    """
    fatal = [x for x in sample.xid_events if x in FATAL_XIDS]
    if fatal:
        return f"XID {fatal[-1]}" + (f" ({sample.error})" if sample.error else "")
    if sample.ecc_uncorrected is not None and sample.ecc_uncorrected > (ecc_before or 0):
        return f"uncorrectable ECC errors: {sample.ecc_uncorrected}"
    if not sample.healthy:
        return sample.error or "reported unhealthy by the agent"
    return None


@dataclass
class SamplesOutcome:
    failed: list[Gpu] = field(default_factory=list)  # GPUs that became unhealthy now
    unknown_gpus: bool = False  # a sample named a GPU this host does not have


def async_commit() -> None:
    """Let this transaction commit without waiting for the WAL flush (PostgreSQL).

    For heartbeat telemetry only (liveness time, samples): a crash may lose the last
    moment of them, which the next heartbeat rewrites, and a flush per heartbeat was the
    largest cost of the path. Lifecycle transitions commit in their own, synchronous,
    transactions; a later synchronous commit also makes every earlier one durable.
    """
    if connection.vendor == "postgresql":
        with connection.cursor() as cur:
            cur.execute("SET LOCAL synchronous_commit TO OFF")


# A host's GPUs' health as a heartbeat reads it: uuid -> (healthy, uncorrectable ECC count).
GpuHealth = dict[str, tuple[bool, int | None]]


def gpu_samples_apply(*, host: Host, samples: list[GpuSampleMsg], now: datetime,
                      buffer: bool = False, health: GpuHealth | None = None,
                      later: list[bytes] | None = None) -> SamplesOutcome:
    """Store the samples (one INSERT), update each GPU's last measurement (one UPDATE), in one
    transaction of their own.

    `buffer`: when no GPU's health moves (nothing fails, no ECC count changes, every GPU
    known: `_health_unmoved`, a narrow read), leave the samples to the fast path's buffer
    instead (`fastpath.samples_buffer`: written by its flush within a second, as an unchanged
    heartbeat's are), saving a changed heartbeat that transaction and the GPU rows' load.
    `health`: the host's GPUs' health when the caller read it already (else it is read here).
    `later`: with `buffer`, where the buffer's record goes instead, for the caller to push with
    a round trip it makes anyway (`fastpath.remember`; `fastpath.samples_push`, and where that
    fails this again without `buffer`).
    The work on the GPUs that became unhealthy now is the caller's to fail (`gpus_fail_work`).
    """
    out = SamplesOutcome()
    if not samples:
        return out
    if buffer and _health_unmoved(host, samples, health):
        if later is not None:
            later.append(fastpath.samples_record(host_id=host.pk, when=now, samples=samples))
            return out
        if fastpath.samples_buffer(host_id=host.pk, when=now, samples=samples):
            return out
    rows = {g.uuid: g for g in _host_gpus(host)}
    changed, failed, history = [], out.failed, []
    for s in samples:
        g = rows.get(s.uuid)
        if g is None:
            logger.warning("sample of an unknown gpu host=%s gpu=%s", host.pk, s.uuid)
            out.unknown_gpus = True
            continue
        g.sampled_at = now
        if s.gpu_util is not None:
            g.utilisation = utilisation_fraction(s.gpu_util)
            g.idle_since = (g.idle_since or now) if g.utilisation < IDLE_BELOW else None
        if s.mem_used_mib is not None:
            g.memory_used_mib = max(0, s.mem_used_mib)
        if s.temperature_c is not None:
            g.temperature_c = s.temperature_c
        if s.power_w is not None:
            g.power_w = s.power_w
        fault = gpu_fault(s, g.ecc_uncorrected)
        if s.ecc_uncorrected is not None:
            g.ecc_uncorrected = max(0, s.ecc_uncorrected)
        # Health is sticky: a sample can take a GPU out, only an operator puts it back.
        if fault and g.healthy:
            g.healthy, g.unhealthy_reason, g.unhealthy_since = False, fault[:300], now
            failed.append(g)
            logger.warning("gpu unhealthy host=%s gpu=%s reason=%s", host.pk, s.uuid, fault)
        changed.append(g)
        history.append(
            GpuSample(
                gpu_id=g.uuid,
                time=now,
                gpu_util=s.gpu_util,
                mem_util=s.mem_util,
                mem_used_mib=None if s.mem_used_mib is None else max(0, s.mem_used_mib),
                temperature_c=s.temperature_c,
                power_w=s.power_w,
            )
        )
    with transaction.atomic():
        async_commit()
        _write_measurements(changed)
        _insert_samples(history)
    return out


def _health_unmoved(host: Host, samples: list[GpuSampleMsg], health: GpuHealth | None) -> bool:
    """Do `samples` leave every GPU's health as it is: each names a GPU of `host`, none takes
    a healthy GPU out of service (`gpu_fault`), no uncorrectable ECC count moved? Against
    `health`, else one narrow read (uuid, healthy, count), before any GPU row is loaded: the
    common changed heartbeat's samples then go to the fast path's buffer."""
    if health is None:
        with connection.cursor() as cur:
            cur.execute(f"SELECT uuid, healthy, ecc_uncorrected FROM {Gpu._meta.db_table} WHERE host_id = %s",
                        [Host._meta.pk.get_db_prep_value(host.pk, connection)])
            health = {uuid: (healthy, ecc) for uuid, healthy, ecc in cur.fetchall()}
    for s in samples:
        known = health.get(s.uuid)
        if known is None:
            return False
        healthy, ecc = known
        if s.ecc_uncorrected is not None and ecc != max(0, s.ecc_uncorrected):
            return False
        if healthy and gpu_fault(s, ecc) is not None:
            return False
    return True


def _host_gpus(host: Host) -> list[Gpu]:
    """`Gpu.objects.filter(host=host)`, in written SQL on PostgreSQL: every heartbeat that
    changes something reads them, and building the ORM's query cost more than running it."""
    if connection.vendor != "postgresql":
        return list(Gpu.objects.filter(host=host))
    with connection.cursor() as cur:
        cur.execute(f"SELECT {model_columns(Gpu, 'g')} FROM {Gpu._meta.db_table} g WHERE g.host_id = %s",
                    [host.pk])
        return [model_from_row(Gpu, row)[0] for row in cur.fetchall()]


def _insert_samples(history: list[GpuSample]) -> None:
    """The samples in one INSERT from arrays on PostgreSQL (bulk_create built a row of
    placeholders per sample)."""
    if not history:
        return
    if connection.vendor != "postgresql":
        GpuSample.objects.bulk_create(history)
        return
    cols = ("gpu_id", "time", "gpu_util", "mem_util", "mem_used_mib", "temperature_c", "power_w")
    types = ("text", "timestamptz", "float8", "float8", "int8", "float8", "float8")
    with connection.cursor() as cur:
        cur.execute(
            f"INSERT INTO {connection.ops.quote_name(GpuSample._meta.db_table)} ({', '.join(cols)}) "
            f"SELECT * FROM unnest({', '.join(f'%s::{t}[]' for t in types)})",
            [[_as(t, getattr(h, c)) for h in history] for c, t in zip(cols, types, strict=True)],
        )


def _as(pg_type: str, v: object) -> object:
    """One array element as its column's type (an agent may send 7 or 7.0 for a float)."""
    if v is None or pg_type in ("text", "timestamptz"):
        return v
    return float(v) if pg_type == "float8" else int(v)  # type: ignore[call-overload]


_MEASURED: Final = (
    # column, PostgreSQL array type
    ("healthy", "bool"),
    ("unhealthy_reason", "text"),
    ("unhealthy_since", "timestamptz"),
    ("ecc_uncorrected", "int8"),
    ("sampled_at", "timestamptz"),
    ("utilisation", "float8"),
    ("idle_since", "timestamptz"),
    ("memory_used_mib", "int8"),
    ("temperature_c", "float8"),
    ("power_w", "float8"),
)


def _write_measurements(gpus: list[Gpu]) -> None:
    """Write only the measured fields of `gpus` (the booking counters may change under us:
    they are the scheduler's). On PostgreSQL one `UPDATE ... FROM unnest(...)`: Django's
    bulk_update builds a CASE expression per row and field, which was most of a heartbeat's
    time (see docs/benchmarks.md)."""
    if not gpus:
        return
    if connection.vendor != "postgresql":
        Gpu.objects.bulk_update(gpus, [f for f, _ in _MEASURED])
        return
    sets = ", ".join(f"{f} = v.{f}" for f, _ in _MEASURED)
    arrays = ", ".join(f"%s::{t}[]" for _, t in _MEASURED)
    names = ", ".join(f for f, _ in _MEASURED)
    with connection.cursor() as cur:
        cur.execute(
            f"UPDATE {Gpu._meta.db_table} AS g SET {sets} "
            f"FROM unnest(%s::text[], {arrays}) AS v(uuid, {names}) WHERE g.uuid = v.uuid",
            [[g.uuid for g in gpus], *([getattr(g, f) for g in gpus] for f, _ in _MEASURED)],
        )


def gpus_fail_work(*, gpus: list[Gpu]) -> list[tuple[str, str]]:
    """Fail the work holding a GPU that just became unhealthy (jobs retry if they may).

    Returns the transitions made, as (workload id, new state)."""
    reasons = {g.uuid: f"GPU {g.uuid} failed: {g.unhealthy_reason}" for g in gpus}
    victims = (
        Allocation.objects.filter(
            gpu__in=list(reasons),
            active=True,
            workload__state__in=(State.SCHEDULED, State.STARTING, State.RUNNING),
        )
        .select_related("workload")
        .order_by("workload_id", "id")
    )
    transitions: list[tuple[str, str]] = []
    seen = set()
    for a in victims:
        w = a.workload
        if w.pk in seen:
            continue
        seen.add(w.pk)
        old = w.state
        workload_requeue_or_end(workload=w, ended=State.FAILED, reason=reasons[a.gpu_id])
        if w.state != old:
            transitions.append((str(w.pk), State.FAILED))
            logger.warning("workload failed with its gpu workload=%s gpu=%s", w.pk, a.gpu_id)
    return transitions


@dataclass
class RollupOutcome:
    minutes: int = 0  # (gpu, minute) rows written or refreshed
    raw_pruned: int = 0
    minutes_pruned: int = 0


def gpu_samples_rollup(*, now: datetime | None = None) -> RollupOutcome:
    """Average raw samples into GpuSampleMinute for every complete minute since the last
    rolled-up one (re-doing that one: late samples), then prune both tables.

    Idempotent (an upsert per (gpu, minute)); a worker that was down catches up as far
    as the raw samples still go back.
    """
    now = now or timezone.now()
    fastpath.heartbeats_flush()  # the minute being rolled up may still be in Redis
    out = RollupOutcome()
    end = now.replace(second=0, microsecond=0)  # the current minute is not complete yet
    last = GpuSampleMinute.objects.aggregate(m=Max("minute"))["m"]
    start = last if last is not None else GpuSample.objects.aggregate(m=Min("time"))["m"]
    if start is not None and start < end:
        rows = (
            GpuSample.objects.filter(time__gte=start, time__lt=end)
            .annotate(m=TruncMinute("time"))
            .values("gpu_id", "m")
            .annotate(
                n=Count("id"),
                u=Avg("gpu_util"),
                mu=Avg("mem_util"),
                mem=Avg("mem_used_mib"),
                t=Avg("temperature_c"),
                p=Avg("power_w"),
            )
        )
        minutes = [
            GpuSampleMinute(
                gpu_id=r["gpu_id"],
                minute=r["m"],
                samples=r["n"],
                gpu_util=r["u"],
                mem_util=r["mu"],
                mem_used_mib=r["mem"],
                temperature_c=r["t"],
                power_w=r["p"],
            )
            for r in rows
        ]
        GpuSampleMinute.objects.bulk_create(
            minutes,
            batch_size=2000,
            update_conflicts=True,
            unique_fields=["gpu", "minute"],
            update_fields=["samples", "gpu_util", "mem_util", "mem_used_mib", "temperature_c",
                           "power_w"],
        )
        out.minutes = len(minutes)
    raw_cutoff = now - timedelta(seconds=settings.GPU_SAMPLE_RAW_RETENTION_S)
    out.raw_pruned = GpuSample.objects.filter(time__lt=raw_cutoff).delete()[0]
    minute_cutoff = now - timedelta(days=settings.GPU_SAMPLE_MINUTE_RETENTION_DAYS)
    out.minutes_pruned = GpuSampleMinute.objects.filter(minute__lt=minute_cutoff).delete()[0]
    return out
