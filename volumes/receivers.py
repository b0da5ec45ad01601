"""The volumes app's side of the scheduler's signals (scheduler/signals.py)."""
from __future__ import annotations

from django.dispatch import receiver

from scheduler.signals import workload_launching, workload_starting, workloads_placed
from volumes import services


@receiver(workload_launching)
def _attach(sender, *, workload, spec, **kwargs) -> None:
    services.attach_for_launch(workload=workload, volumes=spec.volumes)


@receiver(workloads_placed)
def _pin(sender, *, hosts, **kwargs) -> None:
    services.pin_placed(hosts=hosts)


@receiver(workload_starting)
def _check_start(sender, *, workload, **kwargs) -> None:
    services.check_start(workload=workload)
