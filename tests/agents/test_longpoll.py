"""The long poll: a placement reaches a real agent process at once, without the gateway.

The heartbeat interval is an hour, so the agent process, once it has heartbeated and parked
its long poll (`POST /agent/v1/wait`), would not call again for an hour: a job placed after
that and RUNNING within the bounded wait below got there because the long poll answered.
Real PostgreSQL, Redis, live server, agent process (simulated GPUs and runtime).
"""
from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from agents import longpoll
from agents.models import Host
from scheduler.choices import State
from tests.agents.test_agent_api import new_token, place, region, state, triggered  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)
REPO = Path(__file__).resolve().parents[2]


def wait_until(predicate, what: str, proc: subprocess.Popen, timeout: float = 30.0):
    tick = threading.Event()
    deadline = time.monotonic() + timeout
    while not (got := predicate()):
        assert proc.poll() is None, f"the agent exited: {proc.stdout.read()[-2000:]}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        tick.wait(0.05)
    return got


def _parked(host_id: str) -> bool:
    listener = longpoll._listener
    return listener is not None and bool(listener._waiting.get(host_id))


def test_a_placement_reaches_a_long_polling_agent_process_within_one_heartbeat_interval(
        live_server, region, alice, settings, tmp_path, triggered):  # noqa: F811
    settings.AGENT_HEARTBEAT_INTERVAL_S = 3600
    settings.AGENT_LONGPOLL_SLOTS = 4
    proc = subprocess.Popen(
        [sys.executable, "-m", "agents.host", "--server", live_server.url, "--bootstrap-token",
         new_token(region), "--gpu-backend", "sim", "--runtime", "sim", "--state-dir",
         str(tmp_path / "agent"), "--hostname", "lp-1", "--log-level", "INFO"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        host = wait_until(lambda: Host.objects.filter(name="lp-1").first(), "registration", proc)
        # its first heartbeat answered (with a desired_version), its long poll is parked
        wait_until(lambda: _parked(str(host.pk)), "the agent's long poll", proc)

        w = place(host, alice.tenant, kind="job", env={"GPUCLOUD_SIM_DURATION_S": "600"})
        wait_until(lambda: state(w) == State.RUNNING, "the job to run", proc)
        # and it polls again for the next change
        wait_until(lambda: _parked(str(host.pk)), "the next long poll", proc)
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_without_long_poll_slots_answers_carry_no_version_and_a_wait_changes_nothing(
        live_server, region, settings, tmp_path):  # noqa: F811
    from agents.host.client import ControlPlaneClient
    from agents.host.sim import SimGpuBackend
    from agents.protocol import Heartbeat, RegisterRequest, WaitRequest

    settings.AGENT_LONGPOLL_SLOTS = 0
    client = ControlPlaneClient(live_server.url)
    backend = SimGpuBackend(model="H100", count=8, hostname="lp-2")
    reg = client.register(RegisterRequest(
        bootstrap_token=new_token(region), hostname="lp-2", agent_version="t", gpu_backend="sim",
        runtime="sim", cpu_count=224, memory_mib=2 * 1024 * 1024, gpus=backend.inventory()))
    resp = client.heartbeat(reg.host_token, Heartbeat(host_id=reg.host_id, seq=1, gpus=backend.sample()))
    assert resp.desired_version is None
    assert client.wait(reg.host_token, WaitRequest(reg.host_id, "0", timeout_s=1)).changed is False
