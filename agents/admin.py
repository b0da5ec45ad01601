from __future__ import annotations

from django.contrib import admin, messages
from django.utils import timezone

from agents.models import BootstrapToken, Gpu, Host
from agents.services import bootstrap_token_prepare, bootstrap_token_record


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
    readonly_fields = ["token_hash", "last_heartbeat_at", "last_seq", "down_since", "used_vcpus",
                       "used_memory_mib"]
    inlines = [GpuInline]


@admin.register(Gpu)
class GpuAdmin(admin.ModelAdmin):
    list_display = ["uuid", "host", "index", "gpu_model", "healthy", "whole", "used_milli", "utilisation"]
    list_filter = ["gpu_model", "healthy", "whole", "host__region"]
    search_fields = ["uuid", "host__name"]
    list_select_related = ["host", "gpu_model"]
    # Booking counters are the scheduler's; operators change health, not bookings.
    readonly_fields = ["whole", "used_milli", "utilisation", "memory_used_mib", "idle_since", "sampled_at"]


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
