"""What agents show of the tenants' workloads: their GPUs' metrics and log tails on the
workloads' own resources (registered in `AgentsConfig.ready()`, scheduler/api/contributors.py),
and GET /api/v1/metrics, one series of one workload for charts.
"""
from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.response import Response

from agents import selectors
from agents.api import serializers as s
from agents.services.logs import LogTail, workload_logs_request
from gpucloud.api.views import ApiView, TenantMixin
from gpucloud.tenancy import permissions as perms
from scheduler.models import Workload
from scheduler.selectors import workload_get


def gpu_metrics(*, workload: Workload, query: dict[str, Any]) -> dict[str, Any]:
    """`.../metrics`: GPU utilisation, memory, temperature and power of its GPUs, per step."""
    q = s.MetricsQuerySerializer(data=query)
    q.is_valid(raise_exception=True)
    return selectors.workload_metrics(workload=workload, **q.validated_data)


def logs(*, workload: Workload, query: dict[str, Any]) -> LogTail:
    """`.../logs`: the latest stored tail; while it runs, a fresh one is asked of the host's agent."""
    q = s.LogsQuerySerializer(data=query)
    q.is_valid(raise_exception=True)
    return workload_logs_request(workload=workload, tail=q.validated_data["tail"])


class SeriesApi(TenantMixin, ApiView):
    """One metric of one of your workloads over time, for charts (the console's, yours)."""

    permission_map = {"get": perms.WORKLOADS_READ}

    @extend_schema(
        parameters=[
            OpenApiParameter("workload", OpenApiTypes.UUID, required=True,
                             description="the id of one of your instances or jobs"),
            OpenApiParameter("metric", str, required=True,
                             enum=["gpu_util", "gpu_mem_used", "gpu_temp", "power", "cost_rate"]),
            OpenApiParameter("stat", str, enum=["avg", "max", "min", "p95"],
                             description="per step over its GPUs' samples (default avg); not for cost_rate"),
            OpenApiParameter("from", OpenApiTypes.DATETIME,
                             description="ISO 8601; default: an hour before `to`"),
            OpenApiParameter("to", OpenApiTypes.DATETIME, description="ISO 8601; default: now"),
            OpenApiParameter("step", int, description="seconds per point, 5..86400 (default 60); "
                             "at most 1440 points"),
        ],
        responses=s.SeriesSerializer, operation_id="metrics_retrieve",
    )
    def get(self, request):
        q = s.SeriesQuerySerializer(data=request.query_params.dict())
        q.is_valid(raise_exception=True)
        d = q.validated_data
        workload = workload_get(tenant=self.tenant, pk=d["workload"])
        data = selectors.workload_series(workload=workload, metric=d["metric"], stat=d["stat"],
                                         start=d["from"], end=d["to"], step=d["step"])
        return Response(s.SeriesSerializer(data).data)
