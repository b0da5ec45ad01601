"""End to end, from `POST /api/v1/jobs` to RUNNING and done, on the real processes.

    python manage.py bench_e2e --hosts 64 --jobs 2000 --clients 4 [--array] [--mix] [--json]

Needs DATABASE_URL (PostgreSQL) and REDIS_URL. In a database of its own (created and dropped
here; the broker and cache are the environment's, under a key prefix of their own) it seeds the
catalogue, a tenant with one API key per client and one bootstrap token per host, then starts,
each in a process group of its own: gunicorn (gthread workers, as the Dockerfile), a Celery
worker, Celery beat, and `python -m agents.host --sim-fleet N` (N simulated 8-GPU hosts in one
process, the real protocol). Every one is stopped (SIGTERM, then SIGKILL) when it ends.

The burst: C client threads submit the jobs over keep-alive HTTP as fast as they are answered
(one-GPU batch jobs that run `--duration-s` seconds in the simulated runtime); with `--array`,
each client submits its share as one array (`"array": {"count": n}`). Then `--idle-samples`
jobs one at a time on the idle fleet, each waited for until RUNNING. With `--mix`, instead of
the burst: 400 jobs of 1, 2, 4 or 8 GPUs and 2-host gangs, 1 to 4 s each, and a check that no
GPU was ever held by two allocations at once.

Printed (with `--json`, the last line is one JSON object): submissions/s and their latency,
dispatch (to RUNNING) and completion jobs/s, create→RUNNING p50/p99 (the burst's, with its
queueing, and the idle ones), CPU ms per job by process (web, worker, beat, fleet, and the
PostgreSQL backends of the run's database), and the share of allocated GPU time in which the
job was not RUNNING (booked but idle). No assertion on speed: it prints figures.

`--runtime docker`: real containers instead of simulated ones. Each host is then an agent
process of its own (`python -m agents.host --runtime docker`, simulated GPUs, its own
`--docker-scope`, no egress rules: the engine is shared) on the local engine, and every job
runs `sleep <duration>` in a local busybox image (`_bench_image`: Debian's busybox-static
with the few applets the jobs use, imported without a registry as agents/host/standin.py
does). `--jobs 0` skips the burst (only the idle samples), e.g. `--hosts 2 --jobs 0
--idle-samples 30 --runtime docker`. The containers and tenant networks of the run are
removed at the end.
"""
from __future__ import annotations

import cProfile
import hashlib
import http.client
import io
import json
import os
import pstats
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import connection, connections
from django.test import Client, override_settings

from agents.host import standin
from agents.host.docker import LABEL_AGENT
from agents.host.runtime import LABEL_TENANT
from agents.management.commands.bench_heartbeats import _free_port
from agents.models import Gpu, Host
from agents.services.registration import bootstrap_token_create
from gpucloud.catalogue.models import GpuModel, Quota, Region
from gpucloud.lib.db import bench_database
from gpucloud.tenancy.models import Membership
from gpucloud.tenancy.services import api_key_create, tenant_create
from scheduler.choices import TERMINAL, State
from scheduler.models import Workload, WorkloadEvent

REPO = Path(__file__).resolve().parents[3]
REGION = "us-east-1"


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    v = sorted(values)
    return round(v[min(len(v) - 1, max(0, round(q * (len(v) - 1))))], 3)


def _proc_stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _cpu_of(match: Callable[[Path, list[str]], bool]) -> dict[int, float]:
    """User + system CPU seconds of each live process (pid -> seconds) that `match(its /proc
    directory, its stat fields after the name)` picks."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            f = _proc_stat(int(entry.name))
            try:
                if f is not None and match(entry, f):
                    out[int(entry.name)] = (int(f[11]) + int(f[12])) / tick
            except OSError:  # gone meanwhile
                continue
    return out


def _group_cpu_s(pgid: int) -> float:
    """User + system CPU seconds of the live processes of process group `pgid`."""
    return sum(_cpu_of(lambda entry, f: int(f[2]) == pgid).values())


def _pg_backend_cpu(dbname: str) -> dict[int, float]:
    """CPU seconds of each PostgreSQL backend serving `dbname` (pid -> seconds)."""
    def serves(entry: Path, f: list[str]) -> bool:
        cmd = (entry / "cmdline").read_bytes()
        return cmd.startswith(b"postgres: ") and f" {dbname} ".encode() in cmd

    return _cpu_of(serves)


def _engine_cpu() -> float:
    """User + system CPU seconds of the live Docker engine processes (dockerd, containerd and
    the shims of running containers; an exited shim's CPU is lost)."""
    def engine(entry: Path, f: list[str]) -> bool:
        comm = (entry / "comm").read_text().strip()
        return comm in ("dockerd", "containerd") or comm.startswith("containerd-shim")

    return sum(_cpu_of(engine).values())


class _Procs:
    """The platform's processes, each the leader of its own process group."""

    def __init__(self, env: dict[str, str], logdir: Path) -> None:
        self.env, self.logdir = env, logdir
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> None:
        log = open(self.logdir / f"{name}.log", "wb")
        self.procs[name] = subprocess.Popen(cmd, cwd=REPO, env={**self.env, **(env or {})},
                                            stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)

    def check(self) -> None:
        for name, p in self.procs.items():
            if p.poll() is not None:
                tail = (self.logdir / f"{name}.log").read_text(errors="replace")[-3000:]
                raise CommandError(f"{name} exited with {p.returncode}:\n{tail}")

    def cpu(self) -> dict[str, float]:
        """CPU seconds by process; the agent processes of a docker run as one, `fleet`."""
        out: dict[str, float] = defaultdict(float)
        for name, p in self.procs.items():
            out[name.split(":")[0]] += _group_cpu_s(p.pid)
        return dict(out)

    def stop(self) -> None:
        for p in self.procs.values():
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 20
        for p in self.procs.values():
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            try:  # the group: prefork children, gunicorn workers
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


class Command(BaseCommand):
    help = "End-to-end speed: API submission to RUNNING and done, on real processes."

    def add_arguments(self, parser):
        parser.add_argument("--hosts", type=int, default=64)
        parser.add_argument("--jobs", type=int, default=2000)
        parser.add_argument("--clients", type=int, default=4)
        parser.add_argument("--array", action="store_true", help="each client submits one array")
        parser.add_argument("--mix", action="store_true", help="the 400-job placement mix instead")
        parser.add_argument("--duration-s", type=float, default=1.0, help="each job's run time")
        parser.add_argument("--runtime", choices=["sim", "docker"], default="sim",
                            help="docker: real containers of a local busybox image, one agent process per host")
        parser.add_argument("--idle-samples", type=int, default=20,
                            help="jobs submitted one at a time on the idle fleet")
        parser.add_argument("--idle-seconds", type=float, default=20.0,
                            help="at the end, measure the processes' CPU over this long with no work")
        parser.add_argument("--web-workers", type=int, default=2)
        parser.add_argument("--web-threads", type=int, default=0,
                            help="threads per web worker (default: enough for the long polls)")
        parser.add_argument("--api-rate-limit", default="",
                            help="API_RATE_LIMIT for the run (default: the platform's)")
        parser.add_argument("--profile", type=int, default=0, metavar="N",
                            help="first profile N job and N instance creates in this process")
        parser.add_argument("--profile-only", action="store_true", help="only the profile")
        parser.add_argument("--web-cpu", action="store_true",
                            help="count the web's requests per job and their CPU, by kind (_webcpu.py)")
        parser.add_argument("--web-profile", action="store_true",
                            help="with --web-cpu: cProfile every web request, listing on stderr")
        parser.add_argument("--log-level", default="WARNING",
                            help="of the worker and beat (INFO: each task and how long it took)")
        parser.add_argument("--agent-log-level", default="WARNING",
                            help="of the agents (DEBUG: each heartbeat and long poll)")
        parser.add_argument("--keep-logs", default="", metavar="DIR",
                            help="copy the processes' logs (web, worker, beat, fleet) into DIR")
        parser.add_argument("--timeout-s", type=float, default=900.0)
        parser.add_argument("--json", action="store_true")

    def handle(self, *args, **o):
        if connection.vendor != "postgresql":
            raise CommandError("bench_e2e needs PostgreSQL (DATABASE_URL)")
        if not os.environ.get("REDIS_URL"):
            raise CommandError("bench_e2e needs REDIS_URL")
        if o["mix"]:
            o["jobs"] = 400
            o["hosts"] = o["hosts"] if o["hosts"] != 64 else 16
        if min(o["hosts"], o["clients"]) < 1 or o["jobs"] < 0:
            raise CommandError("--hosts and --clients must be positive, --jobs not negative")
        o["image"] = ""
        engine = None
        if o["runtime"] == "docker":
            engine = _docker_engine()
            o["image"] = _bench_image(engine)
            o["docker_scope"] = f"bench-e2e-{os.getpid()}"
        def stop(signum, frame):  # SIGTERM (and SIGINT where a shell ignores it): clean up, then exit
            raise SystemExit(128 + signum)

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        settings_dict = connection.settings_dict
        settings_dict.setdefault("TEST", {})["NAME"] = f"bench_e2e_{os.getpid()}"
        procs = None
        tmp = tempfile.TemporaryDirectory(prefix="bench_e2e_")
        with bench_database():
            try:
                keys, tokens, o["tenant_id"] = _prepare(o)
                profile = _profile_creates(keys[0], o["profile"], self.stderr) if o["profile"] else {}
                if o["profile_only"]:
                    out = profile
                else:
                    connections.close_all()
                    procs = _start(o, Path(tmp.name), tokens)
                    out = {**_run(o, procs, keys), **profile}
                    if o["web_profile"]:
                        procs.stop()
                        _print_web_profile(Path(tmp.name) / "webcpu", self.stderr)
            finally:
                if procs is not None:
                    procs.stop()
                    if o["keep_logs"]:
                        Path(o["keep_logs"]).mkdir(parents=True, exist_ok=True)
                        for name in procs.procs:
                            shutil.copy(Path(tmp.name) / f"{name}.log", Path(o["keep_logs"]) / f"{name}.log")
                if engine is not None:
                    _docker_cleanup(engine, o)
                tmp.cleanup()
        out["process_groups"] = sorted(p.pid for p in procs.procs.values()) if procs else []
        if o["json"]:
            self.stdout.write(json.dumps(out))
        else:
            for k, v in out.items():
                self.stdout.write(f"{k:>34}: {v}")


def _docker_engine():
    """The local Docker engine (the `docker` SDK), or why not."""
    try:
        import docker
    except ImportError as e:
        raise CommandError(f"--runtime docker needs the docker SDK: {e}") from None
    try:
        engine = docker.from_env(timeout=60)
        engine.ping()
    except Exception as e:  # noqa: BLE001 - any failure here means "no engine"
        raise CommandError(f"--runtime docker: no Docker engine reachable ({e})") from None
    if not standin.BUSYBOX.is_file():
        raise CommandError(f"--runtime docker: {standin.BUSYBOX} is missing: apt-get install busybox-static")
    return engine


# What the jobs run (`sleep`, under `sh` where a command needs one): the image holds only these.
_APPLETS = ["sh", "sleep", "true"]


def _bench_image(engine) -> str:
    """A local image of the host's busybox with `_APPLETS` only, built once (the tag follows
    the binary and the list). Not the demo's stand-in with every applet: on the vfs storage
    driver every create copies the image's files twice (init and writable layers), and its
    ~400 applet links cost ~0.3 s of engine time per create on this machine, the three ~0.05 s."""
    digest = hashlib.sha256(standin.BUSYBOX.read_bytes())
    digest.update(repr(_APPLETS).encode())
    repository, tag = "gpucloud/bench-busybox", digest.hexdigest()[:12]
    try:
        engine.images.get(f"{repository}:{tag}")
    except Exception as e:  # noqa: BLE001 - docker.errors.ImageNotFound (the SDK is imported lazily)
        if type(e).__name__ != "ImageNotFound":
            raise
        engine.api.import_image_from_data(standin.image_tar(standin.BUSYBOX, _APPLETS), repository=repository, tag=tag)
    return f"{repository}:{tag}"


def _docker_cleanup(engine, o) -> None:
    """What the run's agents made: their containers (by scope) and the tenant's networks."""
    for i in range(o["hosts"]):
        for ctr in engine.containers.list(all=True, filters={"label": f"{LABEL_AGENT}={o['docker_scope']}-{i}"}):
            try:
                ctr.remove(force=True)
            except Exception:  # noqa: BLE001 - gone meanwhile
                pass
    if o.get("tenant_id"):
        for net in engine.networks.list(filters={"label": f"{LABEL_TENANT}={o['tenant_id']}"}):
            try:
                net.remove()
            except Exception:  # noqa: BLE001 - gone meanwhile, or still in use: say so
                sys.stderr.write(f"bench_e2e: network {net.name} not removed\n")


def _prepare(o) -> tuple[list[str], list[str], str]:
    call_command("seed_catalog", stdout=open(os.devnull, "w"))
    region = Region.objects.get(code=REGION)
    user = get_user_model().objects.create_user(username="bench@e2e.test", email="bench@e2e.test",
                                                password=secrets.token_urlsafe(16))
    tenant = tenant_create(name="Bench", owner=user)
    Quota.objects.update_or_create(tenant=tenant, gpu_model=None, region=None,
                                   defaults={"max_gpus": 100_000, "max_instances": 100_000})
    membership = Membership.objects.get(tenant=tenant, user=user)
    keys = [api_key_create(membership=membership, name=f"client {i}", scopes=["write"])[1]
            for i in range(o["clients"])]
    tokens = [bootstrap_token_create(region=region)[1] for _ in range(o["hosts"])]
    return keys, tokens, str(tenant.pk)


def _profile_creates(key: str, n: int, err) -> dict:
    """N job creates and N instance creates through the whole Django stack in this process
    (middleware, auth, throttle, view, services, the 201 body), under cProfile: CPU ms per
    create (median) and the functions where it goes (to stderr). The workloads are deleted
    afterwards, so the run starts from an empty queue."""

    # A launch no host could ever run is refused (409 unsatisfiable), and the profile runs
    # before the fleet registers: one host as a registered agent leaves it, removed afterwards.
    host = Host.objects.create(name="bench-profile-host", region=Region.objects.get(code=REGION), vcpus=224,
                               memory_mib=2048 * 1024)
    h100 = GpuModel.objects.get(code="H100")
    Gpu.objects.bulk_create([Gpu(uuid=f"GPU-bench-profile-{g}", host=host, index=g, gpu_model=h100,
                                 memory_mib=80 * 1024) for g in range(8)])
    client = Client(HTTP_AUTHORIZATION=f"Bearer {key}", HTTP_HOST="127.0.0.1")
    bodies = {
        "job": lambda i: _job(i, 1.0),
        "instance": lambda i: {"name": f"nb-{i}", "instance_type": "h100.1x", "region": REGION,
                               "image": "jupyter/base-notebook"},
    }
    out = {}
    with override_settings(ALLOWED_HOSTS=["127.0.0.1"]):
        for kind, body in bodies.items():
            out.update(_profile_one(client, kind, body, n, err))
    Workload.objects.all().delete()
    host.delete()
    return out


def _profile_one(client, kind: str, body, n: int, err) -> dict:
    """CPU per create measured on n creates without the profiler, then n more under it."""
    path = f"/api/v1/{kind}s"

    def post(i: int) -> None:
        resp = client.post(path, json.dumps(body(i)), content_type="application/json", secure=True)
        if resp.status_code != 201:
            raise CommandError(f"profile: {path} answered {resp.status_code}: {resp.content[:300]!r}")

    for i in range(5):  # warm: imports, caches, connections
        post(i)
    queries: list[str] = []

    def count(execute, sql, params, many, context):
        queries.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(count):
        post(5)
    cpu = []
    for i in range(n):
        t = time.process_time()
        post(i)
        cpu.append((time.process_time() - t) * 1000)
    prof = cProfile.Profile(time.process_time)  # CPU, not waiting for PostgreSQL
    prof.enable()
    for i in range(n):
        post(i)
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(45)
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(30)
    err.write(f"--- POST {path}: {n} creates, CPU ms median {_percentile(cpu, 0.5):.2f} (unprofiled), "
              f"{len(queries)} queries per create\n")
    for sql in queries:
        err.write(f"    SQL {sql[:160]}\n")
    err.write(buf.getvalue())
    return {f"{kind}_create_cpu_ms_p50": round(_percentile(cpu, 0.5), 2),
            f"{kind}_create_queries": len(queries)}


def _start(o, tmp: Path, tokens: list[str]) -> _Procs:
    db = connection.settings_dict
    port = _free_port()
    # Each host keeps a long poll parked, and the kernel, not gunicorn, picks the worker that
    # accepts it (unevenly: the idlest takes most): every worker has a slot for every host's,
    # else the waits beyond its slots are answered at once and their agents poll again later.
    threads = o["web_threads"] or max(8, o["hosts"] + 8)
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://{db.get('USER') or ''}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "DJANGO_SETTINGS_MODULE": "gpucloud.settings",
        "DEBUG": "0",
        "SECRET_KEY": os.environ.get("SECRET_KEY") or secrets.token_urlsafe(32),
        "ALLOWED_HOSTS": "127.0.0.1",
        "SECURE_SSL_REDIRECT": "0",
        "CACHE_KEY_PREFIX": f"bench{os.getpid()}",
        # the fleet's heartbeats and long polls: many per host while its jobs turn over
        "AGENT_RATE_LIMIT": "100000/min",
        "AGENT_LONGPOLL_SLOTS": str(max(1, threads - 4)),
    }
    if o["api_rate_limit"]:
        env["API_RATE_LIMIT"] = o["api_rate_limit"]
    web_cpu = []
    if o["web_cpu"] or o["web_profile"]:
        (tmp / "webcpu").mkdir()
        env["BENCH_WEB_CPU_DIR"] = str(tmp / "webcpu")
        env["BENCH_WEB_PROFILE"] = "1" if o["web_profile"] else "0"
        web_cpu = ["-c", str(Path(__file__).with_name("_webcpu.py"))]
    procs = _Procs(env, tmp)
    procs.url = f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]
    procs.port = port  # type: ignore[attr-defined]
    py = sys.executable
    procs.start("web", [py, "-m", "gunicorn", "gpucloud.wsgi", "--bind", f"127.0.0.1:{port}",
                        "--workers", str(o["web_workers"]), "--worker-class", "gthread",
                        "--threads", str(threads), "--log-level", "warning", "--backlog", "2048",
                        # the threads share a pool of connections, as the Dockerfile's do
                        "--env", f"DB_POOL_SIZE={threads}",
                        "--worker-tmp-dir", "/dev/shm" if Path("/dev/shm").is_dir() else str(tmp),
                        *web_cpu])
    procs.start("worker", [py, "-m", "celery", "-A", "gpucloud", "worker", "--concurrency", "2",
                           "--without-gossip", "--without-mingle", "--loglevel", o["log_level"]])
    procs.start("beat", [py, "-m", "celery", "-A", "gpucloud", "beat", "--loglevel", o["log_level"],
                         "--schedule", str(tmp / "beat-schedule")])
    _wait_port(procs, port)
    if o["runtime"] == "sim":
        procs.start("fleet", [py, "-m", "agents.host", "--sim-fleet", str(o["hosts"]),
                              "--server", procs.url, "--gpu-backend", "sim", "--runtime", "sim",  # type: ignore[attr-defined]
                              "--state-dir", str(tmp / "agents"), "--hostname", "e2e",
                              "--log-level", o["agent_log_level"], "--request-timeout-s", "120"],
                    env={"GPUCLOUD_BOOTSTRAP_TOKEN": ",".join(tokens)})
        return procs
    # docker: one agent process per host (a fleet process runs simulated runtimes only), each
    # with a scope of its own (an agent removes containers of its scope it did not start), no
    # egress rules (host-wide iptables on a shared engine) and no disk quota (vfs cannot)
    for i, token in enumerate(tokens):
        procs.start(f"fleet:{i}", [py, "-m", "agents.host", "--server", procs.url,  # type: ignore[attr-defined]
                                   "--gpu-backend", "sim", "--runtime", "docker",
                                   "--docker-scope", f"{o['docker_scope']}-{i}", "--docker-egress-block", "false",
                                   "--docker-disk-gib", "0", "--state-dir", str(tmp / "agents" / f"e2e-{i:03d}"),
                                   "--hostname", f"e2e-{i:03d}", "--log-level", o["agent_log_level"],
                                   "--request-timeout-s", "120"],
                    env={"GPUCLOUD_BOOTSTRAP_TOKEN": token})
    return procs


def _wait_port(procs: _Procs, port: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        procs.check()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.2)
    raise CommandError("the web server did not start within 60 s")


def _wait(cond, procs: _Procs, timeout_s: float, what: str, poll_s: float = 0.25):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        procs.check()
        got = cond()
        if got:
            return got
        time.sleep(poll_s)
    raise CommandError(f"timed out waiting for {what}")


class _Api:
    """One keep-alive connection with one API key."""

    def __init__(self, port: int, key: str) -> None:
        self.port, self.key = port, key
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.throttled = 0

    def post(self, path: str, body: dict) -> tuple[int, dict]:
        payload = json.dumps(body).encode()
        fresh = False
        while True:
            try:
                self.conn.request("POST", path, body=payload, headers={
                    "Content-Type": "application/json", "Authorization": f"Bearer {self.key}"})
                resp = self.conn.getresponse()
                data = resp.read()
            except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
                # the server closed the kept-alive connection while it was idle (gunicorn's
                # keep-alive is 2 s): the request never reached it; once more on a new one
                self.conn.close()
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
                if fresh:
                    raise
                fresh = True
                continue
            except (OSError, http.client.HTTPException):
                self.conn.close()
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
                raise
            if resp.status == 429:
                self.throttled += 1
                time.sleep(float(resp.getheader("Retry-After") or 1))
                continue
            return resp.status, json.loads(data or b"{}")


def _job(i: int, duration: float, gpus: int = 1, nodes: int = 1, image: str = "") -> dict:
    """A batch job of `duration` seconds: in the simulated runtime by its env; with a local
    `image` (the docker runtime), its command sleeps that long."""
    body = {"name": f"e2e-{i}", "instance_type": f"h100.{gpus}x", "region": REGION, "image": "busybox",
            "command": ["true"], "env": {"GPUCLOUD_SIM_DURATION_S": f"{duration:g}"}}
    if image:
        body.update(image=image, command=["sleep", f"{duration:g}"])
    if nodes > 1:
        body["nodes"] = nodes
    return body


def _run(o, procs: _Procs, keys: list[str]) -> dict:
    n_gpus = o["hosts"] * 8
    # registered, and heartbeating since (a registration's answer lost to a client timeout
    # would leave a host the agent cannot use: its token was spent)
    _wait(lambda: Host.objects.filter(state="ready", last_seq__gte=1).count() >= o["hosts"], procs, 300,
          f"{o['hosts']} hosts to register and heartbeat")
    assert Gpu.objects.filter(host__state="ready").count() >= n_gpus
    out: dict = {"hosts": o["hosts"], "gpus": n_gpus, "jobs": o["jobs"], "clients": o["clients"],
                 "array": o["array"], "mix": o["mix"], "loadavg_1m_start": round(os.getloadavg()[0], 2)}
    if o["runtime"] != "sim":
        out["runtime"] = o["runtime"]
    if o["jobs"]:
        if not _burst(o, procs, keys, out):
            return out
    else:  # idle samples only
        out.update(submit_jobs_per_s=0.0, dispatch_jobs_per_s=0.0, completion_jobs_per_s=0.0,
                   server_cpu_ms_per_job=0.0)
    if o["mix"]:
        out["violations"] = _violations()
    elif o["idle_samples"]:
        try:
            out.update(_idle(procs, keys[0], o))
        except (CommandError, OSError, http.client.HTTPException) as e:  # keep the burst's figures
            out["idle_error"] = str(e)[:300]
    webdir = procs.logdir / "webcpu"
    if o["idle_seconds"] > 0:
        # the platform with nothing to do: beat's ticks, the fleet's heartbeats, the flushes
        c0, w0, i0 = procs.cpu(), time.monotonic(), _web_cpu(webdir)
        time.sleep(o["idle_seconds"])
        c1, dt = procs.cpu(), time.monotonic() - w0
        out["idle_cpu_share_of_a_core"] = {k: round((c1[k] - c0[k]) / dt, 3) for k in c1}
        if webdir.is_dir():
            # requests per second and CPU ms per second, by kind
            out["idle_web_requests_per_s"] = _web_cpu_per_job(i0, _web_cpu(webdir), dt)
    out["loadavg_1m_end"] = round(os.getloadavg()[0], 2)
    return out


def _burst(o, procs: _Procs, keys: list[str], out: dict) -> bool:
    """The burst (or the mix): submitted, waited for, its figures into `out`; False when
    arrays were asked for and the platform has none."""
    cpu0, pg0 = procs.cpu(), _pg_backend_cpu(connection.settings_dict["NAME"])
    webdir = procs.logdir / "webcpu"
    web0 = _web_cpu(webdir)
    t0 = time.time()
    if o["mix"]:
        bodies = _mix_bodies(o)
    else:
        bodies = [_job(i, o["duration_s"], image=o["image"]) for i in range(o["jobs"])]
    sub = _submit(procs.port, keys, bodies, array=o["array"])  # type: ignore[attr-defined]
    out.update({k: v for k, v in sub.items() if k != "ids"})
    if sub.get("array_error"):
        out["array"] = "arrays not available: " + sub["array_error"]
        return False
    expected = len(bodies) if not o["array"] else o["jobs"]
    _wait(lambda: _done(t0) >= expected, procs, o["timeout_s"], "every job to end", poll_s=0.5)
    t_end = time.time()
    cpu1, pg1 = procs.cpu(), _pg_backend_cpu(connection.settings_dict["NAME"])
    if webdir.is_dir():
        time.sleep(0.6)  # the workers write their counters every half second
        out["web_requests_per_job"] = _web_cpu_per_job(web0, _web_cpu(webdir), expected)
    out.update(_timeline(t0, expected))
    per = {name: round((cpu1[name] - cpu0.get(name, 0.0)) * 1000 / expected, 2) for name in cpu1}
    per["postgres"] = round(sum(v - pg0.get(pid, 0.0) for pid, v in pg1.items()) * 1000 / expected, 2)
    out["cpu_ms_per_job"] = per
    out["server_cpu_ms_per_job"] = round(per["web"] + per["worker"] + per["beat"] + per["postgres"], 2)
    out["wall_s"] = round(t_end - t0, 2)
    return True


def _web_cpu(webdir: Path) -> dict[str, list[float]]:
    """The web workers' request counters (_webcpu.py), summed: kind -> [requests, CPU s]."""
    total: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    if not webdir.is_dir():
        return total
    for f in webdir.glob("web-*.json"):
        try:
            data = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        for k, (n, s) in data.items():
            total[k][0] += n
            total[k][1] += s
    return total


def _web_cpu_per_job(before: dict, after: dict, per: float) -> dict[str, list[float]]:
    """kind -> [requests per job, CPU ms per job, CPU ms per request], largest CPU first;
    `_process` is the workers' whole CPU, `_requests` the part inside requests."""
    out = {}
    inside = [0.0, 0.0]
    for k, (n, s) in after.items():
        dn, ds = n - before.get(k, [0, 0.0])[0], s - before.get(k, [0, 0.0])[1]
        if dn <= 0 and k != "_process":
            continue
        if k != "_process":
            inside[0] += dn
            inside[1] += ds
        out[k] = [round(dn / per, 3), round(ds * 1000 / per, 2), round(ds * 1000 / dn, 2) if dn else 0.0]
    out["_requests"] = [round(inside[0] / per, 3), round(inside[1] * 1000 / per, 2),
                        round(inside[1] * 1000 / inside[0], 2) if inside[0] else 0.0]
    return dict(sorted(out.items(), key=lambda kv: -kv[1][1]))


def _print_web_profile(webdir: Path, err) -> None:
    files = [str(f) for f in webdir.glob("web-*.prof")]
    if not files:
        err.write("--- web profile: no worker wrote one\n")
        return
    buf = io.StringIO()
    stats = pstats.Stats(*files, stream=buf)
    stats.sort_stats("cumulative").print_stats(60)
    stats.sort_stats("tottime").print_stats(40)
    err.write("--- web profile (every request of the run, CPU time)\n" + buf.getvalue())


def _mix_bodies(o) -> list[dict]:
    """400 jobs: 1, 2, 4 or 8 GPUs (some 2-host gangs of 8), 1 to 4 s each, in a fixed order."""
    rng = random.Random(400)
    bodies = []
    for i in range(o["jobs"]):
        shape = rng.choices([(1, 1), (2, 1), (4, 1), (8, 1), (8, 2)], weights=[40, 25, 15, 12, 8])[0]
        bodies.append(_job(i, float(rng.randint(1, 4)), gpus=shape[0], nodes=shape[1], image=o["image"]))
    return bodies


def _submit(port: int, keys: list[str], bodies: list[dict], *, array: bool) -> dict:
    """Submit `bodies` from one thread per key; latencies and the ids."""
    lat: list[float] = []
    ids: list[str] = []
    errors: list[str] = []
    throttled = [0]
    lock = threading.Lock()
    shares = [bodies[k::len(keys)] for k in range(len(keys))]

    def client(k: int) -> None:
        api = _Api(port, keys[k])
        mine = shares[k]
        if array:
            mine = [{**mine[0], "array": {"count": len(mine)}}] if mine else []
        for body in mine:
            t = time.perf_counter()
            try:
                status, data = api.post("/api/v1/jobs", body)
            except (OSError, http.client.HTTPException) as e:
                with lock:
                    errors.append(str(e))
                continue
            dt = time.perf_counter() - t
            with lock:
                lat.append(dt)
                if status == 201:
                    ids.append(data.get("id", ""))
                else:
                    errors.append(f"{status} {json.dumps(data)[:300]}")
        with lock:
            throttled[0] += api.throttled

    threads = [threading.Thread(target=client, args=(k,)) for k in range(len(keys))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    out = {"submit_s": round(elapsed, 2), "submit_requests": len(lat),
           "submit_jobs_per_s": round(len(bodies) / elapsed, 1) if not array or not errors else 0.0,
           "submit_p50_ms": round(_percentile(lat, 0.5) * 1000, 1),
           "submit_p99_ms": round(_percentile(lat, 0.99) * 1000, 1),
           "submit_errors": len(errors), "submit_throttled": throttled[0], "ids": ids}
    if errors:
        out["first_error"] = errors[0]
        if array and all(e.startswith("400") for e in errors):
            out["array_error"] = errors[0]
    return out


def _done(t0: float) -> int:
    return Workload.objects.filter(state__in=TERMINAL).count()


def _timeline(t0: float, n: int) -> dict:
    """Per job, from its events: created, first SCHEDULED, first RUNNING, end."""
    first: dict[tuple[str, str], float] = {}
    for wid, to, at in WorkloadEvent.objects.order_by("created_at").values_list(
            "workload_id", "to_state", "created_at"):
        key = (str(wid), State.SUCCEEDED if to in TERMINAL else to)
        first.setdefault(key, at.timestamp())
    jobs = list(Workload.objects.values_list("pk", "created_at", "state", "nodes", "instance_type__gpu_count"))
    created = [c.timestamp() for _, c, _, _, _ in jobs]
    c2r, c2s, booked, idle = [], [], 0.0, 0.0
    running_at, ended_at = [], []
    states: dict[str, int] = defaultdict(int)
    for pk, c, state, nodes, gpus in jobs:
        pk = str(pk)
        states[state] += 1
        s, r, e = first.get((pk, State.SCHEDULED)), first.get((pk, State.RUNNING)), first.get((pk, State.SUCCEEDED))
        if s is not None:
            c2s.append(s - c.timestamp())
        if r is not None:
            c2r.append(r - c.timestamp())
            running_at.append(r)
        if e is not None:
            ended_at.append(e)
        if s is not None and e is not None:
            g = gpus * nodes
            booked += (e - s) * g
            idle += ((r if r is not None else e) - s) * g
    start = min(created) if created else t0
    out = {
        "dispatch_jobs_per_s": round(len(running_at) / (max(running_at) - start), 1) if running_at else 0.0,
        "completion_jobs_per_s": round(len(ended_at) / (max(ended_at) - start), 1) if ended_at else 0.0,
        "makespan_s": round(max(ended_at) - start, 2) if ended_at else 0.0,
        "burst_create_to_scheduled_p50_s": _percentile(c2s, 0.5),
        "burst_create_to_running_p50_s": _percentile(c2r, 0.5),
        "burst_create_to_running_p99_s": _percentile(c2r, 0.99),
        "booked_not_running_share": round(idle / booked, 3) if booked else 0.0,
        "states": dict(states),
    }
    return out


def _idle(procs: _Procs, key: str, o) -> dict:
    """Jobs one at a time on the idle fleet: create→SCHEDULED and create→RUNNING."""
    api = _Api(procs.port, key)  # type: ignore[attr-defined]
    c2r, c2s = [], []
    dbname = connection.settings_dict["NAME"]
    cpu0, pg0, engine0 = procs.cpu(), _pg_backend_cpu(dbname), _engine_cpu()
    for i in range(o["idle_samples"]):
        status, data = api.post("/api/v1/jobs", _job(100_000 + i, 0.2, image=o["image"]))
        if status != 201:
            raise CommandError(f"idle submission refused: {status} {data}")
        started = Workload.objects.filter(pk=data["id"], state__in=[
            State.RUNNING, State.SUCCEEDED, State.FAILED])
        w = _wait(started.first, procs, 60, "an idle job to run", poll_s=0.05)
        ev = {e.to_state: e.created_at.timestamp() for e in w.events.order_by("-created_at")}
        c2s.append(ev[State.SCHEDULED] - w.created_at.timestamp())
        c2r.append(ev[State.RUNNING] - w.created_at.timestamp())
        time.sleep(random.uniform(0.2, 1.0))  # not in step with the beat tick
    cpu1, pg1, engine1 = procs.cpu(), _pg_backend_cpu(dbname), _engine_cpu()
    n = max(1, len(c2r))
    # CPU per idle job, the sleeps between them included (heartbeats, ticks): by process
    per = {name: round((cpu1[name] - cpu0.get(name, 0.0)) * 1000 / n, 2) for name in cpu1}
    per["postgres"] = round(sum(v - pg0.get(pid, 0.0) for pid, v in pg1.items()) * 1000 / n, 2)
    if o["runtime"] == "docker":  # dockerd and containerd: the engine is shared, so approximate
        per["docker_engine"] = round((engine1 - engine0) * 1000 / n, 2)
    s2r = [r - s for s, r in zip(c2s, c2r, strict=True)]
    slowest = sorted(zip(c2r, c2s, strict=True), reverse=True)[:3]
    return {"create_to_scheduled_p50_s": _percentile(c2s, 0.5),
            "create_to_scheduled_p99_s": _percentile(c2s, 0.99),
            "create_to_running_p50_s": _percentile(c2r, 0.5),
            "create_to_running_p99_s": _percentile(c2r, 0.99),
            "create_to_running_max_s": _percentile(c2r, 1.0),
            # placed to RUNNING: the wake-up, the agent's start and its report
            "scheduled_to_running_p50_s": _percentile(s2r, 0.5),
            "scheduled_to_running_p99_s": _percentile(s2r, 0.99),
            # the three slowest samples: [create→RUNNING, of which create→SCHEDULED]
            "idle_slowest_s": [[round(r, 3), round(s, 3)] for r, s in slowest],
            "idle_cpu_ms_per_job": per,
            "idle_samples": len(c2r)}


def _violations() -> int:
    """Pairs of allocations that held the same GPU at once (whole GPUs; shares over 1000)."""
    with connection.cursor() as cur:
        cur.execute("""
            SELECT count(*) FROM scheduler_allocation a JOIN scheduler_allocation b
              ON a.gpu_id = b.gpu_id AND a.id < b.id AND a.workload_id <> b.workload_id
             WHERE a.milli + b.milli > 1000
               AND a.created_at < coalesce(b.released_at, 'infinity')
               AND b.created_at < coalesce(a.released_at, 'infinity')""")
        return int(cur.fetchone()[0])
