"""`/metrics` for Prometheus: the fleet and the queue as the database sees them at scrape time.

A collector that runs a few aggregate queries per scrape, so every web process
reports the same truth (no per-process counters to merge). It needs `Authorization:
Bearer <METRICS_TOKEN>`; with no token set it is served only when DEBUG (the laptop demo)
and refused otherwise: fleet size, tenants' queue depth and host names are not public.
"""
from __future__ import annotations

import hmac

from django.conf import settings
from django.db.models import Count, Sum
from django.http import HttpResponse
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST


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
    return HttpResponse(generate_latest(_registry), content_type=CONTENT_TYPE_LATEST)
