"""Production settings: `manage.py check --deploy` is clean with nothing but the required
variables set, and there is no way to start without a SECRET_KEY outside the DEBUG demo.

Each case starts a fresh Python with a clean environment (settings are read once per process).
"""
from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(args: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    clean = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path),
             "GPUCLOUD_VAR_DIR": str(tmp_path / "var"), "DJANGO_SETTINGS_MODULE": "gpucloud.settings", **env}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=clean, capture_output=True, text=True, timeout=120)


PRODUCTION = {"DEBUG": "0", "SECRET_KEY": secrets.token_urlsafe(50), "ALLOWED_HOSTS": "gpu.example.test"}


def test_check_deploy_is_clean_with_production_settings(tmp_path):
    done = run(["manage.py", "check", "--deploy", "--fail-level", "WARNING"], tmp_path, **PRODUCTION)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues (1 silenced)." in done.stdout, done.stdout


SHOW = ("import django; django.setup(); from django.conf import settings as s; "
        "print(s.SECURE_SSL_REDIRECT, s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, s.SECURE_HSTS_SECONDS)")


def test_the_demo_relaxes_https_and_production_keeps_it(tmp_path):
    assert run(["-c", SHOW], tmp_path, DEBUG="1").stdout.split() == ["False", "False", "False", "0"]
    assert run(["-c", SHOW], tmp_path, **PRODUCTION).stdout.split() == ["True", "True", "True", "31536000"]


def test_no_secret_key_means_no_start_outside_debug(tmp_path):
    # GPUCLOUD_INSECURE_DEFAULT_SECRET=1 once let production start with the public demo key
    done = run(["-c", SHOW], tmp_path, DEBUG="0", GPUCLOUD_INSECURE_DEFAULT_SECRET="1")
    assert done.returncode != 0 and "SECRET_KEY is not set" in done.stderr
