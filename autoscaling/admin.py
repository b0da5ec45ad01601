from __future__ import annotations

from django.contrib import admin

from autoscaling.models import Activity, AutoscalingGroup, GroupMember, ScalingPolicy, ScheduledAction
from gpucloud.tenancy.admin import OperatorAdmin


class MemberInline(admin.TabularInline):
    model = GroupMember
    extra = 0
    can_delete = False
    fields = ["workload", "billing", "protected", "launched_at", "detached_at", "detach_reason"]
    readonly_fields = fields


@admin.register(AutoscalingGroup)
class AutoscalingGroupAdmin(OperatorAdmin):
    list_display = ["name", "tenant", "instance_type", "region", "min_size", "desired", "max_size", "job_queue",
                    "reconciled_at"]
    list_filter = ["region"]
    search_fields = ["name", "tenant__name", "tenant__slug"]
    readonly_fields = ["last_scale_out_at", "last_scale_in_at", "reconciled_at", "created_by", "created_at"]
    inlines = [MemberInline]


@admin.register(GroupMember)
class GroupMemberAdmin(OperatorAdmin):
    list_display = ["workload", "group", "billing", "protected", "launched_at", "detached_at"]
    list_filter = ["billing", "protected"]
    search_fields = ["group__name", "workload__name"]
    raw_id_fields = ["group", "workload"]


@admin.register(ScalingPolicy)
class ScalingPolicyAdmin(OperatorAdmin):
    list_display = ["name", "group", "kind", "metric", "target", "enabled", "last_run_at"]
    list_filter = ["kind", "enabled"]
    search_fields = ["name", "group__name"]
    raw_id_fields = ["group", "tenant"]


@admin.register(ScheduledAction)
class ScheduledActionAdmin(OperatorAdmin):
    list_display = ["name", "group", "cron", "timezone", "min_size", "desired", "max_size", "last_run_at"]
    search_fields = ["name", "group__name"]
    raw_id_fields = ["group", "tenant"]


@admin.register(Activity)
class ActivityAdmin(OperatorAdmin):
    list_display = ["created_at", "group", "kind", "cause"]
    list_filter = ["kind"]
    search_fields = ["cause", "group__name"]
    raw_id_fields = ["group"]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False
