"""Operators' view of volumes: where each lives, what uses it, and which need moving off a
draining host (filter "needs a move"). Moving a volume's data between hosts is not built:
see docs/volumes.md for the manual procedure."""
from __future__ import annotations

from django.contrib import admin

from agents.choices import AdminState
from gpucloud.tenancy.admin import OperatorAdmin
from volumes.models import StoragePrice, Volume, VolumeEvent


class NeedsMoveFilter(admin.SimpleListFilter):
    title = "needs a move"
    parameter_name = "needs_move"

    def lookups(self, request, model_admin):
        return [("yes", "Yes: its host is draining")]

    def queryset(self, request, queryset):
        if self.value() == "yes":
            return queryset.filter(purged_at__isnull=True, host__admin_state=AdminState.DRAINING)
        return queryset


class VolumeEventInline(admin.TabularInline):
    model = VolumeEvent
    extra = 0
    can_delete = False
    readonly_fields = ["created_at", "kind", "message"]


@admin.register(Volume)
class VolumeAdmin(OperatorAdmin):
    list_display = ["name", "tenant", "region", "size_gib", "host", "host_state", "used_bytes", "deleted_at",
                    "purged_at"]
    list_filter = [NeedsMoveFilter, "region", "host"]
    search_fields = ["name", "id", "tenant__name", "host__name"]
    readonly_fields = ["id", "tenant", "region", "host", "used_bytes", "measured_at", "over_size_since",
                       "created_by", "created_at", "updated_at", "deleted_at", "purged_at"]
    fields = ["name", "size_gib", *readonly_fields]
    inlines = [VolumeEventInline]
    list_select_related = ["tenant", "region", "host"]

    @admin.display(description="host state")
    def host_state(self, obj):
        if obj.host is None:
            return "—"
        if obj.host.admin_state == AdminState.DRAINING and obj.purged_at is None:
            return "draining: needs a move"
        return obj.host.get_state_display()

    def has_add_permission(self, request):
        return False  # tenants create volumes (quota, audit); operators look and resize

    def has_delete_permission(self, request, obj=None):
        return False  # deletion is the tenant's two-step delete, never a cascade from here


@admin.register(StoragePrice)
class StoragePriceAdmin(OperatorAdmin):
    list_display = ["region", "per_gib_hour", "currency", "effective_from"]
    list_filter = ["region"]
