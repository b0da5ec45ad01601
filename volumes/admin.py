"""Operators' view of volumes: where each lives, what uses it, and which need moving off a
draining host (filter "needs a move"), and the action that moves a detached volume to another
host through the agents (volumes/moves.py; also `manage.py volume_move`)."""
from __future__ import annotations

from django.contrib import admin, messages

from agents.choices import AdminState
from gpucloud.lib.errors import ServiceError
from gpucloud.tenancy.admin import OperatorAdmin
from volumes import moves, selectors
from volumes.models import StoragePrice, Volume, VolumeEvent, VolumeMove


class NeedsMoveFilter(admin.SimpleListFilter):
    title = "needs a move"
    parameter_name = "needs_move"

    def lookups(self, request, model_admin):
        return [("yes", "Yes: its host is draining")]

    def queryset(self, request, queryset):
        if self.value() == "yes":
            return queryset.filter(purged_at__isnull=True, host__admin_state=AdminState.DRAINING)
        return queryset


class VolumeMoveInline(admin.TabularInline):
    model = VolumeMove
    fk_name = "volume"
    extra = 0
    can_delete = False
    fields = readonly_fields = ["created_at", "source", "target", "state", "size_bytes", "error", "finished_at",
                                "source_removed_at"]

    def has_add_permission(self, request, obj=None):
        return False


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
    inlines = [VolumeMoveInline, VolumeEventInline]
    actions = ["move_to_another_host", "cancel_move"]
    list_select_related = ["tenant", "region", "host"]

    @admin.display(description="host state")
    def host_state(self, obj):
        if obj.host is None:
            return "—"
        if obj.host.admin_state == AdminState.DRAINING and obj.purged_at is None:
            return "draining: needs a move"
        return obj.host.get_state_display()

    @admin.action(description="Move to another host of its region (the ready host with the fewest volumes)")
    def move_to_another_host(self, request, queryset):
        for volume in queryset.select_related("host"):
            target = moves.pick_target(volume)
            if target is None:
                self.message_user(request, f"{volume.name}: no other ready host in {volume.region}.", messages.ERROR)
                continue
            try:
                moves.move_start(volume=volume, target=target, user=request.user)
            except ServiceError as e:
                self.message_user(request, f"{volume.name}: {e.message}", messages.ERROR)
                continue
            self.message_user(request, f"{volume.name}: moving from {volume.host} to {target.name}; the agents copy "
                                       "it, it stays on its host until the copy is checked.")

    @admin.action(description="Cancel its move (the volume stays where it is)")
    def cancel_move(self, request, queryset):
        for volume in queryset:
            move = selectors.open_move(volume.pk)
            if move is not None:
                moves.move_cancel(move=move)
                self.message_user(request, f"{volume.name}: move cancelled.")

    def has_add_permission(self, request):
        return False  # tenants create volumes (quota, audit); operators look and resize

    def has_delete_permission(self, request, obj=None):
        return False  # deletion is the tenant's two-step delete, never a cascade from here


@admin.register(StoragePrice)
class StoragePriceAdmin(OperatorAdmin):
    list_display = ["region", "per_gib_hour", "currency", "effective_from"]
    list_filter = ["region"]
