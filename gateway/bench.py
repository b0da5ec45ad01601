"""`python -m gateway.bench`: sessions per second, bytes per second and the time to a shell
prompt through one gateway (docs/benchmarks.md).

    python -m gateway.bench [--seconds 5] [--concurrency 8] [--mib 256] [--prompts 10] [--json]

In a throwaway database (`test_<name>`, created and dropped here, as bench_scheduler does):
a tenant, an SSH key, a host registered with a bootstrap token and a RUNNING instance on
it. Then, on 127.0.0.1: a gateway (its own thread and event loop), the host's agent tunnel
(the real AgentTunnel with the simulated runtime's connector: the fake shell, and two of
the instance's ports pointed at local servers) and the clients:

* SSH sessions/s: C asyncssh clients, each connecting, authenticating with its key (the
  gateway checks it against PostgreSQL), running `echo hi` (an exec stream over the
  tunnel; audited start and end) and disconnecting, for S seconds; also exec sessions/s
  over connections kept open (no handshake: the gateway's channel, tunnel and audit path).
* bytes/s: one `-L` connection (direct-tcpip) reading M MiB from a local server behind the
  instance's port; the same through the HTTP proxy (GET through /i/<id>/<port>/), and
  small HTTP requests/s through the proxy (API key; keep-alive).
* ssh → prompt: Debian's OpenSSH client `ssh -tt`, from the exec to the prompt on its
  stdout, N times one after another: p50 and max.

Clients, gateway and agent share this machine (and the asyncssh clients this process), so
the figures are a floor for one gateway, not its ceiling.
"""
from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import asyncssh
import django
from django.db import connection, connections


def _source_server(size: int) -> tuple[int, threading.Thread]:
    """A TCP server that sends `size` zero bytes to each client, then closes."""
    sock = socket.create_server(("127.0.0.1", 0))
    chunk = bytes(256 * 1024)

    def serve() -> None:
        while True:
            conn, _ = sock.accept()

            def send(c: socket.socket = conn) -> None:
                left = size
                with c:
                    while left > 0:
                        n = min(left, len(chunk))
                        c.sendall(chunk[:n])
                        left -= n
            threading.Thread(target=send, daemon=True).start()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return sock.getsockname()[1], t


def _http_server(size: int) -> ThreadingHTTPServer:
    big = bytes(size)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = big if self.path.startswith("/big") else b"ok\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _setup(key_line: str) -> dict[str, Any]:
    """The rows the gateway reads: tenant, member key, host (and its token), a RUNNING instance."""
    from django.contrib.auth import get_user_model

    from agents.host.sim import SimGpuBackend, SimRuntime
    from agents.models import Gpu
    from agents.protocol import RegisterRequest
    from agents.services.registration import bootstrap_token_create, host_register
    from gpucloud.catalogue.models import GpuModel, InstanceType, Region
    from gpucloud.tenancy.models import Membership
    from gpucloud.tenancy.services import api_key_create, ssh_key_add, tenant_create
    from scheduler.choices import State, WorkloadKind
    from scheduler.models import Allocation, Workload

    region = Region.objects.create(code="us-east-1", name="US East", country="US")
    model = GpuModel.objects.create(code="H100", name="H100", vendor="nvidia", memory_gib=80,
                                    bf16_tflops=Decimal("989.4"), interconnect="NVLink")
    it = InstanceType.objects.create(code="h100.1x", name="1x H100", gpu_model=model, gpu_count=1, vcpus=24,
                                     memory_gib=240, disk_gib=100)
    backend = SimGpuBackend(model="H100", count=1, hostname="bench-gw", runtime=SimRuntime())
    host, host_token = host_register(req=RegisterRequest(
        bootstrap_token=bootstrap_token_create(region=region)[1], hostname="bench-gw", agent_version="bench",
        gpu_backend="sim", runtime="sim", cpu_count=32, memory_mib=256 * 1024, gpus=backend.inventory()))
    user = get_user_model().objects.create_user(username="bench@gw.test", email="bench@gw.test", password="x" * 20)
    tenant = tenant_create(name="Bench", owner=user)
    membership = Membership.objects.get(tenant=tenant, user=user)
    ssh_key_add(membership=membership, name="bench", public_key=key_line)
    api_key = api_key_create(membership=membership, name="bench", scopes=["admin"])[1]
    w = Workload.objects.create(tenant=tenant, kind=WorkloadKind.INSTANCE, name="bench", instance_type=it,
                                region=region, image="bench:1", ports=[9000, 9001], state=State.RUNNING)
    gpu = Gpu.objects.filter(host=host).first()
    alloc = Allocation.objects.create(gpu=gpu, host=host, workload=w, milli=1000)
    from agents.selectors import attempt_id

    return {"host_token": host_token, "workload": str(w.pk), "attempt": attempt_id(w.pk, alloc.pk),
            "api_key": api_key}


class _Running:
    """The connector's view of the runtime: the one instance, running."""

    def __init__(self, attempt: str) -> None:
        self.attempt = attempt

    def list(self) -> list[Any]:
        return [SimpleNamespace(instance_id=self.attempt, state="running")]


async def _ssh_sessions(port: int, user: str, key: Any, seconds: float, concurrency: int,
                        reuse: bool) -> dict[str, Any]:
    done = errors = 0
    end = time.monotonic() + seconds
    latencies: list[float] = []

    async def worker() -> None:
        nonlocal done, errors
        conn = None
        while time.monotonic() < end:
            t0 = time.monotonic()
            try:
                if conn is None:
                    conn = await asyncssh.connect("127.0.0.1", port, username=user, client_keys=[key],
                                                  known_hosts=None)
                result = await conn.run("echo hi", check=False)
                if result.stdout != "hi\n" or result.exit_status != 0:
                    raise RuntimeError(f"unexpected answer {result.stdout!r} {result.exit_status}")
                if not reuse:
                    conn.close()
                    await conn.wait_closed()
                    conn = None
                done += 1
                latencies.append(time.monotonic() - t0)
            except Exception:  # counted: the figure says how many failed
                errors += 1
                conn = None
        if conn is not None:
            conn.close()

    t0 = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.monotonic() - t0
    latencies.sort()
    return {"per_s": round(done / elapsed, 1), "sessions": done, "errors": errors,
            "p50_ms": round(1000 * statistics.median(latencies), 1) if latencies else None}


async def _forward_bytes(port: int, user: str, key: Any, target_port: int) -> dict[str, Any]:
    async with asyncssh.connect("127.0.0.1", port, username=user, client_keys=[key], known_hosts=None) as conn:
        reader, writer = await conn.open_connection("127.0.0.1", target_port, encoding=None)
        t0 = time.monotonic()
        n = 0
        while data := await reader.read(1 << 20):
            n += len(data)
        elapsed = time.monotonic() - t0
        writer.close()
    return {"bytes": n, "mib_per_s": round(n / elapsed / 2**20, 1)}


def _http_bytes(http_port: int, path: str, api_key: str) -> dict[str, Any]:
    c = http.client.HTTPConnection("127.0.0.1", http_port, timeout=60)
    t0 = time.monotonic()
    c.request("GET", path, headers={"Authorization": f"Bearer {api_key}"})
    r = c.getresponse()
    n = 0
    while data := r.read(1 << 20):
        n += len(data)
    elapsed = time.monotonic() - t0
    c.close()
    return {"status": r.status, "bytes": n, "mib_per_s": round(n / elapsed / 2**20, 1)}


def _http_requests(http_port: int, path: str, api_key: str, seconds: float, concurrency: int) -> dict[str, Any]:
    counts = [0] * concurrency
    errors = [0] * concurrency
    end = time.monotonic() + seconds

    def worker(i: int) -> None:
        c = http.client.HTTPConnection("127.0.0.1", http_port, timeout=30)
        while time.monotonic() < end:
            try:
                c.request("GET", path, headers={"Authorization": f"Bearer {api_key}"})
                r = c.getresponse()
                r.read()
                if r.status == 200:
                    counts[i] += 1
                else:
                    errors[i] += 1
            except Exception:  # counted
                errors[i] += 1
                c.close()
                c = http.client.HTTPConnection("127.0.0.1", http_port, timeout=30)
        c.close()

    t0 = time.monotonic()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    return {"per_s": round(sum(counts) / elapsed, 1), "requests": sum(counts), "errors": sum(errors)}


def _time_to_prompt(port: int, user: str, key_path: Path, n: int) -> dict[str, Any]:
    times = []
    for _ in range(n):
        t0 = time.monotonic()
        proc = subprocess.Popen(
            ["ssh", "-tt", "-p", str(port), "-i", str(key_path), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
             "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
             f"{user}@127.0.0.1"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert proc.stdout is not None and proc.stdin is not None
        prompt = proc.stdout.read(2)
        times.append(time.monotonic() - t0)
        proc.stdin.write(b"exit\r")
        proc.stdin.flush()
        proc.wait(10)
        if prompt != b"$ ":
            raise RuntimeError(f"no prompt: {prompt!r}")
    times.sort()
    return {"n": n, "p50_ms": round(1000 * statistics.median(times), 1), "max_ms": round(1000 * times[-1], 1)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m gateway.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--mib", type=int, default=256, help="MiB for the bytes/s runs")
    parser.add_argument("--prompts", type=int, default=10, help="ssh → prompt measurements")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpucloud.settings")
    django.setup()

    from agents.host.tunnel import AgentTunnel, SimConnector
    from gateway.server import Gateway, GatewayConfig

    if connection.vendor != "postgresql":
        sys.exit("the benchmark needs PostgreSQL (set DATABASE_URL)")
    old_name = connection.settings_dict["NAME"]
    connection.creation.create_test_db(verbosity=0, autoclobber=True, keepdb=False)
    tmp = Path(tempfile.mkdtemp(prefix="gwbench-"))
    stop_gw: asyncio.Event | None = None
    gw_loop = asyncio.new_event_loop()
    tunnel = None
    try:
        key = asyncssh.generate_private_key("ssh-ed25519")
        key_path = tmp / "id_ed25519"
        key.write_private_key(str(key_path))
        key_path.chmod(0o600)
        rows = _setup(key.export_public_key("openssh").decode().strip())
        connection.close()
        size = args.mib * 2**20
        tcp_port, _ = _source_server(size)
        http = _http_server(size)

        gw = Gateway(GatewayConfig(ssh_port=0, tunnel_port=0, http_port=0, host_key_path=tmp / "gw_key",
                                   session_limit=10_000, redis_url=""))
        started = threading.Event()

        def run_gateway() -> None:
            nonlocal stop_gw
            asyncio.set_event_loop(gw_loop)
            stop_gw = asyncio.Event()
            task = gw_loop.create_task(gw.serve(stop_gw))
            gw_loop.run_until_complete(gw.ready.wait())
            started.set()
            gw_loop.run_until_complete(task)

        threading.Thread(target=run_gateway, daemon=True).start()
        if not started.wait(30):
            sys.exit("the gateway did not start")
        forward = {9000: ("127.0.0.1", tcp_port), 9001: ("127.0.0.1", http.server_address[1])}
        tunnel = AgentTunnel(f"ws://127.0.0.1:{gw.tunnel_port}/tunnel", token=lambda: rows["host_token"],
                             connector=SimConnector(_Running(rows["attempt"]), forward=forward))  # type: ignore[arg-type]
        tunnel.start()
        if not tunnel.connected.wait(30):
            sys.exit("the agent's tunnel did not come up")
        user = rows["workload"]
        prefix = f"/i/{user}/9001"

        out: dict[str, Any] = {"concurrency": args.concurrency, "seconds": args.seconds, "cpus": os.cpu_count(),
                               "loadavg_before": [round(x, 2) for x in os.getloadavg()]}
        out["ssh_sessions"] = asyncio.run(_ssh_sessions(gw.ssh_port, user, key, args.seconds, args.concurrency,
                                                        reuse=False))
        out["exec_sessions_on_open_connections"] = asyncio.run(
            _ssh_sessions(gw.ssh_port, user, key, args.seconds, args.concurrency, reuse=True))
        out["forward_bytes"] = asyncio.run(_forward_bytes(gw.ssh_port, user, key, 9000))
        out["http_bytes"] = _http_bytes(gw.http_port, f"{prefix}/big", rows["api_key"])
        out["http_requests"] = _http_requests(gw.http_port, f"{prefix}/small", rows["api_key"], args.seconds,
                                              args.concurrency)
        out["ssh_to_prompt"] = _time_to_prompt(gw.ssh_port, user, key_path, args.prompts)
        out["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    finally:
        if tunnel is not None:
            tunnel.stop()
        if stop_gw is not None:
            gw_loop.call_soon_threadsafe(stop_gw.set)
        time.sleep(0.5)  # the gateway's shutdown closes its database connections

        connections.close_all()
        connection.creation.destroy_test_db(old_name, verbosity=0)
    if args.json:
        print(json.dumps(out, indent=2))
        return
    s, e, f, hb, hr, p = (out["ssh_sessions"], out["exec_sessions_on_open_connections"], out["forward_bytes"],
                          out["http_bytes"], out["http_requests"], out["ssh_to_prompt"])
    print(f"one gateway, {args.concurrency} concurrent clients, {args.seconds:g} s per run, {out['cpus']} CPUs, "
          f"load {out['loadavg_before']} -> {out['loadavg_after']}")
    print(f"ssh sessions/s (connect, key auth, exec `echo hi`, exit): {s['per_s']}  "
          f"(p50 {s['p50_ms']} ms, {s['errors']} errors)")
    print(f"exec sessions/s on open connections:                  {e['per_s']}  "
          f"(p50 {e['p50_ms']} ms, {e['errors']} errors)")
    print(f"bytes/s through ssh -L:                                {f['mib_per_s']} MiB/s ({f['bytes']} bytes)")
    print(f"bytes/s through the HTTP proxy:                        {hb['mib_per_s']} MiB/s ({hb['bytes']} bytes)")
    print(f"HTTP requests/s through the proxy (small, keep-alive): {hr['per_s']}  ({hr['errors']} errors)")
    print(f"ssh -tt to a shell prompt (OpenSSH):                   p50 {p['p50_ms']} ms, max {p['max_ms']} ms "
          f"over {p['n']}")


if __name__ == "__main__":
    main()
