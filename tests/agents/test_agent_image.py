"""The agent's OCI image (deploy/agent.Dockerfile): built from Debian's packages with no
registry (deploy/build-agent-image.sh: a debootstrap base, cached, then the agent's code), its
container registers a simulated host with a live control plane, and its doctor runs.

The first build on a machine debootstraps Debian (minutes, the Debian mirror only); later ones
reuse the cached root and base image and Docker's layer cache.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from agents.models import Host
from agents.services.registration import bootstrap_token_create
from gpucloud.catalogue.models import Region

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "gpucloud/agent:test"


@pytest.fixture(scope="module")
def image() -> str:
    r = subprocess.run([str(ROOT / "deploy/build-agent-image.sh"), IMAGE], cwd=ROOT, capture_output=True,
                       text=True, timeout=1800, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    return IMAGE


def test_the_image_registers_a_simulated_host(image, catalog, live_server, tmp_path):
    region = Region.objects.get(code="us-east-1")
    token = bootstrap_token_create(region=region)[1]
    r = subprocess.run(
        ["docker", "run", "--rm", "--network", "host",
         "-e", f"GPUCLOUD_SERVER={live_server.url}", "-e", f"GPUCLOUD_BOOTSTRAP_TOKEN={token}",
         image, "--gpu-backend", "sim", "--runtime", "sim", "--sim-gpus", "2", "--sim-model", "L40S",
         "--hostname", "agent-image-test", "--once"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert r.returncode == 0, r.stderr
    host = Host.objects.get(name="agent-image-test")
    assert host.region == region
    assert sorted(g.gpu_model.code for g in host.gpus.all()) == ["L40S", "L40S"]


def test_the_images_doctor_checks_the_control_plane(image, live_server):
    r = subprocess.run(
        ["docker", "run", "--rm", "--network", "host", image, "doctor", "--json",
         "--server", live_server.url, "--gpu-backend", "sim", "--runtime", "sim"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    checks = {c["name"]: c for c in json.loads(r.stdout)["checks"]}
    assert checks["control-plane"]["status"] == "pass", checks["control-plane"]
    assert checks["nvidia-driver"]["status"] == "pass"
    assert r.returncode in (0, 1)  # the clock may warn on a machine without NTP
