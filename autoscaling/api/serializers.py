from __future__ import annotations

from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from autoscaling.choices import AdjustmentType, PolicyKind, PolicyMetric
from autoscaling.core import cron_next_fire
from autoscaling.models import MAX_GROUP_SIZE, Activity, AutoscalingGroup, GroupMember, ScalingPolicy, ScheduledAction
from gpucloud.api.serializers import StrictSerializer
from scheduler.api.serializers import WorkloadCreateSerializer

_QUEUE = r"^[a-z0-9][a-z0-9-]*$"
_QUEUE_OR_NONE = r"^([a-z0-9][a-z0-9-]*)?$"  # "" (no batch pool) is allowed, and the schema says so


class GroupCreateSerializer(WorkloadCreateSerializer):
    """The launch template (as an instance's launch body) plus sizes and the billing mix."""

    name = serializers.RegexField(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=60,
                                  help_text="letters, digits, - _ .; members are named <name>-<6 hex>")
    billing = None  # the mix below decides each member's billing
    priority = None
    max_price = None
    auto_stop_idle_minutes = None
    volumes = None  # a volume has one writer: members of a group cannot share one (docs/autoscaling.md)
    on_demand_base = serializers.IntegerField(min_value=0, max_value=MAX_GROUP_SIZE, default=0,
                                              help_text="the first members are on demand")
    on_demand_percent = serializers.IntegerField(
        min_value=0, max_value=100, default=100,
        help_text="percent of the members above the base launched on demand; the rest spot")
    min_size = serializers.IntegerField(min_value=0, max_value=MAX_GROUP_SIZE, default=0)
    max_size = serializers.IntegerField(min_value=0, max_value=MAX_GROUP_SIZE, default=1)
    desired = serializers.IntegerField(min_value=0, max_value=MAX_GROUP_SIZE, required=False,
                                       help_text="default: min_size")
    warmup_s = serializers.IntegerField(min_value=0, max_value=3600, default=120,
                                        help_text="a new member's metrics are ignored this long after it runs")
    cooldown_s = serializers.IntegerField(min_value=0, max_value=86400, default=300,
                                          help_text="batch pools: how long to wait before shrinking again")
    job_queue = serializers.RegexField(_QUEUE_OR_NONE, max_length=64, required=False, allow_blank=True, default="",
                                       help_text="make it a batch pool: desired follows this job queue")


class GroupUpdateSerializer(StrictSerializer):
    name = serializers.RegexField(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=60, required=False)
    image = serializers.CharField(max_length=500, required=False)
    min_size = serializers.IntegerField(min_value=0, max_value=MAX_GROUP_SIZE, required=False)
    max_size = serializers.IntegerField(min_value=0, max_value=MAX_GROUP_SIZE, required=False)
    desired = serializers.IntegerField(min_value=0, max_value=MAX_GROUP_SIZE, required=False)
    on_demand_base = serializers.IntegerField(min_value=0, max_value=MAX_GROUP_SIZE, required=False)
    on_demand_percent = serializers.IntegerField(min_value=0, max_value=100, required=False)
    warmup_s = serializers.IntegerField(min_value=0, max_value=3600, required=False)
    cooldown_s = serializers.IntegerField(min_value=0, max_value=86400, required=False)
    job_queue = serializers.RegexField(_QUEUE_OR_NONE, max_length=64, required=False, allow_blank=True)

    def validate_image(self, value: str) -> str:
        return WorkloadCreateSerializer().validate_image(value)


class GroupMemberSerializer(serializers.ModelSerializer):
    instance = serializers.UUIDField(source="workload_id")
    name = serializers.CharField(source="workload.name")
    state = serializers.CharField(source="workload.state")
    reason = serializers.CharField(source="workload.shown_reason")

    class Meta:
        model = GroupMember
        fields = ["instance", "name", "state", "reason", "billing", "protected", "launched_at"]
        read_only_fields = fields


class GroupSerializer(serializers.ModelSerializer):
    instance_type = serializers.CharField(source="instance_type.code")
    region = serializers.CharField(source="region.code")
    members = serializers.SerializerMethodField(help_text="the members that count (not yet ended or scaled in)")

    class Meta:
        model = AutoscalingGroup
        fields = ["id", "name", "instance_type", "region", "image", "command", "env", "ports", "on_demand_base",
                  "on_demand_percent", "min_size", "max_size", "desired", "warmup_s", "cooldown_s", "job_queue",
                  "members", "last_scale_out_at", "last_scale_in_at", "reconciled_at", "created_at"]
        read_only_fields = fields

    @extend_schema_field(GroupMemberSerializer(many=True))
    def get_members(self, obj) -> list:
        members = getattr(obj, "live_members", None)
        if members is None:
            members = obj.members.filter(detached_at__isnull=True).select_related("workload")
        return GroupMemberSerializer(members, many=True).data


class ProtectionSerializer(StrictSerializer):
    instance = serializers.UUIDField(help_text="a member instance of this group")
    protected = serializers.BooleanField(help_text="true: scale-in never removes it")


class ActivitySerializer(serializers.ModelSerializer):
    class Meta:
        model = Activity
        fields = ["id", "kind", "cause", "from_desired", "to_desired", "instances", "created_at"]
        read_only_fields = fields


class StepSerializer(StrictSerializer):
    lower = serializers.FloatField(required=False, allow_null=True, default=None,
                                   help_text="breach (metric − threshold) at least this; null: unbounded")
    upper = serializers.FloatField(required=False, allow_null=True, default=None,
                                   help_text="breach below this; null: unbounded")
    adjustment = serializers.IntegerField(min_value=-1000, max_value=1000)


class PolicySerializer(serializers.ModelSerializer):
    group = serializers.UUIDField(source="group_id")

    class Meta:
        model = ScalingPolicy
        fields = ["id", "group", "name", "kind", "enabled", "metric", "target", "queue", "window_s",
                  "scale_out_cooldown_s", "scale_in_cooldown_s", "max_step", "disable_scale_in",
                  "adjustment_type", "steps", "cooldown_s", "last_run_at", "created_at"]
        read_only_fields = fields


class PolicyWriteSerializer(StrictSerializer):
    name = serializers.CharField(max_length=60)
    enabled = serializers.BooleanField(required=False)
    metric = serializers.ChoiceField(choices=PolicyMetric.choices, required=False)
    target = serializers.FloatField(min_value=0.01, max_value=1e6, required=False)
    queue = serializers.RegexField(_QUEUE, max_length=64, required=False)
    window_s = serializers.IntegerField(min_value=60, max_value=3600, required=False)
    scale_out_cooldown_s = serializers.IntegerField(min_value=0, max_value=86400, required=False)
    scale_in_cooldown_s = serializers.IntegerField(min_value=0, max_value=86400, required=False)
    max_step = serializers.IntegerField(min_value=1, max_value=MAX_GROUP_SIZE, required=False)
    disable_scale_in = serializers.BooleanField(required=False)
    adjustment_type = serializers.ChoiceField(choices=AdjustmentType.choices, required=False)
    steps = StepSerializer(many=True, required=False, help_text="step scaling: by breach size, first match")
    cooldown_s = serializers.IntegerField(min_value=0, max_value=86400, required=False)

    def validate_steps(self, value: list) -> list:
        if len(value) > 20:
            raise serializers.ValidationError("At most 20 steps.")
        for s in value:
            if s["lower"] is not None and s["upper"] is not None and s["lower"] >= s["upper"]:
                raise serializers.ValidationError("Each step's lower bound is below its upper bound.")
        return value


class PolicyCreateSerializer(PolicyWriteSerializer):
    group = serializers.UUIDField(help_text="one of your autoscaling groups")
    kind = serializers.ChoiceField(choices=PolicyKind.choices)


class PolicyUpdateSerializer(PolicyWriteSerializer):
    name = serializers.CharField(max_length=60, required=False)


class ScheduledActionSerializer(serializers.ModelSerializer):
    group = serializers.UUIDField(source="group_id")
    next_run_at = serializers.SerializerMethodField()

    class Meta:
        model = ScheduledAction
        fields = ["id", "group", "name", "cron", "timezone", "min_size", "max_size", "desired", "last_run_at",
                  "next_run_at", "created_at"]
        read_only_fields = fields

    def get_next_run_at(self, obj) -> str:
        return cron_next_fire(obj.cron, obj.timezone, self.context.get("now") or timezone.now()).isoformat()


class ScheduledWriteSerializer(StrictSerializer):
    name = serializers.CharField(max_length=60, required=False)
    cron = serializers.CharField(max_length=100, required=False,
                                 help_text="minute hour day-of-month month day-of-week, e.g. 0 9 * * 1-5")
    timezone = serializers.CharField(max_length=64, required=False, help_text="IANA, e.g. Europe/Berlin")
    min_size = serializers.IntegerField(min_value=0, max_value=MAX_GROUP_SIZE, required=False, allow_null=True)
    max_size = serializers.IntegerField(min_value=0, max_value=MAX_GROUP_SIZE, required=False, allow_null=True)
    desired = serializers.IntegerField(min_value=0, max_value=MAX_GROUP_SIZE, required=False, allow_null=True)


class ScheduledCreateSerializer(ScheduledWriteSerializer):
    group = serializers.UUIDField(help_text="one of your autoscaling groups")
    name = serializers.CharField(max_length=60)
    cron = serializers.CharField(max_length=100, help_text="minute hour day-of-month month day-of-week")
    timezone = serializers.CharField(max_length=64, default="UTC", help_text="IANA, e.g. Europe/Berlin")
