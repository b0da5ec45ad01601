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

from django.core.management.base import BaseCommand, CommandError
from django.db import connection, connections

from agents.fastpath import heartbeats_flush
from agents.host.client import ControlPlaneClient
from agents.host.sim import SimGpuBackend
from agents.models import GpuSample
from agents.protocol import HEARTBEAT_PATH, Heartbeat, RegisterRequest
from agents.services.registration import bootstrap_token_create
from gpucloud.catalogue.models import GpuModel, Region

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
        parser.add_argument("--json", action="store_true", help="print one JSON object")

    def handle(self, *args, hosts, seconds, concurrency, workers, threads, **options):
        if hosts < 1 or seconds <= 0 or concurrency < 1 or workers < 1:
            raise CommandError("--hosts, --seconds, --concurrency and --workers must be positive")
        if connection.vendor != "postgresql":
            raise CommandError("the benchmark needs PostgreSQL (set DATABASE_URL)")
        creation = connection.creation
        old_name = connection.settings_dict["NAME"]
        creation.create_test_db(verbosity=0, autoclobber=True, keepdb=False)
        server = None
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
            if server is not None:
                server.send_signal(signal.SIGTERM)
                try:
                    server.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    server.kill()
            connections.close_all()
            creation.destroy_test_db(old_name, verbosity=0)
        if options["json"]:
            self.stdout.write(json.dumps(out))
        else:
            for key, value in out.items():
                self.stdout.write(f"{key:>20}: {value}")


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


def _start_server(db: dict, port: int, workers: int, threads: int) -> subprocess.Popen:
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

