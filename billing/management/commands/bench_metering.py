"""Benchmark a metering run: what one beat tick of `billing.tasks.metering_run_task` costs.

    python manage.py bench_metering [--workloads 2000] [--tenants 4] [--json]

In a throwaway database (`test_<name>`, created and dropped here, as bench_scheduler does):
the catalogue, T tenants with credit, and N one-GPU workloads that started running in the
last ten minutes, half of them finished since (the state a 2,000-job burst leaves behind).
Then three runs of `billing.services.metering_run`, each a minute later than the last:

- `first`: every workload's whole usage so far (N meters, each with its slices to post);
- `next`: one more minute for the half still running (the others are done);
- `idle`: nothing changed since `next` closed its window, only the running half to move.

For each: wall time, this process's CPU time (PostgreSQL's is not in it), statements sent,
and wall ms per metered workload. The ledger is checked against the meters at the end.
"""
from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import connection
from django.db.models import Sum

from billing import services
from billing.models import Account, LedgerEntry, Meter
from gpucloud.catalogue.models import InstanceType, Region
from gpucloud.lib.db import bench_database
from gpucloud.tenancy.services import tenant_create
from scheduler.choices import State
from scheduler.models import Workload, WorkloadEvent


def _start() -> datetime:
    """Where the synthetic usage begins: tomorrow on the hour, after the seeded prices took effect."""
    return (datetime.now(UTC) + timedelta(days=1)).replace(minute=0, second=0, microsecond=0)


class Command(BaseCommand):
    help = "Wall and CPU time, statements and ms per workload of a metering run."

    def add_arguments(self, parser):
        parser.add_argument("--workloads", type=int, default=2000)
        parser.add_argument("--tenants", type=int, default=4)
        parser.add_argument("--json", action="store_true", help="print one JSON object")

    def handle(self, *args, workloads, tenants, **options):
        if workloads < 1 or tenants < 1:
            raise CommandError("--workloads and --tenants must be >= 1")
        if connection.vendor != "postgresql":
            raise CommandError("the benchmark needs PostgreSQL (set DATABASE_URL)")
        with bench_database():
            t0 = _start()
            _populate(workloads, tenants, t0)
            out: dict[str, Any] = {"workloads": workloads, "tenants": tenants}
            for name, minutes in (("first", 11), ("next", 12), ("idle", 13)):
                out[name] = _timed(lambda m=minutes: services.metering_run(now=t0 + timedelta(minutes=m, seconds=30)))
            posted = LedgerEntry.objects.filter(kind="usage").aggregate(s=Sum("amount"))["s"] or Decimal(0)
            metered = Meter.objects.aggregate(s=Sum("amount"))["s"] or Decimal(0)
            out["ledger_matches_meters"] = posted == -metered
            out["balances_match_ledger"] = all(
                a.balance == LedgerEntry.objects.filter(tenant_id=a.tenant_id).aggregate(s=Sum("amount"))["s"]
                for a in Account.objects.all())
        if options["json"]:
            self.stdout.write(json.dumps(out))
        else:
            for key, value in out.items():
                self.stdout.write(f"{key:>22}: {value}")


def _populate(n: int, tenants: int, t0: datetime) -> None:
    call_command("seed_catalog", verbosity=0)
    it = InstanceType.objects.get(code="h100.1x")
    region = Region.objects.get(code="us-east-1")
    owner = get_user_model().objects.create_user(username="bench@metering.test", email="bench@metering.test",
                                                 password=uuid.uuid4().hex)
    payers = [tenant_create(name=f"Metering {i}", owner=owner) for i in range(tenants)]
    for tenant in payers:  # credit enough that nothing is stopped for want of it
        services.credit_grant(tenant=tenant, amount=Decimal(1_000_000), memo="bench")
    rows, events = [], []
    for i in range(n):
        created = t0 + timedelta(milliseconds=250 * i % 300_000)
        w = Workload(tenant=payers[i % tenants], kind="job", name=f"m{i}", image="busybox", instance_type=it,
                     region=region, billing="on_demand", created_at=created, queued_at=created)
        steps = [(created, State.PENDING), (created + timedelta(seconds=2), State.SCHEDULED),
                 (created + timedelta(seconds=3), State.STARTING), (created + timedelta(seconds=4), State.RUNNING)]
        if i % 2:
            steps.append((created + timedelta(seconds=5 + i % 240), State.SUCCEEDED))
        old = ""
        for t, to in steps:
            events.append(WorkloadEvent(workload=w, from_state=old, to_state=to, created_at=t))
            old = to
        w.state = old
        rows.append(w)
    Workload.objects.bulk_create(rows, batch_size=1000)
    WorkloadEvent.objects.bulk_create(events, batch_size=2000)


def _timed(run: Callable[[], services.MeteringStats]) -> dict[str, Any]:
    statements = 0

    def count(execute, sql, params, many, context):
        nonlocal statements
        statements += 1
        return execute(sql, params, many, context)

    with connection.execute_wrapper(count):
        c0, t0 = time.process_time(), time.perf_counter()
        stats = run()
        cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    return {"metered": stats.metered, "entries": stats.entries, "wall_ms": round(wall * 1000, 1),
            "cpu_ms": round(cpu * 1000, 1), "statements": statements,
            "wall_ms_per_workload": round(wall * 1000 / max(1, stats.metered), 3)}
