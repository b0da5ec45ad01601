"""Workloads (instances and batch jobs), their event log, and GPU allocations."""
from __future__ import annotations

import uuid

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q
from django.utils import timezone

from agents.models import Gpu, Host
from gpucloud.catalogue.models import InstanceType, Region
from gpucloud.tenancy.models import Tenant, TenantOwnedQuerySet
from scheduler.choices import HOLDING, Billing, PriorityClass, SchedulingMode, State, WorkloadKind
from scheduler.core import POLICIES
from scheduler.notice import notice_text


class JobArray(models.Model):
    """`count` batch jobs submitted as one, like `sbatch --array=0-(count-1)`: the tasks are
    ordinary jobs (`Workload.array`, `array_index`), each with GPUCLOUD_ARRAY_INDEX in its env.

    scheduler/arrays.py creates one in a single transaction and stops it as a whole.
    """

    MAX_COUNT = 10_000

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="job_arrays")
    name = models.CharField(max_length=100)
    count = models.PositiveIntegerField()
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+",
                                   db_index=False)
    created_at = models.DateTimeField(default=timezone.now)

    objects = TenantOwnedQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(condition=Q(count__gte=1) & Q(count__lte=10_000), name="job_array_count_range"),
        ]

    def __str__(self) -> str:
        return f"array {self.name} ({self.count})"


class Workload(models.Model):
    """An instance (interactive rental) or a batch job (run to completion).

    `state` changes only through `scheduler.services.workload_transition`; `reason`
    says in words why it waits or why it ended.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # Indexes on this hot table are chosen, not automatic: each one costs every state change.
    # workload_tenant_list serves the tenant FK, workload_state_region the state and region.
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="workloads", db_index=False)
    kind = models.CharField(max_length=10, choices=WorkloadKind.choices)
    name = models.CharField(max_length=100)
    instance_type = models.ForeignKey(InstanceType, on_delete=models.PROTECT, related_name="+", db_index=False)
    region = models.ForeignKey(Region, on_delete=models.PROTECT, related_name="+", db_index=False)
    image = models.CharField(max_length=500)
    command = models.JSONField(default=list, blank=True)
    env = models.JSONField(default=dict, blank=True)
    ports = models.JSONField(default=list, blank=True)
    ssh_keys = models.JSONField(default=list, blank=True)
    billing = models.CharField(max_length=10, choices=Billing.choices, default=Billing.ON_DEMAND)
    priority = models.CharField(max_length=10, choices=PriorityClass.choices, default=PriorityClass.STANDARD)
    # Spot only: the most the owner pays per hour; a spot price above it preempts (billing/services.py).
    max_price = models.DecimalField(max_digits=12, decimal_places=4, null=True, blank=True)
    # batch jobs
    queue = models.CharField(max_length=64, default="default")
    nodes = models.PositiveSmallIntegerField(default=1)
    max_retries = models.PositiveSmallIntegerField(default=0)
    retries = models.PositiveSmallIntegerField(default=0)
    timeout_s = models.PositiveIntegerField(null=True, blank=True)
    # a task of a job array: its index 0..count-1 (also GPUCLOUD_ARRAY_INDEX in its env)
    array = models.ForeignKey(JobArray, null=True, blank=True, on_delete=models.CASCADE, related_name="tasks",
                              db_index=False)
    array_index = models.PositiveIntegerField(null=True, blank=True)
    # Instances: stopped after this many minutes with every GPU idle (agents.protocol.IDLE_BELOW).
    auto_stop_idle_minutes = models.PositiveIntegerField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    # lifecycle
    state = models.CharField(max_length=10, choices=State.choices, default=State.PENDING)
    reason = models.CharField(max_length=500, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+",
                                   db_index=False)
    created_at = models.DateTimeField(default=timezone.now)
    # When it (re)entered the queue: age in the queue order counts from here.
    queued_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    # A preemption notice (scheduler/notice.py): the workload stops at stop_by unless it ends
    # first, because of stop_cause (no countdown in it: that is rendered from stop_by).
    stop_by = models.DateTimeField(null=True, blank=True)
    stop_cause = models.CharField(max_length=500, blank=True)
    preempted_for = models.UUIDField(null=True, blank=True)
    queue_position = models.PositiveIntegerField(null=True, blank=True)
    # GPU-seconds received over earlier runs (LAS order, simulator parity).
    attained_gpu_s = models.FloatField(default=0.0)
    # Checkpoint-aware preemption (jobs): on preemption the agent sends this signal, waits the
    # grace for the job to save its progress, then stops it; the job is requeued and resumes.
    # Both empty: no checkpoint, stopped at the end of the notice.
    checkpoint_signal = models.CharField(max_length=10, blank=True)
    checkpoint_grace_s = models.PositiveIntegerField(null=True, blank=True)
    # Storage (volumes/): the mounts the agent gives its container, and the host it must run on
    # because a volume's data lives there (host affinity: the scheduler core places it there or
    # it waits). Written by the volumes app at launch and first placement; plain data here.
    mounts = models.JSONField(default=list, blank=True)
    pinned_host = models.ForeignKey(Host, null=True, blank=True, on_delete=models.PROTECT, related_name="+",
                                    db_index=False)
    pinned_because = models.CharField(max_length=200, blank=True)
    # DELETE hides a workload from its tenant after stopping it; billing keeps the row.
    deleted_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = TenantOwnedQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["tenant", "kind", "-created_at"], name="workload_tenant_list"),
            models.Index(fields=["state", "region"], name="workload_state_region"),
            # an array's tasks, in index order (only rows of arrays are in it)
            models.Index(fields=["array", "array_index"], condition=Q(array__isnull=False),
                         name="workload_array_tasks"),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(nodes__gte=1) & Q(nodes__lte=64), name="workload_nodes_range"),
            models.CheckConstraint(condition=Q(kind=WorkloadKind.JOB) | Q(nodes=1), name="workload_instance_one_node"),
            models.CheckConstraint(condition=Q(checkpoint_signal="", checkpoint_grace_s__isnull=True)
                                   | (~Q(checkpoint_signal="") & Q(checkpoint_grace_s__gte=1)
                                      & Q(checkpoint_grace_s__lte=3600) & Q(kind=WorkloadKind.JOB)),
                                   name="workload_checkpoint"),
            models.CheckConstraint(condition=Q(array__isnull=True, array_index__isnull=True)
                                   | Q(array__isnull=False, array_index__isnull=False, kind=WorkloadKind.JOB),
                                   name="workload_array_task"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.name} ({self.state})"

    @property
    def on_notice(self) -> bool:
        """It holds GPUs under a preemption notice: it stops at `stop_by` unless it ends first."""
        return self.stop_by is not None and self.state in HOLDING

    @property
    def shown_reason(self) -> str:
        """`reason` as its owner reads it (the API, the console, the CLI): under a notice, the
        notice's cause and when it stops, put into words now (scheduler/notice.py)."""
        if self.stop_by is not None and self.on_notice:
            return notice_text(self.stop_cause, self.stop_by)
        return self.reason


class WorkloadEvent(models.Model):
    """One transition of a workload: the event log billing and notifications read."""

    workload = models.ForeignKey(Workload, on_delete=models.CASCADE, related_name="events")
    from_state = models.CharField(max_length=10, choices=State.choices, blank=True)
    to_state = models.CharField(max_length=10, choices=State.choices)
    reason = models.CharField(max_length=500, blank=True)
    actor = models.CharField(max_length=200, default="scheduler")
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.from_state or '∅'} → {self.to_state}"


class ContainerEvent(models.Model):
    """Something that happened to a workload's container without its agent's order: lost
    (exited unasked, removed behind the agent's back) or restarted. Not a transition (billing
    and the lifecycle read `WorkloadEvent`); shown beside them in the timeline, the API and
    `gpucloud show`, and counted by the alarms' `container_events` metric."""

    class Kind(models.TextChoices):
        LOST = "container_lost", "Container lost"
        RESTARTED = "container_restarted", "Container restarted"

    workload = models.ForeignKey(Workload, on_delete=models.CASCADE, related_name="container_events")
    kind = models.CharField(max_length=30, choices=Kind.choices)
    # The how-manieth of its kind in the workload's run (a restart: the agent's count).
    count = models.PositiveIntegerField(default=1)
    detail = models.CharField(max_length=500, blank=True)  # what the agent saw
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.kind} #{self.count}"


class GangPart(models.Model):
    """One host's part of a multi-host job (`nodes > 1`) in one attempt: what its agent last reported.

    Written by the heartbeat (agents.gangs) under the workload's row lock; the job's state
    follows all its parts (scheduler.gang.gang_next). An attempt's parts are its hosts' active
    allocations; a row exists once that host's agent has reported its container.
    """

    workload = models.ForeignKey(Workload, on_delete=models.CASCADE, related_name="gang_parts")
    attempt_id = models.CharField(max_length=100, unique=True, help_text="the container's instance id")
    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="+")
    state = models.CharField(max_length=10)  # scheduler.gang.PartState
    exit_code = models.IntegerField(null=True, blank=True)
    error = models.CharField(max_length=500, blank=True)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["workload", "attempt_id"]

    def __str__(self) -> str:
        return f"{self.attempt_id} on {self.host_id}: {self.state}"


class Allocation(models.Model):
    """A share of one GPU held by a workload. Active from placement until a terminal state.

    The partial unique constraint lets a GPU carry at most one active whole-GPU
    allocation; `Gpu.used_milli`'s CHECK bounds fractional shares.
    """

    # The partial indexes below serve gpu and workload lookups of active rows; plain FK
    # indexes on them would cost every placement two more index writes.
    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="allocations", db_index=False)
    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="allocations")
    workload = models.ForeignKey(Workload, on_delete=models.CASCADE, related_name="allocations", db_index=False)
    milli = models.PositiveSmallIntegerField()
    vcpus = models.PositiveIntegerField(default=0)
    memory_mib = models.PositiveBigIntegerField(default=0)
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["workload", "gpu"]
        constraints = [
            models.UniqueConstraint(fields=["gpu"], condition=Q(active=True, milli=1000),
                                    name="allocation_one_whole_per_gpu"),
            models.UniqueConstraint(fields=["gpu", "workload"], condition=Q(active=True),
                                    name="allocation_once_per_workload"),
            models.CheckConstraint(condition=Q(milli__gte=1) & Q(milli__lte=1000), name="allocation_milli_range"),
        ]
        indexes = [
            models.Index(fields=["workload"], condition=Q(active=True), name="allocation_active"),
            # the fleet page's allocation history: released rows by when (a placement writes no entry)
            models.Index(fields=["released_at"], condition=Q(active=False), name="allocation_released"),
        ]

    def __str__(self) -> str:
        return f"{self.milli}m of {self.gpu_id} for {self.workload_id}"


class RegionSchedulerSettings(models.Model):
    """Per-region scheduling policy and mode, chosen by operators in the admin."""

    region = models.OneToOneField(Region, on_delete=models.CASCADE, related_name="scheduler_settings")
    policy = models.CharField(max_length=32, default="gpucloud")
    mode = models.CharField(max_length=10, blank=True, help_text="static, dynamic or hybrid; empty: the policy's own")
    notice_s = models.PositiveIntegerField(default=30)
    reclaim_idle_util = models.FloatField(default=0.05)
    reclaim_idle_s = models.PositiveIntegerField(default=3600)
    # Bounded blast radius (core Policy.preempt_cap): a preemption evicts at most this multiple
    # of what its request needs (GPU-seconds of remaining work with estimates, else GPUs).
    preempt_cap = models.FloatField(
        default=1.0, help_text="a preemption evicts at most this multiple of what the request needs (1: no "
                               "more GPUs than it asks for)")

    class Meta:
        verbose_name = "region scheduler settings"
        verbose_name_plural = "region scheduler settings"

    def __str__(self) -> str:
        return f"{self.region}: {self.policy}"

    def clean(self) -> None:
        errors = {}
        if self.policy not in POLICIES:
            errors["policy"] = f"Unknown policy; choose one of {', '.join(sorted(POLICIES))}."
        if self.mode and self.mode not in SchedulingMode.values:
            errors["mode"] = "static, dynamic or hybrid (or empty for the policy's own)."
        if not 0 <= self.reclaim_idle_util <= 1:
            errors["reclaim_idle_util"] = "A utilisation between 0 and 1."
        if not 1 <= self.preempt_cap <= 1000:
            errors["preempt_cap"] = "A multiple between 1 and 1000 of what the request needs."
        if errors:
            raise ValidationError(errors)
