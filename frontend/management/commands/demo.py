"""`make demo`: the whole platform on one laptop, on embedded defaults.

Migrates, seeds the catalogue and demo accounts, starts a Celery worker and beat
on the embedded SQLite broker (gpucloud/lib/broker.py), serves the web app, starts the
SSH gateway (`python -m gateway`, docs/connect.md; the agents tunnel to it), starts
simulated GPU hosts (real agents with the sim GPU backend, each with its own state dir
under var/agents/ and a fresh one-time bootstrap token), restarts any of
them that dies (gpucloud/lib/supervisor.py: exponential backoff, capped), and stops
everything on Ctrl-C or SIGTERM. GPUCLOUD_VAR_DIR moves var/ (the soak test uses a temporary one).

The hosts' GPUs are always simulated; their containers run in Docker when an engine answers
(`docker info`), else in the simulated runtime, and the start-up output says which and why.
No registry is needed: an image the engine does not have runs as a local busybox stand-in
(agents/host/standin.py), which says so first thing in the instance's log.
GPUCLOUD_DEMO_RUNTIME=sim|docker forces one (docker: fail when no engine answers).
"""
from __future__ import annotations

import hashlib
import io
import os
import signal
import socket
import sys
import time
from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from agents.host import standin
from agents.models import BootstrapToken
from agents.services.registration import bootstrap_token_create
from autoscaling.models import AutoscalingGroup
from autoscaling.services import group_create
from gpucloud.catalogue.models import Region
from gpucloud.lib.errors import ServiceError
from gpucloud.lib.supervisor import Supervisor
from gpucloud.tenancy.management.commands.demo_setup import DEMO_USER
from gpucloud.tenancy.models import Membership

# Simulated hosts: (host name, GPU model, GPU count), all in one region.
SIM_HOSTS = [("sim-h100-1", "H100", 8), ("sim-a100-1", "A100", 8), ("sim-l40s-1", "L40S", 4)]
SIM_REGION = "us-east-1"
RUNTIMES = ("auto", "docker", "sim")


def choose_runtime(wanted: str = "auto") -> tuple[str, str, str]:
    """(runtime, stand-in image, what to tell the user): ``docker`` when ``wanted`` allows it
    and an engine answers (the busybox stand-in image built there), else ``sim``."""
    if wanted not in RUNTIMES:
        raise CommandError(f"GPUCLOUD_DEMO_RUNTIME must be one of {', '.join(RUNTIMES)}, not {wanted!r}")
    if wanted == "sim":
        return "sim", "", "simulated (GPUCLOUD_DEMO_RUNTIME=sim): containers are simulated, nothing runs"
    import docker

    try:
        client = docker.from_env(timeout=20)
        version = client.version().get("Version", "?")
    except Exception as e:  # noqa: BLE001 - any failure means: no usable engine
        if wanted == "docker":
            raise CommandError(f"GPUCLOUD_DEMO_RUNTIME=docker, but no Docker engine answered: {e}") from e
        return "sim", "", f"simulated: no Docker engine answered ({e}); containers are simulated, nothing runs"
    try:
        image = standin.busybox_image(client)
    except Exception as e:  # noqa: BLE001 - no busybox here, an engine that refuses the import
        if wanted == "docker":
            raise CommandError(f"GPUCLOUD_DEMO_RUNTIME=docker, but the stand-in image cannot be built: {e}") from e
        return "sim", "", (f"simulated: the Docker engine answered, but the stand-in image cannot be built ({e}); "
                           "containers are simulated, nothing runs")
    finally:
        client.close()
    return "docker", image, (f"docker (engine {version}): containers really run, with simulated GPUs; an image "
                             f"this engine lacks runs as the local stand-in {image}, which says so in its log")


def docker_scope(var_dir: Path, host: str) -> str:
    """The Docker scope of demo agent ``host`` (pure): unique per var dir, so two demos on one
    engine (another PORT and GPUCLOUD_VAR_DIR, a soak test beside a demo) never see, and
    so never remove, each other's containers; the same across restarts of one demo, so an
    agent restarted finds its own containers again."""
    digest = hashlib.sha256(str(Path(var_dir).resolve()).encode()).hexdigest()[:10]
    return f"demo-{digest}-{host}"


def _sim_hosts(port: int, runtime: str = "sim", image: str = "") -> list[tuple[str, list[str], dict[str, str]]]:
    """(name, argv, extra env) per simulated host, each with a new bootstrap token.

    A token is minted on every start: an agent whose saved host token still works never
    uses it, and one whose database was reset registers again with it. Unused tokens of
    earlier starts are deleted so the admin's list stays short.
    """
    region = Region.objects.get(code=SIM_REGION)
    out = []
    for seed, (name, model, count) in enumerate(SIM_HOSTS):
        note = f"demo {name}"
        BootstrapToken.objects.filter(note=note, used_at__isnull=True).delete()
        _, secret = bootstrap_token_create(region=region, note=note)
        argv = [sys.executable, "-m", "agents.host", "--server", f"http://127.0.0.1:{port}",
                "--gpu-backend", "sim", "--runtime", runtime, "--sim-model", model,
                "--sim-gpus", str(count), "--sim-seed", str(seed), "--hostname", name,
                "--state-dir", str(settings.VAR_DIR / "agents" / name), "--log-level", "WARNING"]
        if runtime == "docker":
            # Each agent sees only its own containers (they share one engine); images the
            # engine lacks run as the stand-in.
            argv += ["--docker-scope", docker_scope(settings.VAR_DIR, name), "--docker-image-fallback", image]
        # Through the environment, so the token does not show in `ps`. Each agent keeps a
        # tunnel to the demo's gateway: `ssh` into its instances reaches the sim's fake shell.
        out.append((f"agent {name}", argv, {
            "GPUCLOUD_BOOTSTRAP_TOKEN": secret,
            "GPUCLOUD_GATEWAY_URL": f"ws://127.0.0.1:{settings.GATEWAY_TUNNEL_PORT}/tunnel"}))
    return out


#: the demo's batch pool (docs/autoscaling.md): jobs submitted with `queue=render` run on its
#: members only; it grows from zero when they arrive and shrinks back when they are done
DEMO_POOL = {"name": "render-pool", "job_queue": "render", "instance_type": "h100.1x", "region": SIM_REGION,
             "image": "busybox", "command": ["sleep", "infinity"], "min_size": 0, "max_size": 2,
             "cooldown_s": 120}


def seed_batch_pool() -> AutoscalingGroup | None:
    """The demo tenant's batch pool, once (idempotent; None when there is no demo tenant)."""
    member = Membership.objects.filter(user__username=DEMO_USER[0]).select_related("tenant", "user").first()
    if member is None:
        return None
    found = AutoscalingGroup.objects.for_tenant(member.tenant).filter(name=DEMO_POOL["name"]).first()
    if found is not None:
        return found
    try:
        return group_create(tenant=member.tenant, user=member.user, **DEMO_POOL)
    except ServiceError as e:  # a catalogue without the type: the demo runs without its pool
        sys.stderr.write(f"demo: no batch pool seeded: {e.message}\n")
        return None


def _wait_for_port(port: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    # Not fatal: the agents keep retrying with backoff.


def _processes(port: int) -> list[tuple[str, list[str]]]:
    py = sys.executable
    beat_schedule = str(settings.VAR_DIR / "celerybeat-schedule")
    return [
        ("worker", [py, "-m", "celery", "-A", "gpucloud", "worker", "--pool=solo", "--loglevel=WARNING",
                    "--without-gossip", "--without-mingle"]),
        ("beat", [py, "-m", "celery", "-A", "gpucloud", "beat", "--loglevel=WARNING",
                  "--schedule", beat_schedule]),
        ("web", [py, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"]),
        # SSH into instances (GATEWAY_SSH_PORT) and the agents' tunnels (GATEWAY_TUNNEL_PORT).
        ("gateway", [py, "-m", "gateway"]),
    ]


class Command(BaseCommand):
    help = "Run the local demo: migrate, seed, then web + worker + beat until Ctrl-C."

    def add_arguments(self, parser):
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
        parser.add_argument("--setup-only", action="store_true", help="Prepare the database and exit")

    def handle(self, *args, port: int, setup_only: bool, **options):
        call_command("migrate", verbosity=0, interactive=False)
        call_command("seed_catalog")
        call_command("seed_storage_prices")
        # The logins are printed once, below the URL (here only with --setup-only).
        call_command("demo_setup", stdout=self.stdout if setup_only else io.StringIO())
        seed_batch_pool()
        if setup_only:
            return
        runtime, image, about = choose_runtime(os.environ.get("GPUCLOUD_DEMO_RUNTIME", "auto"))
        self.stdout.write(f"demo: runtime {about}")
        self.stdout.flush()
        # 1 s after a crash, doubling to at most a minute; a minute's healthy run starts over at 1 s.
        supervisor = Supervisor(initial_s=1.0, max_s=60.0, healthy_after_s=60.0,
                                log=lambda line: self.stderr.write(f"demo: {line}"))
        stopping = False

        def stop(*_):
            nonlocal stopping
            stopping = True

        # Before the first child starts: a Ctrl-C from here on stops them all, cleanly.
        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        try:
            for name, argv in _processes(port):
                supervisor.start(name, argv, env=os.environ.copy())
            _wait_for_port(port)  # agents would only log "unreachable" until the web listens
            for name, argv, env in _sim_hosts(port, runtime, image):
                supervisor.start(name, argv, env={**os.environ, **env})
            url = f"http://127.0.0.1:{port}"
            self.stdout.write(self.style.SUCCESS(f"\ngpucloud is up: {url}"))
            self.stdout.write(f"console:        {url}/console/")
            self.stdout.write(f"API docs:       {url}/api/docs/")
            hosts = ", ".join(f"{name} ({count}x {model})" for name, model, count in SIM_HOSTS)
            self.stdout.write(f"GPU hosts:      {hosts} in {SIM_REGION} (simulated GPUs)")
            self.stdout.write(f"runtime:        {about}")
            shell = ("a shell in the container" if runtime == "docker"
                     else "a simulated instance answers with a fake shell")
            self.stdout.write(f"ssh:            ssh -p {settings.GATEWAY_PUBLIC_SSH_PORT} <instance id>@"
                              f"{settings.GATEWAY_PUBLIC_HOST}  (a key saved under Settings > SSH keys; {shell})")
            self.stdout.write(f"ports, terminal: {settings.GATEWAY_PUBLIC_HTTP_URL}/i/<instance id>/<port>/  "
                              "(signed in to the console; its instance page links them and opens a terminal)")
            call_command("demo_setup")  # the logins, below the URL
            self.stdout.write("Ctrl-C stops everything; a process that dies is restarted.\n")
            self.stdout.flush()
            # A child that dies is started again with a growing delay: the demo stays up for
            # days. Only Ctrl-C / SIGTERM ends it.
            while not stopping:
                supervisor.poll()
                time.sleep(0.5)
        finally:
            supervisor.stop()
