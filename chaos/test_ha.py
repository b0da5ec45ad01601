"""Chaos: the HA profile's topology as real processes on 127.0.0.1, under API load.

haproxy (deploy/haproxy.cfg's policy) in front of two gunicorn webs, two Celery workers,
two beats (celery-redbeat: one fires, the other waits on its lock), PostgreSQL (the test
database) and Redis (the suite's REDIS_URL / CELERY_BROKER_URL databases), two simulated
GPU hosts (real agents, sim backend) reporting through the proxy. While clients launch, run
and stop instances through the proxy, the test SIGKILLs

1. a worker in the middle of a scheduling cycle,
2. a worker in the middle of a metering run,
3. one web replica (gunicorn master and workers) with requests in flight,

each kill gated on observed state (a row lock the victim is seen waiting on in
pg_stat_activity), never on sleeps, and restarts the victim as a supervisor would. Then:
no GPU was double-booked, every RUNNING second is billed exactly once (the ledger equals the
transition log, as tests/billing/test_crash.py checks), no request failed but those in
flight on the killed web, and only one beat fired. Recovery times are printed.

"In flight on the killed web" is haproxy's word, not a time window: every load request carries
an X-Request-Id, haproxy logs each one (`option httplog`, the id captured) with the server it
went to and its termination state, and each request the client saw fail must be logged as
sent to web1 and broken there: by the server side (state S...), or by haproxy when its checks
marked web1 down (D..., `on-marked-down shutdown-sessions`: a loaded machine saw requests sent
to the restarted web1, queued in its listening socket while its workers booted, killed so when
the checks that had failed since the SIGKILL marked it down). Load requests go one per client
connection (`Connection: close`): on a reused client connection, a server that resets a request
it never answered makes haproxy close the client connection silently and log nothing (it
expects the client to retry; http_ana.c, abort_keep_alive), which no log could attribute.

Run with `make chaos` (CI runs it after `make test`). Bounded: about two minutes.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

import psycopg
import pytest
import redis
import requests
from django.conf import settings

pytestmark = pytest.mark.django_db(transaction=True)

LOAD_CLIENTS = 2
TYPES = ["h100.1x", "h100.2x"]
# The platform's pace, sped up so the test is short: ticks, metering windows, heartbeats.
PLATFORM_ENV = {
    "SCHEDULER_TICK_S": "1", "METERING_INTERVAL_S": "2", "METERING_SETTLE_S": "1",
    "AGENT_HEARTBEAT_INTERVAL_S": "1", "HOST_DOWN_AFTER_S": "60", "API_RATE_LIMIT": "100000/min",
    "BEAT_LOCK_TIMEOUT_S": "30", "PYTHONUNBUFFERED": "1",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout_s: float, what: str, interval_s: float = 0.1):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s: {what}"
        time.sleep(interval_s)


@dataclass
class Proc:
    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    popen: subprocess.Popen | None = None
    # What stop() sends first. haproxy's is SIGUSR1, its soft stop: it closes its listeners,
    # finishes every stream in progress (each one writing its log line as it ends) and exits;
    # SIGTERM would exit at once, possibly before the line of a request already answered.
    stop_signal: int = signal.SIGTERM

    def start(self) -> Proc:
        with self.log.open("a") as out:
            self.popen = subprocess.Popen(self.argv, env=self.env, cwd=settings.BASE_DIR, stdout=out,
                                          stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def kill(self) -> None:
        """SIGKILL the process group: the process and whatever it forked (gunicorn's workers).

        Returns once no thread of the group runs any more: the master is reaped, and its
        workers, reparented elsewhere, are gone or zombies. A thread exits its files before it
        becomes a zombie, so the group's sockets (gunicorn's listening one) are closed by then.
        """
        assert self.popen is not None
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.popen.wait(timeout=30)
        wait_for(lambda: not _group_threads(self.popen.pid), 30, f"every process of {self.name} is gone", 0.01)

    def stop(self) -> None:
        if self.popen is None:
            return
        try:
            os.killpg(self.popen.pid, self.stop_signal)
            self.popen.wait(timeout=15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.popen.wait(timeout=30)


@dataclass
class Request:
    started: float
    ended: float
    what: str
    ok: bool
    detail: str = ""
    rid: str = ""  # its X-Request-Id, which haproxy's log captures


@dataclass
class Load:
    base: str
    key: str
    requests: list[Request] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)
    launched: list[str] = field(default_factory=list)
    cycles: int = 0
    inflight: int = 0

    def call(self, session: requests.Session, method: str, path: str, **kwargs) -> requests.Response | None:
        rid = str(uuid.uuid4())
        # One client connection per request: see the module's docstring.
        headers = {"X-Request-Id": rid, "Connection": "close"}
        with self.lock:
            self.inflight += 1
            t0 = time.monotonic()
        try:
            resp = session.request(method, self.base + path, headers=headers, timeout=30, **kwargs)
            ok, detail = resp.status_code < 500, str(resp.status_code)
        except requests.RequestException as exc:
            resp, ok, detail = None, False, repr(exc)
        with self.lock:
            self.inflight -= 1
            self.requests.append(Request(t0, time.monotonic(), f"{method} {path}", ok, detail, rid))
        return resp if ok else None

    def client(self, n: int) -> None:
        session = requests.Session()
        session.headers["Authorization"] = f"Bearer {self.key}"
        i = 0
        while not self.stop.is_set():
            resp = self.call(session, "POST", "/api/v1/instances", json={
                "name": f"load-{n}-{i}", "instance_type": TYPES[(n + i) % len(TYPES)], "region": "us-east-1",
                "image": "pytorch/pytorch:2.4.0", "billing": "on_demand", "priority": "standard"})
            i += 1
            if resp is None or resp.status_code != 201:
                continue
            wid = resp.json()["id"]
            with self.lock:
                self.launched.append(wid)
            deadline = time.monotonic() + 60
            while not self.stop.is_set() and time.monotonic() < deadline:
                got = self.call(session, "GET", f"/api/v1/instances/{wid}")
                if got is not None and got.json()["state"] == "running":
                    break
                time.sleep(0.2)
            self.call(session, "GET", "/api/v1/instances")
            for _ in range(3):  # a stop lost with a killed web is sent again
                if self.call(session, "POST", f"/api/v1/instances/{wid}/stop") is not None:
                    break
            deadline = time.monotonic() + 60
            while not self.stop.is_set() and time.monotonic() < deadline:
                got = self.call(session, "GET", f"/api/v1/instances/{wid}")
                if got is not None and got.json()["state"] == "stopped":
                    break
                time.sleep(0.2)
            with self.lock:
                self.cycles += 1


def ha_binary() -> str:
    path = shutil.which("haproxy") or ("/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None)
    assert path, "haproxy is not installed (apt-get install haproxy; .ci/run installs it)"
    return path


def test_ha_topology_survives_killed_workers_and_web(tmp_path: Path, capsys):
    from django.core.management import call_command

    from agents.models import Host
    from agents.services.registration import bootstrap_token_create
    from billing import metering, pricing
    from billing.models import LedgerEntry, Meter
    from gpucloud.catalogue.models import Region
    from scheduler.choices import State
    from scheduler.models import Allocation, Workload
    from tests.conftest import broker_clear, make_actor

    call_command("seed_catalog", stdout=open(os.devnull, "w"))
    load_actor = make_actor("load@chaos.test", tenant_name="Chaos Load")
    gate_actor = make_actor("gate@chaos.test", tenant_name="Chaos Gate")
    region = Region.objects.get(code="us-east-1")

    db = settings.DATABASES["default"]
    dsn = f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    broker = settings.CELERY_BROKER_URL
    r = redis.Redis.from_url(broker)
    for key in r.scan_iter("redbeat*"):  # a lock left by an earlier run would stall our beat
        r.delete(key)
    broker_clear()

    base_env = {**os.environ, **PLATFORM_ENV, "DJANGO_SETTINGS_MODULE": "gpucloud.test_settings"}
    py = sys.executable
    webs = {name: free_port() for name in ("web1", "web2")}
    proxy_port = free_port()
    url = f"http://127.0.0.1:{proxy_port}"

    def platform(name: str, argv: list[str]) -> Proc:
        env = {**base_env, "DATABASE_URL": f"{dsn}?application_name=chaos-{name}"}
        return Proc(name, argv, env, tmp_path / f"{name}.log")

    procs: dict[str, Proc] = {}
    for name, port in webs.items():
        procs[name] = platform(name, [py, "-m", "gunicorn", "gpucloud.wsgi", "--bind", f"127.0.0.1:{port}",
                                      "--workers", "2", "--worker-class", "gthread", "--threads", "4",
                                      "--worker-tmp-dir", "/dev/shm", "--graceful-timeout", "5"])
    for name in ("worker1", "worker2"):
        procs[name] = platform(name, [py, "-m", "celery", "-A", "gpucloud", "worker", "--pool=solo",
                                      "--without-gossip", "--without-mingle", "--loglevel=INFO",
                                      "-n", f"{name}@%h"])
    for name in ("beat1", "beat2"):
        procs[name] = platform(name, [py, "-m", "celery", "-A", "gpucloud", "beat", "--loglevel=INFO"])
    # deploy/haproxy.cfg, with the replicas' loopback addresses.
    cfg = (settings.BASE_DIR / "deploy" / "haproxy.cfg").read_text()
    cfg = cfg.replace("bind *:8000", f"bind 127.0.0.1:{proxy_port}")
    cfg = cfg.replace("server web1 web:8000", f"server web1 127.0.0.1:{webs['web1']}")
    cfg = cfg.replace("server web2 web2:8000", f"server web2 127.0.0.1:{webs['web2']}")
    assert "log stdout" in cfg and "capture request header X-Request-Id" in cfg  # the log the test reads
    (tmp_path / "haproxy.cfg").write_text(cfg)
    procs["proxy"] = Proc("proxy", [ha_binary(), "-db", "-f", str(tmp_path / "haproxy.cfg")], dict(os.environ),
                          tmp_path / "proxy.log", stop_signal=signal.SIGUSR1)
    for i in range(2):
        _, secret = bootstrap_token_create(region=region, note=f"chaos host {i}")
        procs[f"agent{i}"] = Proc(f"agent{i}", [
            py, "-m", "agents.host", "--server", url, "--gpu-backend", "sim", "--runtime", "sim",
            "--sim-model", "H100", "--sim-gpus", "8", "--sim-seed", str(i), "--hostname", f"chaos-h100-{i}",
            "--state-dir", str(tmp_path / f"agent{i}"), "--log-level", "WARNING",
        ], {**os.environ, "GPUCLOUD_BOOTSTRAP_TOKEN": secret}, tmp_path / f"agent{i}.log")

    load = Load(url, load_actor.key)
    t_web_kill = t_web_gone = float("inf")
    threads: list[threading.Thread] = []
    report: list[str] = []

    def connect(**kwargs) -> psycopg.Connection:
        return psycopg.connect(host=db["HOST"], port=db["PORT"], user=db["USER"], dbname=db["NAME"], **kwargs)

    def waiting_worker(table: str) -> str | None:
        """The worker whose backend waits on a row lock of `table` (FOR UPDATE), if any."""
        with connect(autocommit=True) as c:
            row = c.execute(
                "SELECT application_name FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock' AND application_name LIKE 'chaos-worker%%'"
                " AND query ILIKE %s AND query ILIKE '%%FOR UPDATE%%'", [f"%{table}%"]).fetchone()
        return row[0].removeprefix("chaos-") if row else None

    def instance_state(key: str, wid: str) -> str | None:
        resp = requests.get(f"{url}/api/v1/instances/{wid}", headers={"Authorization": f"Bearer {key}"},
                            timeout=10)
        return resp.json()["state"] if resp.status_code == 200 else None

    try:
        t_start = time.monotonic()
        for proc in procs.values():
            if not proc.name.startswith("agent"):
                proc.start()
        wait_for(lambda: requests.get(f"{url}/healthz", timeout=2).ok if _up(proxy_port) else False, 90,
                 "the proxy answers")
        for name in ("agent0", "agent1"):
            procs[name].start()
        wait_for(lambda: Host.objects.filter(state="ready").count() == 2, 90, "both hosts READY", 0.3)
        report.append(f"topology up in {time.monotonic() - t_start:.1f} s")

        # An instance that runs all along: its meter is the metering kill's gate.
        session = requests.Session()
        session.headers["Authorization"] = f"Bearer {load_actor.key}"
        anchor = session.post(f"{url}/api/v1/instances", json={
            "name": "anchor", "instance_type": "h100.1x", "region": "us-east-1", "image": "busybox",
            "billing": "on_demand", "priority": "standard"}, timeout=30).json()["id"]
        wait_for(lambda: instance_state(load_actor.key, anchor) == "running", 60, "the anchor runs", 0.3)

        threads = [threading.Thread(target=load.client, args=(n,), daemon=True) for n in range(LOAD_CLIENTS)]
        for t in threads:
            t.start()
        wait_for(lambda: load.cycles >= 2, 90, "the load runs", 0.3)

        # 1. A worker mid-cycle: the gate tenant's row is held (FOR NO KEY UPDATE: its new
        #    workload's foreign key passes, the cycle's quota lock FOR UPDATE waits).
        with connect() as gate:
            gate.execute("SELECT 1 FROM tenancy_tenant WHERE id = %s FOR NO KEY UPDATE", [gate_actor.tenant.pk])
            resp = requests.post(f"{url}/api/v1/instances", headers={"Authorization": f"Bearer {gate_actor.key}"},
                                 json={"name": "gated", "instance_type": "h100.1x", "region": "us-east-1",
                                       "image": "busybox", "billing": "on_demand", "priority": "standard"},
                                 timeout=30)
            assert resp.status_code == 201, resp.text
            gated = resp.json()["id"]
            victim = wait_for(lambda: waiting_worker("tenancy_tenant"), 60, "a cycle waits at the gate")
            procs[victim].kill()
            t_kill = time.monotonic()
            procs[victim].start()
            gate.rollback()
        wait_for(lambda: instance_state(gate_actor.key, gated) == "running", 60, "the gated instance runs", 0.2)
        report.append(f"worker killed mid-cycle ({victim}): the gated instance RUNNING "
                      f"{time.monotonic() - t_kill:.1f} s after the kill")

        # 2. A worker mid-metering: the anchor's meter row is held; a run reaches it and waits.
        wait_for(lambda: Meter.objects.filter(pk=anchor).exists(), 60, "the anchor is metered", 0.3)
        with connect() as gate:
            before = gate.execute("SELECT metered_until FROM billing_meter WHERE workload_id = %s FOR UPDATE",
                                  [anchor]).fetchone()[0]
            victim = wait_for(lambda: waiting_worker("billing_meter"), 60, "a metering run waits at the gate")
            procs[victim].kill()
            t_kill = time.monotonic()
            procs[victim].start()
            gate.rollback()
        wait_for(lambda: Meter.objects.get(pk=anchor).metered_until > before, 60, "metering goes on", 0.2)
        report.append(f"worker killed mid-metering ({victim}): the anchor metered again "
                      f"{time.monotonic() - t_kill:.1f} s after the kill")

        # 3. One web replica, under load: every request in flight on it may fail, no other.
        wait_for(lambda: load.inflight > 0, 30, "requests in flight", 0.002)
        t_web_kill = time.monotonic()
        procs["web1"].kill()
        t_web_gone = time.monotonic()
        # Every process gone: its listening socket is closed, a connection to it is refused (and
        # haproxy sends the request to web2 instead).
        wait_for(lambda: not _up(webs["web1"]), 10, "web1's port refuses connections", 0.01)
        served_after = wait_for(lambda: _first_ok_after(load, t_web_gone), 30, "a request served after the kill",
                                0.05)
        n = load.cycles
        wait_for(lambda: load.cycles >= n + 2, 90, "the load goes on", 0.3)
        procs["web1"].start()
        wait_for(lambda: _up(webs["web1"]), 60, "web1 restarted")
        report.append(f"web1 killed under load: next request served {served_after - t_web_kill:.2f} s later; "
                      f"web1 back after {time.monotonic() - t_web_kill:.1f} s")
        n = load.cycles
        wait_for(lambda: load.cycles >= n + 2, 90, "the load goes on with both webs", 0.3)
    finally:
        load.stop.set()
        for t in threads:
            t.join(timeout=60)
        logs = {name: proc.log.read_text() if proc.log.exists() else "" for name, proc in procs.items()}
        # Stop everything; what the platform still owed (stopping instances) is finished below.
        # The proxy goes last, once no client of it is left, with its soft stop: it exits when
        # its last stream has ended and been logged.
        for proc in sorted(procs.values(), key=lambda proc: proc is procs["proxy"]):
            proc.stop()
    # No platform process left a session behind (pytest-django drops this database at the end).
    wait_for(lambda: not _sessions(connect), 30, "the platform's database sessions end", 0.1)
    logs["proxy"] = procs["proxy"].log.read_text()  # read once haproxy is stopped: every line is in

    # No request failed but those haproxy sent to the killed web1 and that web1 broke (the
    # server side ended them: termination state S...), once it was killed.
    dispatched = _haproxy_requests(logs["proxy"])
    unlogged = [q for q in load.requests if q.rid not in dispatched]
    assert not unlogged, ("requests haproxy never logged (lost before the proxy, or its log format changed)",
                          [(q.what, q.detail, q.rid) for q in unlogged[:10]], logs["proxy"][-3000:])
    failed = [q for q in load.requests if not q.ok]
    stray = [(q.what, q.detail, round(q.started - t_web_kill, 3), dispatched[q.rid]) for q in failed
             if dispatched[q.rid][0] != "web1" or dispatched[q.rid][2][:1] not in ("S", "D") or q.ended < t_web_kill]
    assert not stray, stray
    states = sorted({f"{dispatched[q.rid][1]} {dispatched[q.rid][2]}" for q in failed})
    report.append(f"{len(load.requests)} requests through the proxy, {len(failed)} failed, each sent to the killed "
                  f"web1 by haproxy and broken there ({', '.join(states) or 'none'}); web1's processes all gone "
                  f"{(t_web_gone - t_web_kill) * 1000:.0f} ms after the SIGKILL")

    # No GPU double-booked, now or at any point (the allocation log keeps every allocation).
    with connect(autocommit=True) as c:
        assert c.execute("SELECT gpu_id, sum(milli) FROM scheduler_allocation WHERE active"
                         " GROUP BY gpu_id HAVING sum(milli) > 1000").fetchall() == []
        overlaps = c.execute("""
            SELECT a.gpu_id FROM scheduler_allocation a JOIN scheduler_allocation b
              ON a.gpu_id = b.gpu_id AND a.id < b.id AND a.milli + b.milli > 1000
             AND a.created_at < coalesce(b.released_at, 'infinity')
             AND b.created_at < coalesce(a.released_at, 'infinity')""").fetchall()
        assert overlaps == [], overlaps
    assert Allocation.objects.count() >= 4

    # Every RUNNING second billed once: the ledger equals the transition log up to each meter's watermark.
    billed = 0
    for w in Workload.objects.filter(meter__isnull=False).select_related("meter", "instance_type"):
        end = metering.epoch_floor(w.meter.metered_until)
        events = [(metering.epoch_floor(e.created_at), e.to_state) for e in w.events.order_by("created_at", "id")]
        prices = [(metering.epoch_ceil(p.effective_from), p.per_hour) for p in
                  w.instance_type.prices.filter(region=w.region, kind="on_demand").order_by("effective_from")]
        parts = metering.slices(events=events, prices=prices, start=metering.epoch_floor(w.created_at), end=end)
        posted = LedgerEntry.objects.filter(workload=w)
        seconds = sum(e.seconds for e in posted)
        assert seconds == metering.running_seconds(events, start=0, end=end), w.name
        exact = sum((p.price_seconds() for p in parts), Decimal(0))
        assert -sum((e.amount for e in posted), Decimal(0)) == pricing.micro_of_price_seconds(exact), w.name
        billed += seconds
    assert billed > 0 and Meter.objects.count() >= 4
    assert State.RUNNING in set(Workload.objects.values_list("events__to_state", flat=True))

    # One beat fired; the other waited on the lock.
    fired = [name for name in ("beat1", "beat2") if "Sending due task" in logs[name]]
    assert len(fired) == 1, {name: logs[name][-1500:] for name in ("beat1", "beat2")}

    for key in r.scan_iter("redbeat*"):
        r.delete(key)
    with capsys.disabled():
        print("\nchaos: " + "\nchaos: ".join(report + [f"{billed} RUNNING seconds billed exactly, "
                                                       f"{load.cycles} launch/run/stop cycles, beat: {fired[0]}"]))


def _up(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def _group_threads(pgid: int) -> list[str]:
    """The threads of process group `pgid` not yet exited (neither zombie nor dead), as pid/tid."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/task/[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # it exited while we looked
            continue
        state, _ppid, pgrp = text[text.rindex(")") + 2:].split()[:3]
        if int(pgrp) == pgid and state not in ("Z", "X", "x"):
            alive.append(f"{stat.parts[2]}/{stat.parts[4]}")
    return alive


# haproxy's `option httplog` line: ... frontend backend/server Tq/Tw/Tc/Tr/Ta status bytes
# cookie cookie termination-state conns queues {captured X-Request-Id} "request line".
HTTPLOG = re.compile(r" (?P<backend>\S+)/(?P<server>\S+) \S+ (?P<status>-?\d+) \S+ \S+ \S+ (?P<state>\S{4}) "
                     r"\S+ \S+ \{(?P<rid>[^|}]*)")


def _haproxy_requests(log: str) -> dict[str, tuple[str, str, str]]:
    """X-Request-Id -> (server, status, termination state), from haproxy's log."""
    return {m["rid"]: (m["server"], m["status"], m["state"]) for m in map(HTTPLOG.search, log.splitlines())
            if m and m["rid"]}


def _sessions(connect) -> list[tuple]:
    """The platform processes' sessions on the test database (their application_name is chaos-*)."""
    with connect(autocommit=True) as c:
        return c.execute("SELECT pid, application_name, state, left(query, 120) FROM pg_stat_activity"
                         " WHERE datname = current_database() AND application_name LIKE 'chaos-%'").fetchall()


def _first_ok_after(load: Load, t: float) -> float | None:
    with load.lock:
        oks = [q.ended for q in load.requests if q.ok and q.started > t]
    return min(oks) if oks else None
