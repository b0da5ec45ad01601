"""The volumes app's side of the scheduler's signals (scheduler/signals.py)."""
from __future__ import annotations

from django.dispatch import receiver

from agents.services.heartbeat import on_beat
from agents.signals import volume_moves_for, volumes_measured, volumes_reported, volumes_to_remove
from scheduler.signals import workload_launching, workload_starting, workloads_placed
from volumes import moves, services

# whether the host has volume work at all, read with the heartbeat's host row
on_beat(moves.heartbeat_read)


@receiver(workload_launching)
def _attach(sender, *, workload, spec, **kwargs) -> None:
    services.attach_for_launch(workload=workload, volumes=spec.volumes)


@receiver(workloads_placed)
def _pin(sender, *, hosts, **kwargs) -> None:
    services.pin_placed(hosts=hosts)


@receiver(workload_starting)
def _check_start(sender, *, workload, **kwargs) -> None:
    services.check_start(workload=workload)


@receiver(volumes_reported)
def _usage(sender, *, host, usage, **kwargs) -> None:
    services.record_usage(host_id=host.pk, usage=usage)
    services.removed_from_host(host_id=host.pk, present=set(usage))
    moves.source_reported(host_id=host.pk, present=set(usage))


@receiver(volumes_measured)
def _measured(sender, *, measured, **kwargs) -> None:
    services.record_measured(measured=measured)


@receiver(volumes_to_remove)
def _to_remove(sender, *, host, shared=None, **kwargs) -> list[str]:
    return moves.to_remove(host=host, shared=shared)


@receiver(volume_moves_for)
def _moves(sender, *, host, shared=None, **kwargs) -> list:
    return moves.orders_for(host=host, shared=shared)
