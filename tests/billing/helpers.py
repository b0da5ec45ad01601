"""Workloads with a lifecycle written at chosen times, and prices from a chosen moment."""
from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

from gpucloud.catalogue.models import InstanceType, Price, Region
from scheduler.choices import State
from scheduler.models import Workload, WorkloadEvent

LONG_AGO = datetime(2024, 1, 1, tzinfo=UTC)


def at(*args) -> datetime:
    return datetime(*args, tzinfo=UTC)


def set_price(it: str, per_hour: str, since: datetime = LONG_AGO, region: str = "us-east-1",
              kind: str = "on_demand") -> Price:
    return Price.objects.create(instance_type=InstanceType.objects.get(code=it), region=Region.objects.get(code=region),
                                kind=kind, per_hour=Decimal(per_hour), effective_from=since)


def make_run(actor, *, transitions: list[tuple[datetime, str]], it: str = "h100.1x", region: str = "us-east-1",
             billing: str = "on_demand", nodes: int = 1, name: str = "w", kind: str = "instance") -> Workload:
    """A workload created at the first transition's time, moved through `transitions`."""
    created = transitions[0][0]
    w = Workload.objects.create(
        tenant=actor.tenant if hasattr(actor, "tenant") else actor, kind=kind, name=name, image="busybox",
        instance_type=InstanceType.objects.get(code=it), region=Region.objects.get(code=region), billing=billing,
        nodes=nodes, created_at=created, queued_at=created, state=State.PENDING,
    )
    old = ""
    rows = [WorkloadEvent(workload=w, from_state=old, to_state=State.PENDING, created_at=created)]
    old = State.PENDING
    for t, to in transitions[1:]:
        rows.append(WorkloadEvent(workload=w, from_state=old, to_state=to, created_at=t))
        old = to
    WorkloadEvent.objects.bulk_create(rows)
    Workload.objects.filter(pk=w.pk).update(state=old)
    w.refresh_from_db()
    return w
