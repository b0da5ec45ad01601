from __future__ import annotations

from django.contrib import admin

from agents.models import Gpu, Host


class GpuInline(admin.TabularInline):
    model = Gpu
    extra = 0
    fields = ["uuid", "index", "gpu_model", "healthy", "whole", "used_milli", "utilisation", "sampled_at"]
    readonly_fields = fields
    can_delete = False


@admin.register(Host)
class HostAdmin(admin.ModelAdmin):
    list_display = ["name", "region", "state", "vcpus", "used_vcpus", "memory_mib", "last_heartbeat_at"]
    list_filter = ["state", "region"]
    search_fields = ["name", "id"]
    list_select_related = ["region"]
    readonly_fields = ["token_hash", "last_heartbeat_at", "used_vcpus", "used_memory_mib"]
    inlines = [GpuInline]


@admin.register(Gpu)
class GpuAdmin(admin.ModelAdmin):
    list_display = ["uuid", "host", "index", "gpu_model", "healthy", "whole", "used_milli", "utilisation"]
    list_filter = ["gpu_model", "healthy", "whole", "host__region"]
    search_fields = ["uuid", "host__name"]
    list_select_related = ["host", "gpu_model"]
    # Booking counters are the scheduler's; operators change health, not bookings.
    readonly_fields = ["whole", "used_milli", "utilisation", "memory_used_mib", "idle_since", "sampled_at"]
