"""Reads for volumes, always scoped to a tenant (operators' reads say so in their names)."""
from __future__ import annotations

from typing import Any

from django.db.models import Prefetch, QuerySet

from agents.choices import AdminState
from gpucloud.tenancy.models import Tenant
from scheduler.choices import ACTIVE
from volumes.models import Volume, VolumeAttachment, VolumeMove


def volume_list(*, tenant: Tenant) -> QuerySet[Volume]:
    """The tenant's live volumes (soft-deleted ones are gone for it), with their active attachment."""
    active = VolumeAttachment.objects.select_related("workload").filter(workload__state__in=ACTIVE)
    return (Volume.objects.for_tenant(tenant).filter(deleted_at__isnull=True)
            .select_related("region", "host")
            .prefetch_related(Prefetch("attachments", queryset=active, to_attr="active_attachments"),
                              Prefetch("moves", queryset=VolumeMove.objects.filter(state__in=VolumeMove.OPEN),
                                       to_attr="open_moves")))


def volume_events(*, volume: Volume):
    return volume.events.all()[:50]


def volumes_needing_a_move():
    """Operators: volumes (not purged) whose host is draining: their owners' work can only run
    there, so each needs moving to another host before the host goes (volumes/moves.py)."""
    return (Volume.objects.filter(purged_at__isnull=True, host__admin_state=AdminState.DRAINING)
            .select_related("host", "tenant", "region"))


def open_move(volume_id: Any) -> VolumeMove | None:
    """The volume's move under way, if any."""
    return VolumeMove.objects.filter(volume_id=volume_id, state__in=VolumeMove.OPEN).first()
