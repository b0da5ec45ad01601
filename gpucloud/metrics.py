"""`/metrics` for Prometheus: the fleet, its GPUs and the queue as the database sees them at scrape time.

Three parts, each the same in every web process (no per-process counters to merge):

* `FleetCollector`: a few aggregate queries (workloads, hosts, GPUs, queue waits, metering lag).
* `dcgm_text`: per-GPU series under dcgm-exporter's names and labels (`DCGM_FI_DEV_GPU_UTIL`,
  `DCGM_FI_DEV_FB_USED`, ...; labels `gpu`, `UUID`, `device`, `modelName`, `Hostname`, plus
  `tenant` and `workload` from the active allocations), so dashboards and alerts written for
  DCGM work unchanged. One query whatever the fleet size: each GPU row's last measurement
  (utilisation, memory, temperature, power: both heartbeat paths keep them there), joined
  to its active allocations. No sample table is scanned. Written as text directly: at
  10,000 GPUs building prometheus_client objects cost more than the query.
* `gpucloud.lib.promstore`: cycle phases, queue waits at placement, placements,
  preemptions, heartbeats and their latency, webhook deliveries, kept in Redis.

It needs `Authorization: Bearer <METRICS_TOKEN>`; with no token set it is served only when
DEBUG (the laptop demo) and refused otherwise: fleet size, tenants' queue depth and host
names are not public.
"""
from __future__ import annotations

import hmac
import re
import time

from django.conf import settings
from django.db import connection
from django.db.models import Count, Min, Sum
from django.http import HttpResponse
from django.utils import timezone
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from agents.models import Gpu, Host
from billing.models import MeteringCursor
from gpucloud.catalogue.models import GpuModel
from gpucloud.lib import promstore
from gpucloud.tenancy.models import Tenant
from scheduler.models import Allocation, Workload


class FleetCollector:
    def collect(self):
        workloads = GaugeMetricFamily("gpucloud_workloads", "Workloads by kind, state and priority class",
                                      labels=["kind", "state", "priority"])
        for row in (Workload.objects.filter(deleted_at__isnull=True)
                    .values("kind", "state", "priority").annotate(n=Count("id")).order_by()):
            workloads.add_metric([row["kind"], row["state"], row["priority"]], row["n"])
        yield workloads

        hosts = GaugeMetricFamily("gpucloud_hosts", "Hosts by region and state", labels=["region", "state"])
        for row in Host.objects.values("region__code", "state").annotate(n=Count("id")).order_by():
            hosts.add_metric([row["region__code"], row["state"]], row["n"])
        yield hosts

        total = GaugeMetricFamily("gpucloud_gpus", "GPUs by region, model and health",
                                  labels=["region", "model", "healthy"])
        allocated = GaugeMetricFamily("gpucloud_gpus_allocated",
                                      "Allocated GPUs (fractions summed) by region and model",
                                      labels=["region", "model"])
        for row in (Gpu.objects.values("host__region__code", "gpu_model__code", "healthy")
                    .annotate(n=Count("uuid"), milli=Sum("used_milli")).order_by()):
            labels = [row["host__region__code"], row["gpu_model__code"]]
            total.add_metric([*labels, str(row["healthy"]).lower()], row["n"])
            allocated.add_metric(labels, (row["milli"] or 0) / 1000)
        yield total
        yield allocated

        now = timezone.now()
        waiting = GaugeMetricFamily("gpucloud_queue_pending", "Pending workloads by region and priority class",
                                    labels=["region", "priority"])
        oldest = GaugeMetricFamily("gpucloud_queue_oldest_wait_seconds",
                                   "Age of the oldest pending workload, by region and priority class",
                                   labels=["region", "priority"])
        for row in (Workload.objects.filter(state="pending", deleted_at__isnull=True)
                    .values("region__code", "priority").annotate(n=Count("id"), first=Min("queued_at"))
                    .order_by()):
            labels = [row["region__code"], row["priority"]]
            waiting.add_metric(labels, row["n"])
            oldest.add_metric(labels, max(0.0, (now - row["first"]).total_seconds()))
        yield waiting
        yield oldest

        lag = GaugeMetricFamily("gpucloud_metering_lag_seconds",
                                "How far behind now the metering run has scanned the transition log")
        cursor = MeteringCursor.objects.filter(name="default").values_list("events_until", flat=True).first()
        if cursor is not None:
            lag.add_metric([], max(0.0, (now - cursor).total_seconds()))
        yield lag
        yield from promstore.collect()


_XID = re.compile(r"XID (\d+)")
_DCGM = (
    # name, help, type (dcgm-exporter's default counters file)
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", "gauge"),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", "gauge"),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", "gauge"),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", "gauge"),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", "gauge"),
    ("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.", "gauge"),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Total number of double-bit volatile ECC errors.", "counter"),
)


def _esc(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _sql_esc(expr: str, pg: bool) -> str:
    """`_esc` in SQL: the label value escaped as the text format wants it."""
    nl = "chr(10)" if pg else "char(10)"
    return f"replace(replace(replace({expr}, '\\', '\\\\'), {nl}, '\\n'), '\"', '\\\"')"


def dcgm_sql() -> str:
    """The one query of `dcgm_text`: GPUs with a measurement, their host, model and owners.

    Each row: the GPU's labels up to `Hostname` already written (escaped) by the database,
    the tenants and workloads of its active allocations (comma-joined, NULL when none), and
    the values (utilisation as a fraction, memory used and free, temperature, power, the
    unhealthy reason for the XID, the ECC count). Writing the labels in SQL spares the web
    process five columns to load and a string per GPU to build."""
    pg = connection.vendor == "postgresql"
    # (no DISTINCT: a workload holds a GPU once; a tenant twice on one GPU is deduplicated in Python)
    agg = (lambda col: f"string_agg({col}, ',')") if pg else (lambda col: f"group_concat({col})")
    # (SQLite keeps a UUID as 32 hex digits: written here as str(uuid) writes it)
    wid = "a.workload_id::text" if pg else "||'-'||".join(
        f"substr(a.workload_id, {a}, {n})" for a, n in ((1, 8), (9, 4), (13, 4), (17, 4), (21, 12)))
    idx = "g.\"index\""
    fence = " OFFSET 0" if pg else ""  # (PostgreSQL would otherwise pull the escaping up, once per GPU)
    head = (f"'{{gpu=\"' || {idx} || '\",UUID=\"' || {_sql_esc('g.uuid', pg)} || '\",device=\"nvidia' || {idx} "
            "|| '\",modelName=\"' || m.name || '\",Hostname=\"' || h.name "
            "|| '\"'")
    # PostgreSQL writes the numbers as text (as it would on the wire anyway): the web process
    # then neither parses nor formats them. Integers read the same; floats in float8's
    # shortest exact form, which `_py_float` brings to Python's repr where the two differ.
    txt = (lambda col: f"({col})::text") if pg else (lambda col: col)
    free = "CASE WHEN g.memory_mib > g.memory_used_mib THEN g.memory_mib - g.memory_used_mib ELSE 0 END"
    return (
        f"SELECT {head}, o.tenants, o.workloads, g.utilisation, {txt('g.memory_used_mib')}, {txt(free)}, "
        f"{txt('g.temperature_c')}, {txt('g.power_w')}, g.unhealthy_reason, "
        f"{txt('COALESCE(g.ecc_uncorrected, 0)')} "
        # host and model names escaped once each, not once per GPU
        f"FROM {Gpu._meta.db_table} g "
        f"JOIN (SELECT id, {_sql_esc('name', pg)} AS name FROM {Host._meta.db_table}{fence}) h ON h.id = g.host_id "
        f"JOIN (SELECT id, {_sql_esc('name', pg)} AS name FROM {GpuModel._meta.db_table}{fence}) m "
        "ON m.id = g.gpu_model_id "
        f"LEFT JOIN (SELECT a.gpu_id, {agg('t.slug')} AS tenants, {agg(wid)} AS workloads "
        f"FROM {Allocation._meta.db_table} a JOIN {Workload._meta.db_table} w ON w.id = a.workload_id "
        f"JOIN {Tenant._meta.db_table} t ON t.id = w.tenant_id WHERE a.active GROUP BY a.gpu_id) o "
        "ON o.gpu_id = g.uuid WHERE g.sampled_at IS NOT NULL"
    )


def _py_float(col: tuple) -> list:
    """float8's text (PostgreSQL 12+, extra_float_digits > 0: the shortest exact digits, as
    Python's repr) as Python's repr writes it: the same string but for integral values
    ("71" for 71.0), exponents (from 1e15 rather than 1e16) and NaN/Infinity."""
    return [v if v is None or ("." in v and "e" not in v) else repr(float(v)) for v in col]


def _xid(why: str) -> int:
    xid = _XID.match(why)
    return int(xid.group(1)) if xid else 0


def dcgm_text(timings: dict[str, float] | None = None) -> str:
    """The per-GPU DCGM series of every GPU with a measurement, in the text exposition format.

    One query: each GPU's last measurement (kept on its row by both heartbeat paths), its
    labels, and the tenants and workloads of its active allocations. Then one list of label
    strings and a column of values per series, joined: no object per GPU.
    `timings`, given, receives each part's seconds (the benchmark prints them)."""

    clock = [time.perf_counter()]

    def lap(part: str) -> None:
        if timings is not None:
            t = time.perf_counter()
            timings[part] = timings.get(part, 0.0) + t - clock[0]
            clock[0] = t

    sql = dcgm_sql()
    with connection.cursor() as cur:
        cur.execute(sql)
        rows = cur.fetchall()
    lap("query")
    labels = []
    for head, tenants, workloads, *_ in rows:
        if tenants is None:
            labels.append(f'{head},tenant="",workload=""}} ')
            continue
        if "," in tenants:
            tenants = ",".join(sorted(set(tenants.split(","))))
        if "," in workloads:
            workloads = ",".join(sorted(workloads.split(",")))
        labels.append(f'{head},tenant="{tenants}",workload="{workloads}"}} ')
    _, _, _, util, used, free, temp, power, why, ecc = zip(*rows, strict=True) if rows else ((),) * 10
    if connection.vendor == "postgresql":
        temp, power = _py_float(temp), _py_float(power)
    columns = ([round(u * 100, 3) for u in util], used, free, temp, power,
               [_xid(w) if w else 0 for w in why], ecc)
    parts = []
    for (name, doc, kind), col in zip(_DCGM, columns, strict=True):
        parts.append(f"# HELP {name} {doc}\n# TYPE {name} {kind}\n")
        if None in col:
            parts.append("".join([f"{name}{lab}{v}\n" for lab, v in zip(labels, col, strict=True) if v is not None]))
        else:
            parts.append("".join([f"{name}{lab}{v}\n" for lab, v in zip(labels, col, strict=True)]))
    text = "".join(parts)
    lap("format")
    return text


_registry = CollectorRegistry(auto_describe=False)
_registry.register(FleetCollector())


def metrics_view(request):
    token = settings.METRICS_TOKEN
    if token:
        given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(given.encode(), token.encode()):
            return HttpResponse("metrics need the METRICS_TOKEN bearer token\n", status=401,
                                content_type="text/plain", headers={"WWW-Authenticate": "Bearer"})
    elif not settings.DEBUG:
        return HttpResponse("metrics are off: set METRICS_TOKEN and scrape with it as a bearer token\n",
                            status=403, content_type="text/plain")
    body = generate_latest(_registry) + dcgm_text().encode()
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
