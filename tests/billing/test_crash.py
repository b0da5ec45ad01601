"""A metering run in a real Celery worker, SIGKILLed at random points, then run again:
the ledger is exactly right — no second lost, none doubled (invariant 3). Volumes' GiB-seconds
too: they are metered by the same runs (after the workloads, so the kills land before them;
the runs that finish the work meter them, to the same exact totals)."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from decimal import Decimal

import psycopg
import pytest
from django.conf import settings
from django.db.models import Sum

from billing import metering, pricing, services
from billing.models import Account, LedgerEntry, Meter
from billing.tasks import metering_run_task
from gpucloud.celery import app
from scheduler.choices import State
from scheduler.models import Workload
from tests.billing.helpers import at, make_run, make_volume, set_price, set_storage_price, volume_exact
from tests.conftest import broker_clear, make_actor

N = 120
CHUNK = 10  # meters per transaction in the worker (METERING_CHUNK): a run of N is 12 transactions


def start_worker() -> subprocess.Popen:
    db = settings.DATABASES["default"]
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "gpucloud.test_settings",
           "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
           "METERING_CHUNK": str(CHUNK)}
    # Its log goes to a file (a pipe nobody reads would fill and stop it), shown if it fails.
    log = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "gpucloud", "worker", "--pool=solo", "--concurrency=1",
         "--without-gossip", "--without-mingle", "--loglevel=INFO"],
        env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
    )
    deadline = time.monotonic() + 120  # a worker starting on a loaded machine
    try:
        while time.monotonic() < deadline:
            if app.control.ping(timeout=0.5):
                return proc
            assert proc.poll() is None, _tail(log)
        pytest.fail(f"the Celery worker did not start: {_tail(log)}")
    except BaseException:
        proc.kill()  # never left behind to take later tests' tasks
        proc.wait(timeout=30)
        raise


def _tail(log) -> str:
    log.seek(0)
    return log.read()[-3000:]


def test_sigkilled_metering_runs_leave_the_ledger_exact(transactional_db):
    rng = random.Random(20250301)
    from django.core.management import call_command

    call_command("seed_catalog", stdout=open(os.devnull, "w"))
    tenants = [make_actor(f"t{i}@crash.test", tenant_name=f"Crash {i}") for i in range(3)]
    set_price("h100.1x", "2.4900")
    set_price("h100.1x", "2.1700", since=at(2025, 3, 1, 12, 0, 0, 250_000))  # mid-run price change
    workloads = []
    for i in range(N):
        t = at(2025, 3, 1, 8) + timedelta(seconds=rng.randint(0, 4 * 3600), microseconds=rng.randint(0, 999_999))
        steps = [(t, State.PENDING)]
        for _ in range(rng.randint(1, 3)):
            t += timedelta(seconds=rng.randint(1, 600), microseconds=rng.randint(0, 999_999))
            steps.append((t, State.RUNNING))
            t += timedelta(seconds=rng.randint(0, 3 * 3600), microseconds=rng.randint(0, 999_999))
            end = rng.choice([State.PREEMPTED, State.LOST, State.FAILED, None])
            if end is None:
                break
            steps.append((t, end))
            t += timedelta(milliseconds=rng.randint(1, 2000))
            steps.append((t, State.PENDING))
        workloads.append(make_run(rng.choice(tenants), transitions=steps, name=f"w{i}"))
    # volumes too (GiB-seconds): created, grown and deleted at odd moments, a storage price change
    set_storage_price("0.0001")
    set_storage_price("0.0002", since=at(2025, 3, 1, 13, 0, 0, 500_000))
    volumes = []
    for i in range(4):
        t = at(2025, 3, 1, 8) + timedelta(seconds=rng.randint(0, 6 * 3600), microseconds=rng.randint(0, 999_999))
        sizes = [(t, rng.randint(1, 500))]
        for _ in range(rng.randint(0, 2)):
            t += timedelta(seconds=rng.randint(1, 3600), microseconds=rng.randint(0, 999_999))
            sizes.append((t, sizes[-1][1] + rng.randint(1, 100)))
        gone = t + timedelta(seconds=rng.randint(1, 7200)) if rng.random() < 0.5 else None
        volumes.append(make_volume(rng.choice(tenants), name=f"v{i}", sizes=sizes, deleted=gone))
    now = at(2025, 3, 1, 18, 0, 0)
    cutoff = services.metering_cutoff(now)

    # The kill must land mid-run however the two processes are scheduled, so the test
    # holds a gate: a FOR UPDATE lock on one workload row past the kill point. The run
    # meters in key order, CHUNK meters a transaction; the COMMIT of the gate's chunk waits on
    # that lock (the deferred foreign-key check of its ledger entries), so the run cannot get
    # past the gate before the kill, and the meters move a whole chunk at a time.
    # Whether that COMMIT then lands is PostgreSQL's affair: a backend waiting on a lock
    # does not notice its client is gone, so it commits, whole, once the gate opens.
    end = metering.epoch_floor(cutoff)
    billable = {w.pk for w in workloads if metering.running_seconds(
        [(metering.epoch_floor(e.created_at), e.to_state) for e in w.events.order_by("created_at", "id")],
        start=0, end=end) > 0}
    # Meters exist before the first kill: discovery inserts them, and its foreign-key
    # checks would wait on the gate too.
    services.meters_discover(cutoff=cutoff)
    assert Meter.objects.count() == N
    db = settings.DATABASES["default"]

    def connect(**kwargs) -> psycopg.Connection:
        return psycopg.connect(host=db["HOST"], port=db["PORT"], user=db["USER"], dbname=db["NAME"], **kwargs)

    # One session watches the others: a session of its own per look would leave a backend
    # that is still exiting in the next look's list (one did, and failed this test).
    monitor = connect(autocommit=True)

    def backends() -> set[int]:
        """Client sessions on the test database but the monitor's (not autovacuum's workers)."""
        return {pid for (pid,) in monitor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            " AND backend_type = 'client backend'")}

    def sessions(pids: set[int]) -> list[tuple]:
        return monitor.execute("SELECT pid, backend_type, application_name, state, wait_event, left(query, 120)"
                               " FROM pg_stat_activity WHERE pid = ANY(%s)", [list(pids)]).fetchall()

    def waiting_on_a_lock() -> bool:
        return monitor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                               " AND wait_event_type = 'Lock'").fetchone() == (1,)

    kills = 0
    for at_gate in (True, False):  # the first kill lands inside the gate's COMMIT, the second anywhere before it
        advanced = Meter.objects.filter(metered_until=cutoff).count()
        remaining = sorted(m for m in Meter.objects.exclude(metered_until=cutoff).values_list("pk", flat=True))
        # the gate in the first half of what is left, past the first chunk, so both kills land mid-run
        gate = rng.choice([i for i in range(CHUNK, len(remaining) // 2 + 1) if remaining[i] in billable])
        k = gate if at_gate else rng.randint(1, gate)
        before = k // CHUNK * CHUNK  # meters the run gets through before the kill: whole chunks
        gated = (gate // CHUNK + 1) * CHUNK  # ...and at most: through the gate's chunk, if its COMMIT lands
        ours = backends()
        # The worker's one task is this run: the last run's task, left unacknowledged by its
        # killed worker, or anything else queued would take the solo worker first and may wait
        # on the gate below (the worker then answers no ping).
        broker_clear()
        with connect() as lock:
            assert lock.execute(f"SELECT 1 FROM {Workload._meta.db_table} WHERE id = %s FOR UPDATE",
                                [remaining[gate]]).fetchone() == (1,)
            worker = start_worker()  # killed if it does not answer: never left to take later tests' tasks
            try:
                metering_run_task.delay(now.isoformat())
                deadline = time.monotonic() + 60
                while ((Meter.objects.filter(metered_until=cutoff).count() < advanced + before
                        or (at_gate and not waiting_on_a_lock())) and time.monotonic() < deadline):
                    time.sleep(0.01)
                assert waiting_on_a_lock() or not at_gate, "the run waits at the gate"
                worker.send_signal(signal.SIGKILL)  # mid-run, maybe mid-transaction
                kills += 1
            finally:
                worker.kill()
                worker.wait(timeout=30)
            lock.rollback()
        deadline = time.monotonic() + 30  # the killed worker's backend finishes or aborts
        while (left := backends() - ours) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not left, sessions(left)
        assert advanced + before <= Meter.objects.filter(metered_until=cutoff).count() <= advanced + gated
    monitor.close()
    broker_clear()  # the killed runs' tasks are not left for a later worker
    done = Meter.objects.filter(metered_until=cutoff).count()
    assert 0 < done < N, "the kills landed mid-run"

    services.metering_run(now=now)  # run again, to the same cutoff
    services.metering_run(now=now)  # ...and once more: nothing changes

    for w in workloads:
        events = [(metering.epoch_floor(e.created_at), e.to_state) for e in w.events.order_by("created_at", "id")]
        prices = [(metering.epoch_ceil(p.effective_from), p.per_hour) for p in
                  w.instance_type.prices.filter(region=w.region, kind="on_demand").order_by("effective_from")]
        parts = metering.slices(events=events, prices=prices, start=metering.epoch_floor(w.created_at), end=end)
        posted = LedgerEntry.objects.filter(workload=w)
        assert sum(e.seconds for e in posted) == metering.running_seconds(events, start=0, end=end), w.name
        exact = sum((p.price_seconds() for p in parts), Decimal(0))
        assert -sum((e.amount for e in posted), Decimal(0)) == pricing.micro_of_price_seconds(exact), w.name
    for v in volumes:  # metered by the same runs, after the workloads: exact and once
        gib_s, exact = volume_exact(v, end=end)
        posted = LedgerEntry.objects.filter(volume=v)
        assert sum(e.gib * e.seconds for e in posted) == gib_s, v.name
        assert -sum((e.amount for e in posted), Decimal(0)) == pricing.micro_of_price_seconds(exact), v.name
    for actor in tenants:
        total = LedgerEntry.objects.filter(tenant=actor.tenant).aggregate(s=Sum("amount"))["s"]
        assert Account.objects.get(tenant=actor.tenant).balance == total
    assert kills == 2
