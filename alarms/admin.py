from __future__ import annotations

from django.contrib import admin

from alarms.models import Alarm, AlarmAction, AlarmHistory


@admin.register(Alarm)
class AlarmAdmin(admin.ModelAdmin):
    list_display = ["name", "tenant", "target_kind", "metric", "state", "state_changed_at", "enabled"]
    list_filter = ["state", "target_kind", "enabled"]
    search_fields = ["name", "tenant__slug", "target_id"]
    exclude = ["webhook_secret_sealed"]  # never shown, even sealed
    readonly_fields = ["state", "state_reason", "state_changed_at", "datapoints", "samples", "last_evaluated_at"]


@admin.register(AlarmHistory)
class AlarmHistoryAdmin(admin.ModelAdmin):
    list_display = ["alarm", "created_at", "old_state", "new_state"]
    list_filter = ["new_state"]
    readonly_fields = ["alarm", "created_at", "old_state", "new_state", "reason", "datapoints"]


@admin.register(AlarmAction)
class AlarmActionAdmin(admin.ModelAdmin):
    list_display = ["alarm", "type", "status", "attempts", "next_attempt_at", "last_error"]
    list_filter = ["status", "type"]
    readonly_fields = ["alarm", "history", "type", "action", "payload", "attempts", "outcome", "finished_at"]
