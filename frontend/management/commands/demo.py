"""`make demo`: the whole platform on one laptop, on embedded defaults.

Migrates, seeds the catalogue and demo accounts, starts a Celery worker and beat
on the filesystem broker, serves the web app, and stops everything on Ctrl-C.
Later capabilities add their processes (simulated GPU hosts) to PROCESSES.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand


def _processes(port: int) -> list[tuple[str, list[str]]]:
    py = sys.executable
    beat_schedule = str(settings.VAR_DIR / "celerybeat-schedule")
    return [
        ("worker", [py, "-m", "celery", "-A", "gpucloud", "worker", "--pool=solo", "--loglevel=WARNING",
                    "--without-gossip", "--without-mingle"]),
        ("beat", [py, "-m", "celery", "-A", "gpucloud", "beat", "--loglevel=WARNING",
                  "--schedule", beat_schedule]),
        ("web", [py, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"]),
    ]


class Command(BaseCommand):
    help = "Run the local demo: migrate, seed, then web + worker + beat until Ctrl-C."

    def add_arguments(self, parser):
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
        parser.add_argument("--setup-only", action="store_true", help="Prepare the database and exit")

    def handle(self, *args, port: int, setup_only: bool, **options):
        call_command("migrate", verbosity=0, interactive=False)
        call_command("seed_catalog")
        call_command("demo_setup")
        if setup_only:
            return
        children: list[tuple[str, subprocess.Popen]] = []
        for name, argv in _processes(port):
            children.append((name, subprocess.Popen(argv, env=os.environ.copy())))
        url = f"http://127.0.0.1:{port}"
        self.stdout.write(self.style.SUCCESS(f"\ngpucloud is up: {url}"))
        self.stdout.write(f"API docs:       {url}/api/docs/")
        call_command("demo_setup")  # prints the logins again, below the URL
        self.stdout.write("Ctrl-C stops everything.\n")

        stopping = False

        def stop(*_):
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        try:
            while not stopping:
                for name, proc in children:
                    if proc.poll() is not None:
                        self.stderr.write(f"{name} exited with {proc.returncode}; stopping the demo")
                        stopping = True
                time.sleep(0.5)
        finally:
            for _, proc in children:
                if proc.poll() is None:
                    proc.terminate()
            for _, proc in children:
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
