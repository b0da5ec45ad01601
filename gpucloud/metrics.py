"""`/metrics` for Prometheus: the fleet, its GPUs and the queue as the database sees them at scrape time.

Three parts, each the same in every web process (no per-process counters to merge):

* `FleetCollector`: a few aggregate queries (workloads, hosts, GPUs, queue waits, metering lag).
* `dcgm_text`: per-GPU series under dcgm-exporter's names and labels (`DCGM_FI_DEV_GPU_UTIL`,
  `DCGM_FI_DEV_FB_USED`, ...; labels `gpu`, `UUID`, `device`, `modelName`, `Hostname`, plus
  `tenant` and `workload` from the active allocations), so dashboards and alerts written for
  DCGM work unchanged. Three queries whatever the fleet size: GPU rows (their last
  measurement), active allocations, and the newest raw sample of each GPU of the last
  `_RECENT_S` (temperature and power, which the GPU row does not keep). Written as text
  directly: at 10,000 GPUs building prometheus_client objects cost more than the queries.
* `gpucloud.lib.promstore`: cycle phases, queue waits at placement, placements,
  preemptions, heartbeats and their latency, webhook deliveries, kept in Redis.

It needs `Authorization: Bearer <METRICS_TOKEN>`; with no token set it is served only when
DEBUG (the laptop demo) and refused otherwise: fleet size, tenants' queue depth and host
names are not public.
"""
from __future__ import annotations

import hmac
import re
from datetime import timedelta

from django.conf import settings
from django.db import connection
from django.db.models import Count, Min, Sum
from django.http import HttpResponse
from django.utils import timezone
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from gpucloud.lib import promstore


class FleetCollector:
    def collect(self):
        from agents.models import Gpu, Host
        from scheduler.models import Workload

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

        from billing.models import MeteringCursor

        lag = GaugeMetricFamily("gpucloud_metering_lag_seconds",
                                "How far behind now the metering run has scanned the transition log")
        cursor = MeteringCursor.objects.filter(name="default").values_list("events_until", flat=True).first()
        if cursor is not None:
            lag.add_metric([], max(0.0, (now - cursor).total_seconds()))
        yield lag
        yield from promstore.collect()


# A GPU's newest raw sample within this window gives its temperature and power (a few heartbeats).
_RECENT_S = 30
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


def _num(v: float) -> str:
    return repr(float(v))


def dcgm_text(now=None) -> str:
    """The per-GPU DCGM series of every GPU with a measurement, in the text exposition format."""
    from agents.models import Gpu, GpuSample
    from scheduler.models import Allocation

    now = now or timezone.now()
    gpus = list(
        Gpu.objects.filter(sampled_at__isnull=False).order_by("host__name", "index")
        .values_list("uuid", "index", "host__name", "gpu_model__name", "memory_mib", "memory_used_mib",
                     "utilisation", "ecc_uncorrected", "unhealthy_reason")
    )
    owners: dict[str, tuple[set[str], set[str]]] = {}
    for gpu, workload, tenant in (Allocation.objects.filter(active=True).order_by()
                                  .values_list("gpu_id", "workload_id", "workload__tenant__slug")):
        t, w = owners.setdefault(gpu, (set(), set()))
        t.add(tenant)
        w.add(str(workload))
    recent: dict[str, tuple[float | None, float | None]] = {}
    table = GpuSample._meta.db_table
    since = now - timedelta(seconds=_RECENT_S)
    with connection.cursor() as cur:
        if connection.vendor == "postgresql":
            cur.execute(f"SELECT DISTINCT ON (gpu_id) gpu_id, temperature_c, power_w FROM {table} "
                        "WHERE time >= %s ORDER BY gpu_id, time DESC", [since])
        else:  # SQLite: the demo's few GPUs; the last row per GPU wins
            cur.execute(f"SELECT gpu_id, temperature_c, power_w FROM {table} WHERE time >= %s ORDER BY time",
                        [since])
        for uuid, temp, power in cur.fetchall():
            recent[uuid] = (temp, power)
    lines: list[list[str]] = [[f"# HELP {name} {doc}\n# TYPE {name} {kind}\n"] for name, doc, kind in _DCGM]
    names = [name for name, _, _ in _DCGM]
    for uuid, index, host, model, mem, used, util, ecc, why in gpus:
        t, w = owners.get(uuid, ((), ()))
        labels = (f'{{gpu="{index}",UUID="{_esc(uuid)}",device="nvidia{index}",modelName="{_esc(model)}",'
                  f'Hostname="{_esc(host)}",tenant="{_esc(",".join(sorted(t)))}",'
                  f'workload="{",".join(sorted(w))}"}} ')
        temp, power = recent.get(uuid, (None, None))
        xid = _XID.match(why)
        values = (util * 100, used, max(0, mem - used), temp, power, int(xid.group(1)) if xid else 0, ecc or 0)
        for out, name, v in zip(lines, names, values, strict=True):
            if v is not None:
                out.append(f"{name}{labels}{_num(v)}\n")
    return "".join(line for out in lines for line in out)


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
