"""Autoscaling groups (a launch template, min/max/desired), their members, scaling policies,
scheduled actions and activity history. docs/autoscaling.md tells how they behave."""
from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models import F, Q
from django.utils.timezone import now

from autoscaling.choices import ActivityKind, AdjustmentType, PolicyKind, PolicyMetric
from gpucloud.catalogue.models import InstanceType, Region
from gpucloud.tenancy.models import Tenant, TenantOwnedQuerySet
from scheduler.models import Workload

MAX_GROUP_SIZE = 100


class AutoscalingGroup(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="autoscaling_groups")
    name = models.CharField(max_length=60)
    # the launch template: what each member instance is launched with
    instance_type = models.ForeignKey(InstanceType, on_delete=models.PROTECT, related_name="+")
    region = models.ForeignKey(Region, on_delete=models.PROTECT, related_name="+")
    image = models.CharField(max_length=500)
    command = models.JSONField(default=list, blank=True)
    env = models.JSONField(default=dict, blank=True)
    ports = models.JSONField(default=list, blank=True)
    ssh_keys = models.JSONField(default=list, blank=True)
    on_demand_base = models.PositiveIntegerField(default=0, help_text="the first members, on demand")
    on_demand_percent = models.PositiveSmallIntegerField(
        default=100, help_text="percent of the members above the base launched on demand; the rest spot")
    # capacity
    min_size = models.PositiveIntegerField(default=0)
    max_size = models.PositiveIntegerField(default=1)
    desired = models.PositiveIntegerField(default=0)
    warmup_s = models.PositiveIntegerField(default=120, help_text="a new member's metrics are ignored this long")
    cooldown_s = models.PositiveIntegerField(default=300, help_text="batch pools: wait this long to shrink")
    # batch pool: the job queue whose demand sets desired (empty: not a pool)
    job_queue = models.CharField(max_length=64, blank=True)
    last_scale_out_at = models.DateTimeField(null=True, blank=True)
    last_scale_in_at = models.DateTimeField(null=True, blank=True)
    reconciled_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=now)
    updated_at = models.DateTimeField(auto_now=True)

    objects = TenantOwnedQuerySet.as_manager()

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="asg_name_per_tenant"),
            models.CheckConstraint(condition=Q(min_size__lte=F("desired")) & Q(desired__lte=F("max_size")),
                                   name="asg_desired_within"),
            models.CheckConstraint(condition=Q(max_size__lte=MAX_GROUP_SIZE), name="asg_max_size"),
            models.CheckConstraint(condition=Q(on_demand_percent__lte=100), name="asg_on_demand_percent"),
        ]

    def __str__(self) -> str:
        return self.name


class GroupMember(models.Model):
    """An instance of a group. Detached when it ended or was scaled in: the instance stays
    an ordinary instance (billing, history) but no longer counts."""

    group = models.ForeignKey(AutoscalingGroup, on_delete=models.CASCADE, related_name="members")
    workload = models.OneToOneField(Workload, on_delete=models.CASCADE, related_name="group_member")
    billing = models.CharField(max_length=10)
    protected = models.BooleanField(default=False, help_text="never removed by scale-in")
    launched_at = models.DateTimeField(default=now)
    detached_at = models.DateTimeField(null=True, blank=True)
    detach_reason = models.CharField(max_length=500, blank=True)

    class Meta:
        ordering = ["launched_at", "id"]
        indexes = [models.Index(fields=["group"], condition=Q(detached_at__isnull=True), name="asg_member_live")]

    def __str__(self) -> str:
        return f"{self.group_id}: {self.workload_id}"


class ScalingPolicy(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # the group's tenant, kept here so reads go through `for_tenant` like every tenant-owned row
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    group = models.ForeignKey(AutoscalingGroup, on_delete=models.CASCADE, related_name="policies")
    name = models.CharField(max_length=60)
    kind = models.CharField(max_length=20, choices=PolicyKind.choices)
    enabled = models.BooleanField(default=True)
    # target tracking
    metric = models.CharField(max_length=40, choices=PolicyMetric.choices, blank=True)
    target = models.FloatField(null=True, blank=True)
    queue = models.CharField(max_length=64, blank=True, help_text="queue_backlog_per_instance: the job queue")
    window_s = models.PositiveIntegerField(default=180)
    scale_out_cooldown_s = models.PositiveIntegerField(default=60)
    scale_in_cooldown_s = models.PositiveIntegerField(default=300)
    max_step = models.PositiveIntegerField(default=10)
    disable_scale_in = models.BooleanField(default=False)
    # step scaling
    adjustment_type = models.CharField(max_length=30, choices=AdjustmentType.choices, blank=True)
    steps = models.JSONField(default=list, blank=True)
    cooldown_s = models.PositiveIntegerField(default=300)
    last_run_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=now)

    objects = TenantOwnedQuerySet.as_manager()

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [models.UniqueConstraint(fields=["group", "name"], name="asg_policy_name")]

    def __str__(self) -> str:
        return f"{self.kind} {self.name}"


class ScheduledAction(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # the group's tenant, kept here so reads go through `for_tenant` like every tenant-owned row
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    group = models.ForeignKey(AutoscalingGroup, on_delete=models.CASCADE, related_name="scheduled_actions")
    name = models.CharField(max_length=60)
    cron = models.CharField(max_length=100, help_text="five fields: minute hour day-of-month month day-of-week")
    timezone = models.CharField(max_length=64, default="UTC")
    min_size = models.PositiveIntegerField(null=True, blank=True)
    max_size = models.PositiveIntegerField(null=True, blank=True)
    desired = models.PositiveIntegerField(null=True, blank=True)
    last_run_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=now)

    objects = TenantOwnedQuerySet.as_manager()

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [models.UniqueConstraint(fields=["group", "name"], name="asg_scheduled_name")]

    def __str__(self) -> str:
        return f"{self.name} ({self.cron} {self.timezone})"


class Activity(models.Model):
    id = models.BigAutoField(primary_key=True)
    group = models.ForeignKey(AutoscalingGroup, on_delete=models.CASCADE, related_name="activities")
    kind = models.CharField(max_length=20, choices=ActivityKind.choices)
    cause = models.CharField(max_length=1000)
    from_desired = models.PositiveIntegerField(null=True, blank=True)
    to_desired = models.PositiveIntegerField(null=True, blank=True)
    instances = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(default=now)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["group", "-created_at"], name="asg_activity_group")]

    def __str__(self) -> str:
        return self.cause
