"""Volumes: persistent storage of a tenant, living on one host, attached to workloads.

A volume's data lives on the host where the first workload that used it was placed
(`host`, set by the scheduling cycle's `workloads_placed` signal); from then on every
workload attached to it is pinned to that host (`Workload.pinned_host`: the scheduler
core's host affinity). On the host it is a Docker named volume (`docker_name`).

Deletion is two steps: DELETE sets `deleted_at` (hidden from the tenant, billing stops,
data kept) and the purge task removes the data through the host's agent once
`settings.VOLUME_PURGE_GRACE_S` has passed (`purged_at`).
"""
from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from agents.models import Host
from gpucloud.catalogue.models import Region
from gpucloud.tenancy.models import Tenant, TenantOwnedQuerySet
from scheduler.models import Workload

DOCKER_PREFIX = "gpucloud-vol-"


class Volume(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="volumes")
    name = models.CharField(max_length=100)
    region = models.ForeignKey(Region, on_delete=models.PROTECT, related_name="+")
    size_gib = models.PositiveIntegerField()
    # where its data lives; null until a workload using it was first placed
    host = models.ForeignKey(Host, null=True, blank=True, on_delete=models.PROTECT, related_name="volumes")
    # the last measurement the host's agent reported (the size is not enforced by the driver)
    used_bytes = models.PositiveBigIntegerField(null=True, blank=True)
    measured_at = models.DateTimeField(null=True, blank=True)
    over_size_since = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)
    deleted_at = models.DateTimeField(null=True, blank=True)
    purged_at = models.DateTimeField(null=True, blank=True)

    objects = TenantOwnedQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], condition=Q(deleted_at__isnull=True),
                                    name="volume_name_unique_live"),
            models.CheckConstraint(condition=Q(size_gib__gte=1), name="volume_size_positive"),
        ]

    def __str__(self) -> str:
        return f"volume {self.name} ({self.size_gib} GiB)"

    @property
    def docker_name(self) -> str:
        return f"{DOCKER_PREFIX}{self.pk}"


class VolumeAttachment(models.Model):
    """A workload uses a volume at `mount_path`. It holds the volume while the workload is
    queued or holds GPUs (scheduler.choices.ACTIVE); stopping or ending it detaches."""

    volume = models.ForeignKey(Volume, on_delete=models.CASCADE, related_name="attachments")
    workload = models.ForeignKey(Workload, on_delete=models.CASCADE, related_name="volume_attachments")
    mount_path = models.CharField(max_length=200)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["volume", "workload"], name="volume_attachment_once"),
        ]

    def __str__(self) -> str:
        return f"{self.volume_id} at {self.mount_path} of {self.workload_id}"


class VolumeSize(models.Model):
    """The size of a volume from a moment on (its creation, each resize): what billing
    charges each second at (billing/storage.py)."""

    volume = models.ForeignKey(Volume, on_delete=models.CASCADE, related_name="sizes")
    size_gib = models.PositiveIntegerField()
    effective_from = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["volume", "effective_from", "id"]

    def __str__(self) -> str:
        return f"{self.volume_id}: {self.size_gib} GiB from {self.effective_from:%Y-%m-%d %H:%M:%S}"


class StoragePrice(models.Model):
    """The price book's storage entry: per GiB-hour of volume in a region, from a moment on
    (billed per second, like instances; docs/billing.md)."""

    region = models.ForeignKey(Region, on_delete=models.PROTECT, related_name="+")
    per_gib_hour = models.DecimalField(max_digits=12, decimal_places=4)
    currency = models.CharField(max_length=3, default="USD")
    effective_from = models.DateTimeField(default=timezone.now)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["region", "-effective_from"]
        constraints = [
            models.UniqueConstraint(fields=["region", "effective_from"], name="storage_price_unique_start"),
            models.CheckConstraint(condition=Q(per_gib_hour__gte=0), name="storage_price_non_negative"),
        ]

    def __str__(self) -> str:
        return f"{self.region} {self.per_gib_hour}/GiB-h from {self.effective_from:%Y-%m-%d}"


class VolumeEvent(models.Model):
    """What happened to a volume that its owner should read: over its size, purged."""

    volume = models.ForeignKey(Volume, on_delete=models.CASCADE, related_name="events")
    kind = models.CharField(max_length=32)
    message = models.CharField(max_length=500)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


class VolumeMove(models.Model):
    """An operator's move of a detached volume's data from `source` to `target`, relayed by
    the control plane (hosts accept no inbound connections): the source's agent uploads a tar
    of the volume in chunks (`VolumeMoveChunk`), the target's agent downloads them, checks the
    size and SHA-256 and unpacks them. The volume's `host` changes only when the target
    reported the same size and checksum the source sent (`done`); then the source's copy is
    removed. A failure leaves the volume where it was, usable (docs/volumes.md)."""

    COPYING, SENT, DONE, FAILED = "copying", "sent", "done", "failed"
    STATES = [(COPYING, "copying: the source sends"), (SENT, "sent: the target receives"),
              (DONE, "done"), (FAILED, "failed")]
    OPEN = (COPYING, SENT)

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    volume = models.ForeignKey(Volume, on_delete=models.CASCADE, related_name="moves")
    source = models.ForeignKey(Host, on_delete=models.PROTECT, related_name="+")
    target = models.ForeignKey(Host, on_delete=models.PROTECT, related_name="+")
    state = models.CharField(max_length=16, choices=STATES, default=COPYING)
    size_bytes = models.PositiveBigIntegerField(null=True, blank=True)  # of the tar the source sent
    sha256 = models.CharField(max_length=64, blank=True, default="")
    chunks = models.PositiveIntegerField(null=True, blank=True)
    error = models.CharField(max_length=500, blank=True, default="")
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                     related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)
    # the source's agent removed its copy (it reported its volumes without it)
    source_removed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["volume"], condition=Q(state__in=["copying", "sent"]),
                                    name="volume_move_one_open"),
        ]

    def __str__(self) -> str:
        return f"move of {self.volume_id} to {self.target_id}: {self.state}"


class VolumeMoveChunk(models.Model):
    """One piece of a move's tar stream, held until the move ends (then deleted)."""

    move = models.ForeignKey(VolumeMove, on_delete=models.CASCADE, related_name="chunk_rows")
    seq = models.PositiveIntegerField()
    data = models.BinaryField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["move", "seq"], name="volume_move_chunk_once")]

    def __str__(self) -> str:
        return f"chunk {self.seq} of {self.move_id}"
