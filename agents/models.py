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
from django.utils import timezone

from agents.choices import HostState
from gpucloud.catalogue.models import GpuModel, Region


class Host(models.Model):
    """One GPU server running the gpucloud agent."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=200, unique=True, help_text="the host name the agent reported")
    region = models.ForeignKey(Region, on_delete=models.PROTECT, related_name="hosts")
    state = models.CharField(max_length=10, choices=HostState.choices, default=HostState.READY)
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
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(condition=Q(used_vcpus__lte=models.F("vcpus")), name="host_vcpus_within"),
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
    healthy = models.BooleanField(default=True)
    # Booking: a GPU is held whole by one allocation, or shared by fractions summing <= 1000.
    whole = models.BooleanField(default=False)
    used_milli = models.PositiveSmallIntegerField(default=0)
    # Last measurement from the agent.
    utilisation = models.FloatField(default=0.0)
    memory_used_mib = models.PositiveIntegerField(default=0)
    idle_since = models.DateTimeField(null=True, blank=True)
    sampled_at = models.DateTimeField(null=True, blank=True)

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

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.region})"
