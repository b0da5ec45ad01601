"""GPU hosts and their GPUs, as the agents report them, and the bootstrap tokens hosts join with.

`Gpu.whole` / `Gpu.used_milli` are the booking counters the scheduler claims with
guarded UPDATEs; the CHECK constraints below make over-booking a GPU impossible
even if two scheduling cycles ever ran at once (invariant 1). The agent API never
writes them.
"""
from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.db.models.functions import Lower, Trim
from django.utils import timezone

from agents.choices import AdminState, HostState
from gpucloud.catalogue.models import GpuModel, Region


class Host(models.Model):
    """One GPU server running the gpucloud agent."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # Always in the one form of agents.protocol.host_name_normalise (registration, the admin
    # and the agent's config all pass names through it); the constraint below keeps two rows
    # from reading alike even if a write ever bypassed it.
    name = models.CharField(max_length=200, unique=True, help_text="the host name the agent reported")
    region = models.ForeignKey(Region, on_delete=models.PROTECT, related_name="hosts")
    state = models.CharField(max_length=10, choices=HostState.choices, default=HostState.READY)
    # The operator's choice (cordon / drain / uncordon). `state` equals it unless the host is
    # DOWN; a host coming back takes it again, so a drain survives an outage.
    admin_state = models.CharField(
        max_length=10, choices=AdminState.choices, default=AdminState.READY
    )
    vcpus = models.PositiveIntegerField()
    memory_mib = models.PositiveBigIntegerField()
    # What running work has booked; the scheduler claims these with guarded UPDATEs too.
    used_vcpus = models.PositiveIntegerField(default=0)
    used_memory_mib = models.PositiveBigIntegerField(default=0)
    # SHA-256 of the host token (shown once, to the agent). Indexed: every heartbeat looks it up.
    token_hash = models.CharField(max_length=64, blank=True, db_index=True)
    agent_version = models.CharField(max_length=50, blank=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    # The highest heartbeat `seq` applied: an older one that arrives late is not applied again.
    last_seq = models.PositiveBigIntegerField(default=0)
    # When the liveness task marked it DOWN; its work is LOST HOST_LOST_GRACE_S later.
    down_since = models.DateTimeField(null=True, blank=True)
    # Set by the operator's "Replace host" action: the next registration of this name with a
    # valid bootstrap token of its region may take the host over (new token, the old one
    # revoked), then it is cleared. Without it (or the previous host token as proof) a
    # registration naming this host is refused: a bootstrap token never hands over a host.
    replace_allowed_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(condition=Q(used_vcpus__lte=models.F("vcpus")), name="host_vcpus_within"),
            models.UniqueConstraint(Lower(Trim("name")), name="host_name_unique_normalised"),
            models.CheckConstraint(
                condition=Q(used_memory_mib__lte=models.F("memory_mib")), name="host_memory_within"
            ),
        ]

    def __str__(self) -> str:
        return self.name


class Gpu(models.Model):
    """One physical GPU, named by its UUID everywhere (never by index alone)."""

    uuid = models.CharField(max_length=64, primary_key=True)
    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField()
    gpu_model = models.ForeignKey(GpuModel, on_delete=models.PROTECT, related_name="gpus")
    memory_mib = models.PositiveIntegerField(default=0)
    pci_bus_id = models.CharField(max_length=32, blank=True)
    numa_node = models.SmallIntegerField(default=0)
    nvlink_island = models.SmallIntegerField(default=0)
    # MIG mode on (NVIDIA, from the agent's inventory at registration): the GPU is partitioned
    # by hardware. Not yet a reason to mix tenants on it: shares are pinned to the parent GPU
    # UUID, which shows the container every slice (see docs/scheduler.md, tenant isolation).
    mig_enabled = models.BooleanField(default=False)
    # False after a fatal XID, an uncorrectable ECC error, a lost GPU or a vanished one: it
    # takes no new work until an operator marks it healthy again (sticky on purpose).
    healthy = models.BooleanField(default=True)
    unhealthy_reason = models.CharField(max_length=300, blank=True)
    unhealthy_since = models.DateTimeField(null=True, blank=True)
    # The last volatile uncorrectable ECC count seen: an increase is a new error.
    ecc_uncorrected = models.PositiveBigIntegerField(null=True, blank=True)
    # Booking: a GPU is held whole by one allocation, or shared by fractions summing <= 1000.
    whole = models.BooleanField(default=False)
    used_milli = models.PositiveSmallIntegerField(default=0)
    # Last measurement from the agent.
    utilisation = models.FloatField(default=0.0)
    memory_used_mib = models.PositiveIntegerField(default=0)
    idle_since = models.DateTimeField(null=True, blank=True)
    sampled_at = models.DateTimeField(null=True, blank=True)
    # ...and its temperature and power, for /metrics (null: never reported).
    temperature_c = models.FloatField(null=True, blank=True)
    power_w = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["host", "index"]
        verbose_name = "GPU"
        constraints = [
            models.UniqueConstraint(fields=["host", "index"], name="gpu_unique_index"),
            models.CheckConstraint(condition=Q(used_milli__lte=1000), name="gpu_shares_within_one"),
            # whole => used_milli == 1000, so a whole booking and a share can never coexist
            models.CheckConstraint(condition=Q(whole=False) | Q(used_milli=1000), name="gpu_whole_is_full"),
        ]

    def __str__(self) -> str:
        return f"{self.host.name}#{self.index} {self.uuid}"


class BootstrapToken(models.Model):
    """A one-time token that lets one new host join a region.

    Operators create it in the admin; the secret is shown once and stored as SHA-256
    (random 256-bit, so a plain hash suffices, as for API keys). The first successful
    registration consumes it (`used_at`, `host`); after `expires_at` it admits nothing.
    An agent whose answer was lost may repeat that registration with the same nonce within
    REGISTER_RETRY_WINDOW_S of `used_at` (`nonce_hash`; docs/agent.md).
    """

    region = models.ForeignKey(Region, on_delete=models.PROTECT, related_name="bootstrap_tokens")
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    prefix = models.CharField(max_length=16, editable=False,
                              help_text="the first characters, to recognise it")
    note = models.CharField(max_length=200, blank=True,
                            help_text="e.g. the rack or machine it is for")
    expires_at = models.DateTimeField(null=True, blank=True, help_text="empty: never expires")
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
        related_name="+", editable=False,
    )
    used_at = models.DateTimeField(null=True, blank=True, editable=False)
    host = models.ForeignKey(
        Host, null=True, blank=True, on_delete=models.SET_NULL, related_name="bootstrap_tokens",
        editable=False,
    )
    # SHA-256 of the registration nonce the consuming agent sent (never the nonce): a
    # retry with this token and the same nonce soon after `used_at` gets `host` again.
    nonce_hash = models.CharField(max_length=64, blank=True, default="", editable=False)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.region})"


class GpuSample(models.Model):
    """One GPU measurement from a heartbeat, kept GPU_SAMPLE_RAW_RETENTION_S (about an hour).

    Written in one INSERT per heartbeat; `agents.tasks.gpu_samples_rollup_task` averages
    them into `GpuSampleMinute` and prunes both. Null metric: not supported on that GPU.
    """

    id = models.BigAutoField(primary_key=True)
    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="+", db_constraint=False)
    time = models.DateTimeField()
    gpu_util = models.FloatField(null=True)  # percent 0..100
    mem_util = models.FloatField(null=True)  # percent 0..100
    mem_used_mib = models.PositiveIntegerField(null=True)
    temperature_c = models.FloatField(null=True)
    power_w = models.FloatField(null=True)

    class Meta:
        indexes = [models.Index(fields=["gpu", "time"], name="gpusample_gpu_time"),
                   models.Index(fields=["time"], name="gpusample_time")]

    def __str__(self) -> str:
        return f"{self.gpu_id} @ {self.time:%Y-%m-%d %H:%M:%S}"


class GpuSampleMinute(models.Model):
    """1-minute averages of `GpuSample`, kept GPU_SAMPLE_MINUTE_RETENTION_DAYS (30)."""

    id = models.BigAutoField(primary_key=True)
    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="+", db_constraint=False)
    minute = models.DateTimeField()
    samples = models.PositiveIntegerField(default=0)
    gpu_util = models.FloatField(null=True)
    mem_util = models.FloatField(null=True)
    mem_used_mib = models.FloatField(null=True)
    temperature_c = models.FloatField(null=True)
    power_w = models.FloatField(null=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["gpu", "minute"], name="gpusampleminute_unique")
        ]
        indexes = [models.Index(fields=["minute"], name="gpusampleminute_minute")]

    def __str__(self) -> str:
        return f"{self.gpu_id} @ {self.minute:%Y-%m-%d %H:%M}"


class ContainerLog(models.Model):
    """The latest log tail of a workload's container, and an outstanding request for one.

    The control plane cannot call agents (they pull), so `GET .../logs` sets `requested_*`;
    the next heartbeat answer carries the request (`logs_requests`), and the heartbeat after
    that carries the tail, stored here (`text`, `captured_at`) and the request cleared.
    """

    workload = models.OneToOneField(
        "scheduler.Workload", on_delete=models.CASCADE, primary_key=True, related_name="+"
    )
    host = models.ForeignKey(Host, null=True, on_delete=models.SET_NULL, related_name="+")
    attempt_id = models.CharField(max_length=100, blank=True)  # the container's instance id
    requested_tail = models.PositiveIntegerField(default=0)
    requested_at = models.DateTimeField(null=True, blank=True)
    text = models.TextField(blank=True)
    captured_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["host", "requested_at"], name="containerlog_requests")]

    def __str__(self) -> str:
        return f"log of {self.workload_id}"
