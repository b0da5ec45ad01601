"""Benchmark the heartbeat path over real HTTP against a real server and PostgreSQL.

    python manage.py bench_heartbeats [--hosts 200] [--seconds 10] [--concurrency 8]
        [--workers W] [--threads T] [--json]

In a throwaway database (`test_<name>`, created and dropped here, as bench_scheduler
does): a region, bootstrap tokens; then a gunicorn server (`--workers`, default one per
CPU; `--threads` > 1 uses the gthread worker, which keeps connections alive) on
127.0.0.1 in a subprocess. N simulated hosts with 8 GPUs each register through
`POST /agent/v1/register` (the agent's own client), then C client threads send
heartbeats (8 GPU samples each, containers `[]`) round-robin over the hosts for S
seconds. Printed: heartbeats/s, p50/p99/max latency, errors. The per-host rate limit is
raised for the run (the bench sends far more than 12 per minute per host); the throttle
itself still runs, in the shared cache.

While it runs, a thread of this process does what the beat task
`agents.tasks.heartbeats_flush_task` does every second (`agents.fastpath.heartbeats_flush`),
on the same cores, so its cost is in the figures; at the end it flushes once more and
counts the stored samples (`samples_stored` must equal `samples_expected`: nothing lost).
"""

from __future__ import annotations

import http.client
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from decimal import Decimal
from pathlib import Path

from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import connection, connections

from agents.fastpath import heartbeats_flush
from agents.host.client import ControlPlaneClient
from agents.host.sim import SimGpuBackend
from agents.models import GpuSample
from agents.protocol import HEARTBEAT_PATH, Heartbeat, RegisterRequest
from agents.services.registration import bootstrap_token_create
from gpucloud.catalogue.models import GpuModel, Quota, Region
from gpucloud.lib.db import bench_database
from gpucloud.tenancy.services import tenant_create
from scheduler.cycle import run_cycle
from scheduler.models import Workload, WorkloadEvent
from scheduler.services import WorkloadSpec, workload_launch

REPO = Path(__file__).resolve().parents[3]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _percentile(sorted_ms: list[float], q: float) -> float:
    if not sorted_ms:
        return 0.0
    i = min(len(sorted_ms) - 1, max(0, round(q * (len(sorted_ms) - 1))))
    return round(sorted_ms[i], 2)


class Command(BaseCommand):
    help = "Heartbeats per second and their latency, over HTTP against a real server."

    def add_arguments(self, parser):
        parser.add_argument("--hosts", type=int, default=200)
        parser.add_argument("--seconds", type=float, default=10.0)
        parser.add_argument("--concurrency", type=int, default=8)
        parser.add_argument("--workers", type=int, default=os.cpu_count() or 2,
                            help="gunicorn worker processes (default: one per CPU)")
        parser.add_argument("--threads", type=int, default=4,
                            help="threads per worker (gthread); 1: the sync worker")
        parser.add_argument("--changed", type=int, default=0, metavar="K",
                            help="instead: heartbeats that report K container transitions each "
                                 "(K in 1, 2, 4, 8: each host runs K jobs of 8/K GPUs)")
        parser.add_argument("--profile-dir", default="",
                            help="with --changed: cProfile every request, web-<pid>.prof files here")
        parser.add_argument("--json", action="store_true", help="print one JSON object")

    def handle(self, *args, hosts, seconds, concurrency, workers, threads, **options):
        if options["changed"]:
            if options["changed"] not in (1, 2, 4, 8):
                raise CommandError("--changed must be 1, 2, 4 or 8")
            return self._changed(hosts, options["changed"], concurrency, workers, threads, options["json"],
                                 options["profile_dir"])
        if hosts < 1 or seconds <= 0 or concurrency < 1 or workers < 1:
            raise CommandError("--hosts, --seconds, --concurrency and --workers must be positive")
        if connection.vendor != "postgresql":
            raise CommandError("the benchmark needs PostgreSQL (set DATABASE_URL)")
        server = None
        with bench_database():
            try:
                tokens = _prepare(hosts)
                db = connection.settings_dict
                connections.close_all()  # the server's workers use the database from now on
                port = _free_port()
                server = _start_server(db, port, workers, threads)
                url = f"http://127.0.0.1:{port}"
                registered = _register(url, tokens)
                flusher = _Flusher()
                flusher.start()
                cpu0: list[float] = []
                out = _blast(port, registered, seconds, concurrency,
                             on_start=lambda: cpu0.extend((_cpu_s(server.pid), time.process_time())))
                server_cpu, own_cpu = _cpu_s(server.pid) - cpu0[0], time.process_time() - cpu0[1]
                flusher.stop()
                # CPU per timed heartbeat (after the warm-up) of the gunicorn workers, and of this
                # process (the client threads and the flusher): figures that depend less on what
                # else the machine runs than throughput does.
                n = out["heartbeats"] + out["errors"]
                out["server_cpu_ms_per_heartbeat"] = round(server_cpu * 1000 / n, 2) if n else 0.0
                out["bench_cpu_ms_per_heartbeat"] = round(own_cpu * 1000 / n, 2) if n else 0.0
                out.update(flusher.stats())
                # every heartbeat stores 8 samples: the timed ones and one warm-up per host
                out["samples_expected"] = (out["heartbeats"] + hosts) * 8
                out.update(hosts=hosts, gpus=hosts * 8, concurrency=concurrency, workers=workers,
                           threads=threads, seconds=seconds, loadavg_1m=round(os.getloadavg()[0], 2))
            finally:
                _stop_server(server)
        if options["json"]:
            self.stdout.write(json.dumps(out))
        else:
            for key, value in out.items():
                self.stdout.write(f"{key:>20}: {value}")


    def _changed(self, hosts: int, k: int, concurrency: int, workers: int, threads: int, as_json: bool,
                 profile_dir: str):
        """Heartbeats that change something: each host gets K jobs placed by a real scheduling
        cycle, then (one phase at a time, every host in it) a heartbeat that picks the
        placements up (containers `[]`, the answer is new), one that reports all K running,
        one that reports all K exited 0, and one with the containers removed. Server CPU
        per heartbeat of each phase, and the transitions it made."""
        if connection.vendor != "postgresql":
            raise CommandError("the benchmark needs PostgreSQL (set DATABASE_URL)")
        server = None
        with bench_database():
            try:
                tokens, tenant, region = _prepare_changed(hosts)
                db = connection.settings_dict
                port = _free_port()
                server = _start_server(db, port, workers, threads, profile_dir)
                registered = _register(f"http://127.0.0.1:{port}", tokens)
                _blast_phase(port, registered, concurrency, lambda i: [])  # a first, untimed beat each
                _place(tenant, region, hosts, k)
                connections.close_all()
                out = _changed_phases(port, registered, concurrency, k, server.pid)
                out.update(hosts=hosts, containers_per_heartbeat=k, workers=workers, threads=threads,
                           concurrency=concurrency, loadavg_1m=round(os.getloadavg()[0], 2))
            finally:
                _stop_server(server)
        if as_json:
            self.stdout.write(json.dumps(out))
        else:
            for key, value in out.items():
                self.stdout.write(f"{key:>20}: {value}")


def _stop_server(server: subprocess.Popen | None) -> None:
    """SIGTERM the benchmark's gunicorn, SIGKILL if it has not gone in 20 s."""
    if server is None:
        return
    server.send_signal(signal.SIGTERM)
    try:
        server.wait(timeout=20)
    except subprocess.TimeoutExpired:
        server.kill()


def _prepare_changed(n: int):
    """The catalogue (seed_catalog), a tenant free to run n*8 GPUs, one token per host."""
    call_command("seed_catalog", stdout=open(os.devnull, "w"))
    region = Region.objects.get(code="us-east-1")
    user = get_user_model().objects.create_user(username="bench@hb.test", email="bench@hb.test",
                                                password=secrets.token_urlsafe(16))
    tenant = tenant_create(name="Bench", owner=user)
    Quota.objects.update_or_create(tenant=tenant, gpu_model=None, region=None,
                                   defaults={"max_gpus": 1_000_000, "max_instances": 1_000_000})
    return [bootstrap_token_create(region=region)[1] for _ in range(n)], tenant, region


def _place(tenant, region, hosts: int, k: int) -> None:
    """hosts*k jobs of 8/k GPUs, placed by scheduling cycles (k per host: they fill it)."""
    for i in range(hosts * k):
        workload_launch(tenant=tenant, spec=WorkloadSpec(
            kind="job", name=f"hb-{i}", instance_type=f"h100.{8 // k}x", region=region.code,
            image="busybox", command=["true"]))
    for _ in range(20):
        run_cycle(region_id=region.pk)
        if not Workload.objects.filter(state="pending").exists():
            return
    raise CommandError("the scheduler did not place every job")


def _blast_phase(port: int, hosts: list[tuple[str, bytes, bytes]], concurrency: int, containers,
                 seq: int = 1) -> tuple[list, int]:
    """One heartbeat per host with `containers(i)` as its container report, C threads;
    returns each host's answer (its `desired`) and the errors."""
    answers: list = [None] * len(hosts)
    errors = [0]

    def client(k: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        for i in range(k, len(hosts), concurrency):
            token, head, tail = hosts[i]
            body = json.loads(head + b'"seq": %d' % seq + tail)
            body["containers"] = containers(i)
            try:
                conn.request("POST", HEARTBEAT_PATH, body=json.dumps(body).encode(), headers={
                    "Content-Type": "application/json", "Authorization": f"Bearer {token}"})
                resp = conn.getresponse()
                data = resp.read()
            except (OSError, http.client.HTTPException):
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                errors[0] += 1
                continue
            if resp.status != 200:
                errors[0] += 1
            else:
                answers[i] = json.loads(data).get("desired", [])

    threads = [threading.Thread(target=client, args=(k,)) for k in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return answers, errors[0]


def _changed_phases(port: int, hosts: list, concurrency: int, k: int, server_pid: int) -> dict:
    out: dict = {}
    desired: list = [[]] * len(hosts)

    def running(i: int) -> list:
        return [{"instance_id": d["instance_id"], "state": "running"} for d in desired[i]]

    def exited(i: int) -> list:
        return [{"instance_id": d["instance_id"], "state": "exited", "exit_code": 0} for d in desired[i]]

    phases = [("pickup", lambda i: []), ("running", running), ("exited", exited), ("removed", lambda i: [])]
    for n, (name, containers) in enumerate(phases, start=2):
        ev0, cpu0, t0 = WorkloadEvent.objects.count(), _cpu_s(server_pid), time.perf_counter()
        answers, errors = _blast_phase(port, hosts, concurrency, containers, seq=n)
        cpu, dt = _cpu_s(server_pid) - cpu0, time.perf_counter() - t0
        if name == "pickup":
            desired = [a or [] for a in answers]
            got = sum(len(d) for d in desired)
            if got != len(hosts) * k:
                raise CommandError(f"the answers carried {got} placements, not {len(hosts) * k}")
        out[name] = {"server_cpu_ms_per_heartbeat": round(cpu * 1000 / len(hosts), 2),
                     "transitions_per_heartbeat": round((WorkloadEvent.objects.count() - ev0) / len(hosts), 2),
                     "heartbeats_per_s": round(len(hosts) / dt, 1), "errors": errors}
    return out


def _prepare(n: int) -> list[str]:
    """A region, the H100 model and one bootstrap token per host, in the test database."""

    region = Region.objects.create(code="bench-1", name="Bench", country="US")
    GpuModel.objects.create(code="H100", name="H100", vendor="nvidia", memory_gib=80,
                            bf16_tflops=Decimal("989.4"), interconnect="NVLink")
    return [bootstrap_token_create(region=region)[1] for _ in range(n)]


class _Flusher(threading.Thread):
    """The beat task's job, every second, in this process: buffered heartbeats -> database."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.halt = threading.Event()
        self.ms: list[float] = []
        self.flushed = 0

    def run(self) -> None:
        try:
            while not self.halt.wait(1.0):
                t0 = time.perf_counter()
                self.flushed += heartbeats_flush().heartbeats
                self.ms.append((time.perf_counter() - t0) * 1000)
        finally:
            connections.close_all()

    def stop(self) -> None:
        self.halt.set()
        self.join()

    def stats(self) -> dict:
        self.flushed += heartbeats_flush().heartbeats
        return {
            "flushes": len(self.ms),
            "flush_max_ms": round(max(self.ms, default=0.0), 1),
            "flushed_heartbeats": self.flushed,
            "samples_stored": GpuSample.objects.count(),
        }


def _cpu_s(master: int) -> float:
    """User + system CPU seconds of the gunicorn master's worker processes, from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == master:  # ppid
            total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return total


def _start_server(db: dict, port: int, workers: int, threads: int, profile_dir: str = "") -> subprocess.Popen:
    user = db.get("USER") or ""
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://{user}{password}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "DEBUG": "0",
        "SECRET_KEY": os.environ.get("SECRET_KEY") or secrets.token_urlsafe(32),
        "ALLOWED_HOSTS": "127.0.0.1",
        "SECURE_SSL_REDIRECT": "0",  # plain http on 127.0.0.1, no TLS proxy in front
        "AGENT_RATE_LIMIT": "1000000/min",
        "DJANGO_SETTINGS_MODULE": "gpucloud.settings",
    }
    cmd = [sys.executable, "-m", "gunicorn", "gpucloud.wsgi", "--bind", f"127.0.0.1:{port}",
           "--workers", str(workers), "--log-level", "warning", "--backlog", "2048"]
    if threads > 1:
        cmd += ["--worker-class", "gthread", "--threads", str(threads)]
    if Path("/dev/shm").is_dir():
        # The workers touch a file per loop turn to say they are alive; on an overlay
        # or disk /tmp that costs more than a fast-path heartbeat (gunicorn's docs).
        cmd += ["--worker-tmp-dir", "/dev/shm"]
    if profile_dir:
        # bench_e2e's request accounting, with a cProfile of every request (dumped at exit)
        env.update(BENCH_WEB_CPU_DIR=profile_dir, BENCH_WEB_PROFILE="1")
        cmd += ["-c", str(REPO / "frontend" / "management" / "commands" / "_webcpu.py")]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise CommandError(f"the server exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return proc
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise CommandError("the server did not start within 30 s")


def _register(url: str, tokens: list[str]) -> list[tuple[str, bytes, bytes]]:
    """Register every host; returns (token, body before the seq, body after it) per host."""
    client = ControlPlaneClient(url, timeout_s=30)
    out = []
    for i, token in enumerate(tokens):
        name = f"bench-{i:05d}"
        backend = SimGpuBackend(model="H100", count=8, hostname=name, seed=i)
        resp = client.register(RegisterRequest(
            bootstrap_token=token, hostname=name, agent_version="bench", gpu_backend="sim",
            runtime="sim", cpu_count=224, memory_mib=2 * 1024 * 1024, gpus=backend.inventory(),
        ))
        hb = Heartbeat(host_id=resp.host_id, seq=0, gpus=backend.sample(), containers=[],
                       agent_version="bench")
        # The seq is the only field that changes per heartbeat: splice it into the JSON.
        head, tail = json.dumps(hb.to_dict()).encode().split(b'"seq": 0', 1)
        out.append((resp.host_token, head, tail))
    return out


def _blast(
    port: int, hosts: list[tuple[str, bytes, bytes]], seconds: float, concurrency: int,
    on_start=lambda: None,
) -> dict:
    latencies: list[list[float]] = [[] for _ in range(concurrency)]
    errors = [0] * concurrency
    warm_errors = [0] * concurrency
    seqs = [0] * len(hosts)
    # on_start runs once every client has warmed up, before any is released
    start = threading.Barrier(concurrency + 1, action=on_start)
    stop_at = [0.0]

    def send(conn: http.client.HTTPConnection, i: int) -> bool:
        seqs[i] += 1
        token, head, tail = hosts[i]
        payload = head + b'"seq": %d' % seqs[i] + tail
        try:
            conn.request("POST", HEARTBEAT_PATH, body=payload, headers={
                "Content-Type": "application/json", "Authorization": f"Bearer {token}",
            })
            resp = conn.getresponse()
            resp.read()
            if resp.getheader("Connection", "").lower() == "close":
                conn.close()
            return resp.status == 200
        except (OSError, http.client.HTTPException):
            conn.close()
            return False

    def client(k: int) -> None:
        mine = list(range(k, len(hosts), concurrency)) or [k % len(hosts)]
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        # Untimed: each host's first heartbeat after registering (the slow path: the
        # control plane has no answer for it yet), as in a fleet that has been running.
        for i in mine:
            warm_errors[k] += not send(conn, i)
        start.wait()
        n = 0
        while time.perf_counter() < stop_at[0]:
            i = mine[n % len(mine)]
            n += 1
            t0 = time.perf_counter()
            if send(conn, i):
                latencies[k].append((time.perf_counter() - t0) * 1000)
            else:
                errors[k] += 1

    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(concurrency)]
    for t in threads:
        t.start()
    w0 = time.perf_counter()
    stop_at[0] = w0 + 3600  # set for real once every client has warmed up
    start.wait()
    t0 = time.perf_counter()
    stop_at[0] = t0 + seconds
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    ms = sorted(x for per in latencies for x in per)
    return {
        "heartbeats": len(ms),
        "heartbeats_per_s": round(len(ms) / elapsed, 1),
        "p50_ms": _percentile(ms, 0.50),
        "p99_ms": _percentile(ms, 0.99),
        "max_ms": round(ms[-1], 2) if ms else 0.0,
        "errors": sum(errors) + sum(warm_errors),
        "warmup_s": round(t0 - w0, 1),
        "samples_per_s": round(len(ms) * 8 / elapsed, 1),
    }

