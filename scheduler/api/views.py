"""Instances and batch jobs: launch, list, inspect, stop, start (instances), delete."""
from __future__ import annotations

import django_filters
from django.db import transaction
from drf_spectacular.utils import OpenApiParameter, PolymorphicProxySerializer, extend_schema, extend_schema_view
from rest_framework import mixins, serializers, status
from rest_framework.decorators import action
from rest_framework.response import Response

from gpucloud.api.serializers import rendered, validated
from gpucloud.api.views import TenantViewSet
from gpucloud.tenancy import permissions as perms
from scheduler import arrays, selectors, services
from scheduler.api import contributors
from scheduler.api import serializers as s
from scheduler.choices import PriorityClass, State, WorkloadKind
from scheduler.models import JobArray, Workload


class WorkloadFilter(django_filters.FilterSet):
    state = django_filters.MultipleChoiceFilter(choices=State.choices)
    priority = django_filters.ChoiceFilter(choices=PriorityClass.choices)
    name = django_filters.CharFilter(lookup_expr="icontains", max_length=100)

    class Meta:
        model = Workload
        fields = ["state", "priority", "name", "billing"]


class _WorkloadViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.DestroyModelMixin,
                       TenantViewSet):
    kind: str
    create_serializer: type
    detail_serializer: type
    filterset_class = WorkloadFilter
    ordering_fields = ["created_at", "state", "name"]
    permission_map = {
        "list": perms.WORKLOADS_READ, "retrieve": perms.WORKLOADS_READ,
        "create": perms.WORKLOADS_LAUNCH, "stop": perms.WORKLOADS_MANAGE,
        "destroy": perms.WORKLOADS_MANAGE, "metrics": perms.WORKLOADS_READ,
        "logs": perms.WORKLOADS_READ,
    }

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Workload.objects.none()
        select = selectors.workload_detail_list if self.action == "retrieve" else selectors.workload_list
        return select(tenant=self.tenant, kind=self.kind)

    def get_serializer_class(self):
        return self.detail_serializer if self.action in ("retrieve", "stop") else self.serializer_class

    def _detail(self, workload: Workload, code: int = status.HTTP_200_OK) -> Response:
        fresh = selectors.workload_detail_list(tenant=self.tenant, kind=self.kind).get(pk=workload.pk)
        return Response(self.detail_serializer(fresh).data, status=code)

    def create(self, request, *args, **kwargs):
        data = validated(self.create_serializer, request.data)  # the fields built once per thread
        array = data.pop("array", None)  # jobs only: a job array (scheduler/arrays.py)
        if array is not None:
            spec = services.WorkloadSpec(kind=self.kind, **data)
            arr = arrays.job_array_launch(tenant=self.tenant, spec=spec, count=array["count"], user=request.user)
            return Response(array_data(arr, detail=True), status=status.HTTP_201_CREATED)
        spec = services.WorkloadSpec(kind=self.kind, **data)
        # the tenant row was read by this request's authentication: its billing flag is as fresh
        workload = services.workload_launch(tenant=self.tenant, spec=spec, user=request.user, tenant_fresh=True)
        return self._launched(workload)

    def _launched(self, workload: Workload) -> Response:
        """The 201 answer, from what the launch wrote and read (its event, the price in force):
        what `_detail` would read back (tests/scheduler/test_submission_path.py compares them)."""
        workload.active_allocations = []  # PENDING holds nothing
        workload.never_ran = True  # nor held anything before: no "ran on" to read
        workload._prefetched_objects_cache = {"events": [workload.launch_event], "container_events": []}
        costs = {workload.pk: contributors.launch_cost(workload=workload, per_hour=workload.launch_price)}
        return Response(rendered(self.detail_serializer, workload, _costs=costs), status=status.HTTP_201_CREATED)

    @extend_schema(request=None)
    @action(detail=True, methods=["post"])
    def stop(self, request, *args, **kwargs):
        """Stop it: queued work is cancelled, running work stops (its GPUs are freed)."""
        # One transaction: the answer is read while the stop holds the row lock, so a DELETE
        # racing it cannot remove the row between the stop and the answer.
        with transaction.atomic():
            workload = services.workload_stop(workload=self.get_object())
            return self._detail(workload)

    @extend_schema(
        parameters=[
            OpenApiParameter("since", str, description="ISO 8601; default: an hour ago"),
            OpenApiParameter("step", int, description="seconds per point (5..86400, default 60)"),
        ],
        responses=s.MetricsSerializer,
    )
    @action(detail=True, methods=["get"])
    def metrics(self, request, *args, **kwargs):
        """GPU utilisation, memory, temperature and power of its GPUs, per step, and their mean."""
        workload = self.get_object()
        data = contributors.gpu_metrics(workload=workload, query=request.query_params.dict())
        return Response(s.MetricsSerializer(data).data)

    @extend_schema(
        parameters=[OpenApiParameter("tail", int, description="lines (1..10000, default 100)")],
        responses=s.LogsSerializer,
    )
    @action(detail=True, methods=["get"])
    def logs(self, request, *args, **kwargs):
        """The latest stored tail of its container's log. While it runs, each call also asks
        the host's agent for a fresh tail, stored after its next heartbeat (`pending`)."""
        workload = self.get_object()
        tail = contributors.logs(workload=workload, query=request.query_params.dict())
        return Response(s.LogsSerializer(tail).data)

    def destroy(self, request, *args, **kwargs):
        """Terminate: stop it if needed and remove it from your lists (billing keeps its history)."""
        services.workload_delete(workload=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


@extend_schema_view(create=extend_schema(
    request=s.WorkloadCreateSerializer, responses={201: s.InstanceDetailSerializer},
    description="Launch an instance. It answers at once with state `pending`; the scheduler places it.",
))
class InstanceViewSet(_WorkloadViewSet):
    """Interactive GPU instances: rented until you terminate them; stopped and started at will."""

    kind = WorkloadKind.INSTANCE
    serializer_class = s.WorkloadSerializer
    detail_serializer = s.InstanceDetailSerializer
    create_serializer = s.WorkloadCreateSerializer
    permission_map = {**_WorkloadViewSet.permission_map, "start": perms.WORKLOADS_MANAGE}

    def get_serializer_class(self):
        return self.detail_serializer if self.action == "start" else super().get_serializer_class()

    @extend_schema(request=None, responses={200: s.InstanceDetailSerializer})
    @action(detail=True, methods=["post"])
    def start(self, request, *args, **kwargs):
        """Start a stopped instance again: it goes back through the queue (state `pending`) with
        the same configuration. `409 not_stopped` unless it is `stopped`; refused as a launch is
        (`409 unsatisfiable`, quota, credit)."""
        with transaction.atomic():
            workload = services.workload_start(workload=self.get_object())
            return self._detail(workload)


class JobFilter(WorkloadFilter):
    array = django_filters.UUIDFilter(field_name="array_id", help_text="only the tasks of this job array")
    in_array = django_filters.BooleanFilter(field_name="array", lookup_expr="isnull", exclude=True,
                                            help_text="true: only array tasks; false: only jobs outside arrays")

    class Meta(WorkloadFilter.Meta):
        fields = [*WorkloadFilter.Meta.fields, "array", "in_array"]


@extend_schema_view(create=extend_schema(
    request=s.JobCreateSerializer,
    responses={201: PolymorphicProxySerializer(
        component_name="JobOrJobArray", serializers=[s.JobDetailSerializer, s.JobArrayDetailSerializer],
        resource_type_field_name=None)},
    description="Submit a batch job. It answers at once with state `pending`; the scheduler places it. "
                "With `array` it submits that many tasks as one job array and answers with the array.",
))
class JobViewSet(_WorkloadViewSet):
    """Batch jobs: run to completion, retried up to `max_retries`, optionally on several hosts."""

    kind = WorkloadKind.JOB
    filterset_class = JobFilter
    serializer_class = s.JobSerializer
    detail_serializer = s.JobDetailSerializer
    create_serializer = s.JobCreateSerializer


def array_data(arr: JobArray, *, detail: bool = False) -> dict:
    """The array as `JobArraySerializer` / `JobArrayDetailSerializer` render it, without a
    serializer per task (an array has up to 10,000)."""
    counts = arrays.task_counts(array_ids=[arr.pk])[arr.pk]
    return _array_dict(arr, counts, detail=detail)


def _array_dict(arr: JobArray, counts, *, detail: bool) -> dict:
    data = {"id": str(arr.pk), "name": arr.name, "count": arr.count, "state": arrays.array_state(counts),
            "counts": {k: n for k, n in sorted(counts.items()) if n},
            "created_at": serializers.DateTimeField().to_representation(arr.created_at)}
    if detail:
        data["tasks"] = [{"index": i, "id": str(pk), "state": st, "exit_code": code}
                         for i, pk, st, code in selectors.job_array_tasks(array=arr)]
    return data


class JobArrayViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantViewSet):
    """Job arrays: many tasks of one job submitted at once (`POST /api/v1/jobs` with `array`)."""

    serializer_class = s.JobArraySerializer
    ordering_fields = ["created_at", "name"]
    permission_map = {"list": perms.WORKLOADS_READ, "retrieve": perms.WORKLOADS_READ,
                      "stop": perms.WORKLOADS_MANAGE}

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return JobArray.objects.none()
        return selectors.job_array_list(tenant=self.tenant)

    def get_serializer_class(self):
        return s.JobArrayDetailSerializer if self.action in ("retrieve", "stop") else s.JobArraySerializer

    def list(self, request, *args, **kwargs):
        """Your job arrays, newest first, each with its tasks counted by state."""
        page = self.paginate_queryset(self.filter_queryset(self.get_queryset()))
        items = list(page if page is not None else self.filter_queryset(self.get_queryset()))
        counts = arrays.task_counts(array_ids=[a.pk for a in items])
        data = [_array_dict(a, counts[a.pk], detail=False) for a in items]
        return self.get_paginated_response(data) if page is not None else Response(data)

    def retrieve(self, request, *args, **kwargs):
        """One array with the state of every task, by index."""
        return Response(array_data(self.get_object(), detail=True))

    @extend_schema(request=None)
    @action(detail=True, methods=["post"])
    def stop(self, request, *args, **kwargs):
        """Stop the whole array: queued tasks are cancelled, running ones stop (their GPUs are freed)."""
        arr = self.get_object()
        arrays.job_array_stop(array=arr)
        return Response(array_data(arr, detail=True))
