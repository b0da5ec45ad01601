from __future__ import annotations

from celery import shared_task

from autoscaling.reconcile import reconcile_all, reconcile_group


@shared_task(ignore_result=True, soft_time_limit=60, time_limit=90)
def autoscaling_reconcile_task() -> int:
    """Beat's tick: evaluate every autoscaling group once (autoscaling/reconcile.py)."""
    return reconcile_all()


@shared_task(ignore_result=True, soft_time_limit=60, time_limit=90)
def reconcile_group_task(group_id: str) -> None:
    """A group just changed (created, resized): converge it now rather than at the next tick."""
    reconcile_group(group_id)
