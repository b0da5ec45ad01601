from __future__ import annotations

from django.contrib import admin
from django.db.models import Prefetch

from gpucloud.tenancy.admin import OperatorAdmin
from scheduler.models import (
    Allocation,
    ContainerEvent,
    GangPart,
    JobArray,
    RegionSchedulerSettings,
    Workload,
    WorkloadEvent,
)


class EventInline(admin.TabularInline):
    model = WorkloadEvent
    extra = 0
    can_delete = False
    fields = ["created_at", "from_state", "to_state", "reason", "actor"]
    readonly_fields = fields


@admin.register(Workload)
class WorkloadAdmin(OperatorAdmin):
    list_display = [
        "name",
        "kind",
        "tenant",
        "state",
        "instance_type",
        "region",
        "host",
        "priority",
        "billing",
        "created_at",
        "reason",
    ]
    list_filter = ["kind", "state", "priority", "billing", "region", "instance_type__gpu_model"]
    search_fields = ["name", "id", "tenant__name", "tenant__slug", "allocations__host__name"]
    list_select_related = ["tenant", "instance_type", "region"]

    def get_queryset(self, request):
        # the hosts of the page's rows in one more query, not one per row
        return super().get_queryset(request).prefetch_related(Prefetch(
            "allocations", queryset=Allocation.objects.filter(active=True).select_related("host"),
            to_attr="active_allocations"))

    @admin.display(description="host")
    def host(self, w: Workload) -> str:
        """Where it runs now (a gang: each host once); empty while it holds no GPU."""
        return ", ".join(dict.fromkeys(a.host.name for a in getattr(w, "active_allocations", [])))
    date_hierarchy = "created_at"
    inlines = [EventInline]
    # State changes go through the lifecycle services, never a form.
    readonly_fields = [
        "state",
        "reason",
        "queue_position",
        "started_at",
        "ended_at",
        "stop_by",
        "stop_cause",
        "preempted_for",
        "retries",
        "exit_code",
        "deleted_at",
    ]


@admin.register(Allocation)
class AllocationAdmin(OperatorAdmin):
    list_display = ["gpu", "host", "workload", "milli", "active", "created_at", "released_at"]
    list_filter = ["active", "host__region"]
    search_fields = ["gpu__uuid", "host__name", "workload__name"]
    list_select_related = ["gpu", "host", "workload"]

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(WorkloadEvent)
class WorkloadEventAdmin(OperatorAdmin):
    list_display = ["created_at", "workload", "from_state", "to_state", "reason", "actor"]
    list_filter = ["to_state"]
    search_fields = ["workload__name", "reason"]
    list_select_related = ["workload"]

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(ContainerEvent)
class ContainerEventAdmin(OperatorAdmin):
    """Containers lost or restarted behind their agents' backs: read-only, as the log it is."""

    list_display = ["created_at", "workload", "kind", "count", "detail"]
    list_filter = ["kind"]
    search_fields = ["workload__name", "detail"]
    list_select_related = ["workload"]

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(RegionSchedulerSettings)
class RegionSchedulerSettingsAdmin(OperatorAdmin):
    list_display = ["region", "policy", "mode", "notice_s", "reclaim_idle_util", "reclaim_idle_s", "preempt_cap"]
    search_fields = ["region__code"]


@admin.register(JobArray)
class JobArrayAdmin(OperatorAdmin):
    list_display = ["name", "tenant", "count", "created_at"]
    search_fields = ["name", "id", "tenant__name", "tenant__slug"]
    list_select_related = ["tenant"]


@admin.register(GangPart)
class GangPartAdmin(OperatorAdmin):
    """Each part of a multi-host job as its host reported it (the gang rule reads them: scheduler/gang.py)."""

    list_display = ["workload", "attempt_id", "host", "state", "exit_code", "updated_at"]
    list_filter = ["state"]
    search_fields = ["workload__name", "attempt_id", "host__name"]
    list_select_related = ["workload", "host"]

    def has_change_permission(self, request, obj=None):
        return False
