"""Lock order on the real PostgreSQL: hosts before GPUs, everywhere.

The heartbeat locks its host row first and then writes its GPUs; the applier claims hosts
before GPUs. `release_allocations` once took the GPUs first, so a release (a stop, a
requeue, the cycle ending notice) racing a heartbeat of the same host deadlocked: in one
array burst PostgreSQL broke 32 such deadlocks, each a 500 or a one-second stall.

The test holds the host's row lock on a second connection, lets a release run into it,
waits until PostgreSQL reports that release waiting on a lock (a condition, not a sleep),
and then asks for the GPU's row lock without waiting: it is free only if the release has
not taken it before the host's.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

import psycopg
import pytest
from django.conf import settings
from django.db import connection, connections, transaction

from agents.models import Gpu, Host
from gpucloud.catalogue.models import InstanceType, Region
from scheduler.choices import State
from scheduler.cycle import run_cycle
from scheduler.models import Allocation, Workload
from scheduler.services import release_allocations
from tests.scheduler.fleet import make_hosts

pytestmark = pytest.mark.django_db(transaction=True)


def _dsn() -> str:
    db = settings.DATABASES["default"]
    return f"host={db['HOST']} port={db['PORT']} user={db['USER']} dbname={db['NAME']}"


def _waiting_on_lock(pid: int, deadline_s: float = 30.0) -> bool:
    end = time.monotonic() + deadline_s
    with psycopg.connect(_dsn(), autocommit=True) as probe:
        while time.monotonic() < end:
            row = probe.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()
            if row and row[0] == "Lock":
                return True
    return False


def runs_into_the_host_lock(fn: Callable[[], object], *, host: Host, gpus: list[str]) -> None:
    """Run `fn` on a thread while a second connection holds `host`'s row lock; once it waits
    on a lock, each GPU of `gpus` must still be free to lock (it took the host first)."""
    holder = psycopg.connect(_dsn())
    holder.execute(f"SELECT id FROM {Host._meta.db_table} WHERE id = %s FOR UPDATE", [host.pk])
    started = threading.Event()
    pid: list[int] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            pid.append(connection.cursor().connection.info.backend_pid)
            started.set()
            fn()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
            started.set()
        finally:
            connections.close_all()

    t = threading.Thread(target=run)
    t.start()
    try:
        assert started.wait(30) and not errors, errors
        assert _waiting_on_lock(pid[0]), "it never reached the host's lock"
        for gpu in gpus:
            try:
                holder.execute(f"SELECT uuid FROM {Gpu._meta.db_table} WHERE uuid = %s FOR UPDATE NOWAIT", [gpu])
            except psycopg.errors.LockNotAvailable:
                pytest.fail("a GPU was locked before the host (deadlocks with a heartbeat)")
    finally:
        holder.rollback()
        holder.close()
        t.join(30)
    assert not t.is_alive() and not errors, errors


def test_a_release_waits_for_the_host_before_it_touches_a_gpu(alice, catalog):
    make_hosts(n=1, gpus=8)
    w = Workload.objects.create(tenant=alice.tenant, kind="job", name="w", image="busybox",
                                instance_type=InstanceType.objects.get(code="h100.1x"),
                                region=Region.objects.get(code="us-east-1"))
    run_cycle(region_id=w.region_id)
    w.refresh_from_db()
    assert w.state == State.SCHEDULED
    alloc = Allocation.objects.get(workload=w, active=True)
    host = Host.objects.get(pk=alloc.host_id)
    booked_vcpus = host.used_vcpus
    assert booked_vcpus > 0

    def release() -> None:
        with transaction.atomic():
            release_allocations(workload_ids=[w.pk])

    runs_into_the_host_lock(release, host=host, gpus=[alloc.gpu_id])
    host.refresh_from_db()
    assert host.used_vcpus == booked_vcpus - alloc.vcpus
    assert Gpu.objects.get(uuid=alloc.gpu_id).used_milli == 0
    assert not Allocation.objects.filter(workload=w, active=True).exists()
