"""Concurrency on the real PostgreSQL: several worker processes scheduling at once.

Each process runs `manage.py schedule` (the same `run_cycle` the Celery task
runs) against the test database. With the region lock switched off the cycles
really overlap, so what keeps GPUs from being booked twice is the database guard
alone (guarded UPDATEs and CHECK constraints).
"""
from __future__ import annotations

import os
import random
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, Sum

from agents.models import Gpu, Host
from gpucloud.catalogue.models import InstanceType, Quota, Region
from gpucloud.tenancy.models import Tenant
from scheduler.choices import HOLDING, State
from scheduler.models import Allocation, Workload
from tests.conftest import make_actor
from tests.scheduler.fleet import make_hosts

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _env(lock: bool) -> dict[str, str]:
    db = settings.DATABASES["default"]
    return {**os.environ, "DJANGO_SETTINGS_MODULE": "gpucloud.test_settings",
            "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
            "SCHEDULER_LOCK": "1" if lock else "0", "LOG_LEVEL": "WARNING"}


def run_workers(n: int, *, lock: bool, cycles: int = 6) -> list[str]:
    procs = [subprocess.Popen([sys.executable, "manage.py", "schedule", "--region", "us-east-1",
                               "--cycles", str(cycles), "--json"], cwd=ROOT, env=_env(lock),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(n)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        outs.append(out.strip().splitlines()[-1])
    return outs


def assert_no_double_booking():
    """Checked in the database, GPU by GPU."""
    whole = Allocation.objects.filter(active=True, milli=1000).values("gpu").annotate(n=Count("id"))
    assert all(row["n"] == 1 for row in whole)
    shares = dict(Allocation.objects.filter(active=True).values_list("gpu").annotate(m=Sum("milli")))
    assert all(m <= 1000 for m in shares.values())
    mixed = Allocation.objects.filter(active=True, milli=1000, gpu__in=Allocation.objects.filter(
        active=True, milli__lt=1000).values("gpu"))
    assert not mixed.exists(), "whole and fractional work on one GPU"
    for uuid, used in Gpu.objects.values_list("uuid", "used_milli"):
        assert used == shares.get(uuid, 0), uuid
    for host in Host.objects.all():
        booked = Allocation.objects.filter(active=True, host=host).aggregate(v=Sum("vcpus"))["v"] or 0
        assert booked == host.used_vcpus <= host.vcpus
    # gangs whole: every holding workload has exactly the GPUs its type asks for
    for w in Workload.objects.filter(state__in=HOLDING).select_related("instance_type"):
        n = Allocation.objects.filter(workload=w, active=True).count()
        assert n == w.instance_type.gpu_count * w.nodes, (w.pk, n)
    assert not Allocation.objects.filter(active=True).exclude(workload__state__in=HOLDING).exists()


@pytest.fixture
def busy_region(transactional_db):
    from django.core.management import call_command

    call_command("seed_catalog", stdout=open(os.devnull, "w"))
    make_hosts(n=80, gpus=8, model="H100")
    make_hosts(n=20, gpus=4, model="L40S", islands=1)
    region = Region.objects.get(code="us-east-1")
    types = list(InstanceType.objects.filter(code__in=["h100.1x", "h100.2x", "h100.4x", "h100.8x",
                                                       "l40s.quarter", "l40s.half", "l40s.eighth", "l40s.1x"]))
    rng = random.Random(7)
    tenants = [Tenant.objects.create(name=f"t{i}", slug=f"t{i}", plan="enterprise") for i in range(12)]
    Workload.objects.bulk_create([
        Workload(tenant=rng.choice(tenants), kind="instance", name=f"w{i}", instance_type=rng.choice(types),
                 region=region, image="busybox", priority=rng.choice(["critical", "standard", "low"]),
                 billing=rng.choice(["on_demand", "spot"]))
        for i in range(1000)
    ])
    return region


def test_four_workers_without_the_lock_never_double_book(busy_region):
    outs = run_workers(4, lock=False)
    placed = Workload.objects.filter(state=State.SCHEDULED).count()
    assert placed > 300, outs  # the fleet really filled up
    assert_no_double_booking()


def test_four_workers_with_the_lock_take_turns(busy_region):
    run_workers(4, lock=True)
    assert Workload.objects.filter(state=State.SCHEDULED).count() > 300
    assert_no_double_booking()
    # every waiting workload says why, naming the real constraint
    waiting = list(Workload.objects.filter(state=State.PENDING).select_related("instance_type__gpu_model"))
    assert waiting
    for w in waiting:
        assert w.reason and w.reason != "waiting for the scheduler", w.pk
        assert w.instance_type.gpu_model.code in w.reason or w.reason.startswith("quota:"), w.reason
    # nothing was left claimed by a refused placement
    booked = Allocation.objects.filter(active=True).values("gpu").distinct().count()
    assert Gpu.objects.filter(used_milli__gt=0).count() == booked


@pytest.mark.django_db(transaction=True)
def test_100_simultaneous_creates_never_exceed_a_quota_of_10(live_server):
    from django.core.management import call_command

    call_command("seed_catalog", stdout=open(os.devnull, "w"))
    make_hosts(n=4, gpus=8, model="H100")
    actor = make_actor("quota@race.test", tenant_name="Racer")
    Quota.objects.create(tenant=actor.tenant, max_gpus=10, max_instances=100)

    import json
    import urllib.request

    def create(i):
        body = json.dumps({"name": f"r{i}", "instance_type": "h100.1x", "region": "us-east-1",
                           "image": "busybox"}).encode()
        req = urllib.request.Request(f"{live_server.url}/api/v1/instances", data=body, method="POST",
                                     headers={"Authorization": f"Bearer {actor.key}",
                                              "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status

    with ThreadPoolExecutor(max_workers=20) as pool:
        statuses = list(pool.map(create, range(100)))
    assert statuses == [201] * 100
    # all four workers, unlocked, racing to admit
    run_workers(4, lock=False, cycles=3)
    held = Allocation.objects.filter(active=True, workload__tenant=actor.tenant).aggregate(m=Sum("milli"))["m"]
    assert held == 10 * 1000
    assert Workload.objects.filter(tenant=actor.tenant, state=State.SCHEDULED).count() == 10
    waiting = Workload.objects.filter(tenant=actor.tenant, state=State.PENDING)
    assert waiting.count() == 90
    assert all(w.reason == "quota: 10 of 10 GPUs in use and this needs 1 more" for w in waiting), waiting[0].reason
    assert_no_double_booking()
    connection.close()


def _wait_for_lock_waiters(n: int, timeout_s: float = 30) -> None:
    """Block until `n` sessions of this database wait on a lock (bounded)."""
    import time

    deadline = time.monotonic() + timeout_s
    with connection.cursor() as cur:
        while True:
            cur.execute("SELECT pg_stat_clear_snapshot()")  # fresh figures inside our transaction
            cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                        "AND wait_event_type = 'Lock'")
            if cur.fetchone()[0] >= n:
                return
            assert time.monotonic() < deadline, f"fewer than {n} requests reached the row lock"
            time.sleep(0.01)


@pytest.mark.django_db(transaction=True)
def test_a_stop_racing_five_deletes_never_500s_and_deletes_once(alice, fleet):
    """The requests queue on the workload's row lock, which the test holds and then releases:
    five DELETEs first, then a stop. Each one goes through the API in a thread of its own
    (its own database connection). Before the fix every DELETE recorded a delete event and
    the stop read the deleted row back for its answer: DoesNotExist, a 500."""
    import threading

    from gpucloud.tenancy.models import AuditEvent

    url = "/api/v1/instances/" + alice.client().post(
        "/api/v1/instances", {"name": "race", "instance_type": "h100.1x", "region": "us-east-1",
                              "image": "busybox"}, format="json").json()["id"]
    statuses: dict[str, int] = {}

    def call(name: str, method: str, path: str) -> None:
        client = alice.client()
        client.raise_request_exception = False
        try:
            statuses[name] = getattr(client, method)(path).status_code
        finally:
            connection.close()

    threads = []
    with transaction.atomic():
        Workload.objects.select_for_update().get(pk=url.rsplit("/", 1)[1])
        for i in range(5):
            threads.append(threading.Thread(target=call, args=(f"delete{i}", "delete", url)))
            threads[-1].start()
        _wait_for_lock_waiters(5)
        threads.append(threading.Thread(target=call, args=("stop", "post", f"{url}/stop")))
        threads[-1].start()
        _wait_for_lock_waiters(6)
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    deletes = sorted(v for k, v in statuses.items() if k.startswith("delete"))
    assert deletes == [204, 404, 404, 404, 404], statuses
    assert statuses["stop"] in (200, 404), statuses
    assert AuditEvent.objects.filter(action="instance.delete").count() == 1
    assert alice.client().get(url).status_code == 404
    connection.close()
