from __future__ import annotations

from django.contrib import admin, messages
from django.utils import timezone

from agents.models import BootstrapToken, ContainerLog, Gpu, GpuSample, GpuSampleMinute, Host
from agents.services import (
    bootstrap_token_prepare,
    bootstrap_token_record,
    gpu_mark_healthy,
    host_cordon,
    host_drain,
    host_uncordon,
)


class GpuInline(admin.TabularInline):
    model = Gpu
    extra = 0
    fields = ["uuid", "index", "gpu_model", "healthy", "unhealthy_reason", "unhealthy_since",
              "whole", "used_milli", "utilisation", "sampled_at"]
    readonly_fields = fields
    can_delete = False


@admin.register(Host)
class HostAdmin(admin.ModelAdmin):
    list_display = ["name", "region", "state", "admin_state", "vcpus", "used_vcpus", "memory_mib",
                    "last_heartbeat_at"]
    list_filter = ["state", "admin_state", "region"]
    search_fields = ["name", "id"]
    list_select_related = ["region"]
    # State changes go through the actions (services), never through the form.
    readonly_fields = ["state", "admin_state", "token_hash", "last_heartbeat_at", "last_seq",
                       "down_since", "used_vcpus", "used_memory_mib"]
    inlines = [GpuInline]
    actions = ["cordon", "drain", "uncordon"]

    @admin.action(description="Cordon: take no new work")
    def cordon(self, request, queryset):
        for host in queryset:
            host_cordon(host=host)
        self.message_user(request, f"{len(queryset)} host(s) cordoned.")

    @admin.action(description="Drain: no new work, requeue batch jobs, instances run to their end")
    def drain(self, request, queryset):
        jobs = 0
        for host in queryset:
            jobs += len(host_drain(host=host)[1])
        self.message_user(request, f"{len(queryset)} host(s) draining; {jobs} job(s) requeued.")

    @admin.action(description="Uncordon: take new work again")
    def uncordon(self, request, queryset):
        for host in queryset:
            host_uncordon(host=host)
        self.message_user(request, f"{len(queryset)} host(s) ready for new work.")


@admin.register(Gpu)
class GpuAdmin(admin.ModelAdmin):
    list_display = ["uuid", "host", "index", "gpu_model", "healthy", "unhealthy_reason", "whole",
                    "used_milli", "utilisation"]
    list_filter = ["gpu_model", "healthy", "whole", "host__region"]
    search_fields = ["uuid", "host__name"]
    list_select_related = ["host", "gpu_model"]
    # Booking counters are the scheduler's; health changes through the action (audited).
    readonly_fields = ["healthy", "unhealthy_reason", "unhealthy_since", "ecc_uncorrected", "whole",
                       "used_milli", "utilisation", "memory_used_mib", "idle_since", "sampled_at"]
    actions = ["mark_healthy"]

    @admin.action(description="Mark healthy (repaired): take new work again")
    def mark_healthy(self, request, queryset):
        n = 0
        for gpu in queryset.filter(healthy=False):
            gpu_mark_healthy(gpu=gpu)
            n += 1
        self.message_user(request, f"{n} GPU(s) marked healthy.")


@admin.register(BootstrapToken)
class BootstrapTokenAdmin(admin.ModelAdmin):
    """Operators mint a token per new host; the secret appears once, in a message."""

    list_display = ["prefix", "region", "note", "created_at", "created_by", "expires_at", "used_at",
                    "host"]
    list_filter = ["region", ("used_at", admin.EmptyFieldListFilter)]
    search_fields = ["prefix", "note", "host__name"]
    list_select_related = ["region", "created_by", "host"]
    fields = ["region", "note", "expires_at", "prefix", "created_at", "created_by", "used_at",
              "host"]
    readonly_fields = ["prefix", "created_at", "created_by", "used_at", "host"]
    actions = ["expire_now"]

    def get_readonly_fields(self, request, obj=None):
        # A token's region is what it admits to; changing it afterwards would be a new token.
        return self.readonly_fields + (["region"] if obj is not None else [])

    def save_model(self, request, obj, form, change):
        if change:
            return super().save_model(request, obj, form, change)
        obj.created_by = request.user
        secret = bootstrap_token_prepare(token=obj)
        super().save_model(request, obj, form, change)
        bootstrap_token_record(token=obj)
        messages.warning(
            request,
            f"Bootstrap token for {obj.region} (shown only now; it admits one host): {secret}  — "
            f"python -m agents.host --server <this URL> --bootstrap-token {secret}",
        )

    @admin.action(description="Expire the selected unused tokens now")
    def expire_now(self, request, queryset):
        n = queryset.filter(used_at__isnull=True).update(expires_at=timezone.now())
        self.message_user(request, f"{n} token(s) expired.")


class _ReadOnlyAdmin(admin.ModelAdmin):
    """Measurements written by heartbeats: to look at, never to edit."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(GpuSample)
class GpuSampleAdmin(_ReadOnlyAdmin):
    list_display = ["gpu", "time", "gpu_util", "mem_util", "mem_used_mib", "temperature_c",
                    "power_w"]
    search_fields = ["gpu__uuid"]
    date_hierarchy = "time"
    show_full_result_count = False  # the table is large; counting it is not free


@admin.register(GpuSampleMinute)
class GpuSampleMinuteAdmin(_ReadOnlyAdmin):
    list_display = ["gpu", "minute", "samples", "gpu_util", "mem_util", "temperature_c", "power_w"]
    search_fields = ["gpu__uuid"]
    show_full_result_count = False


@admin.register(ContainerLog)
class ContainerLogAdmin(_ReadOnlyAdmin):
    list_display = ["workload", "host", "attempt_id", "captured_at", "requested_at"]
    search_fields = ["attempt_id"]
    list_select_related = ["workload", "host"]
