# ruff: noqa: F811 - the agent API tests' fixtures are imported and then used as arguments
"""Checkpoint-aware preemption through the live loop: the real scheduler cycle preempts a
checkpointing batch job on a real agent (the daemon's code in process, and `python -m
agents.host` as its own process), both with the simulated runtime; the agent sends the
job's signal, waits its grace, stops it; the job is requeued with its attained service
kept and resumes from its checkpoint when it runs again.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
from django.utils import timezone

# The agent API tests' helpers and fixtures (a small catalogue, sim hosts, a live server).
from test_agent_api import (  # noqa: F401 - fixtures are used by name
    REPO,
    events,
    make_sim_host,
    new_token,
    region,
    state,
    triggered,
)

from agents.models import ContainerLog, Host
from agents.selectors import host_desired_containers
from agents.services.logs import workload_logs_request
from gpucloud.catalogue.models import InstanceType
from scheduler import snapshot
from scheduler.choices import State
from scheduler.cycle import run_cycle
from scheduler.models import Workload
from scheduler.services import workload_stop


def submit(tenant, region, name: str, **extra) -> Workload:
    """A queued 1-GPU H100 workload, as POST /api/v1/jobs or /instances leaves it."""
    extra.setdefault("kind", "instance")
    return Workload.objects.create(
        tenant=tenant, name=name, instance_type=InstanceType.objects.get(code="h100.1x"),
        region=region, image="gpucloud/test:1", command=["python", "train.py"], **extra)


def checkpointing_job(tenant, region, duration_s: int) -> Workload:
    return submit(tenant, region, "trainer", kind="job", priority="low",
                  env={"GPUCLOUD_SIM_DURATION_S": str(duration_s)},
                  checkpoint_signal="SIGUSR1", checkpoint_grace_s=5)


def attempts_of(sim, job: Workload) -> list[str]:
    return [o.instance_id for o in sim.runtime.list() if o.instance_id.startswith(str(job.pk))]


def test_a_preempted_checkpointing_job_gets_its_signal_then_resumes_with_its_service_kept(
    make_sim_host, region, alice
):
    sim = make_sim_host("sim-one", count=1)  # one GPU: the critical request needs the job's
    sim.agent.clock = sim.clock  # the grace runs on the test's clock, not on real seconds
    sim.beat()
    job = checkpointing_job(alice.tenant, region, duration_s=1000)
    run_cycle(region_id=region.pk)
    sim.beat(2)
    assert state(job) == State.RUNNING
    [first] = attempts_of(sim, job)
    sim.clock.advance(400)  # 400 s of the job's 1000 s of work done
    Workload.objects.filter(pk=job.pk).update(started_at=timezone.now() - timezone.timedelta(seconds=400))

    # A critical request arrives: the cycle gives the job notice, the grace it asked for
    # at least (here the policy's 30 s is longer), and its host's answer carries the notice.
    critical = submit(alice.tenant, region, "urgent", priority="critical")
    run_cycle(region_id=region.pk)
    job.refresh_from_db()
    assert job.stop_by is not None and job.preempted_for == critical.pk
    [desired] = host_desired_containers(host=sim.host)
    assert (desired.checkpoint_signal, desired.checkpoint_grace_s) == ("SIGUSR1", 5)
    assert desired.stop_by is not None

    # The agent sends the signal once; the job keeps running through its grace.
    sim.beat()
    assert sim.runtime.signals == [(first, "SIGUSR1")]
    assert "received SIGUSR1; checkpoint saved at 400 s" in sim.runtime.logs(first)
    sim.clock.advance(4)
    sim.beat()
    assert sim.runtime.signals == [(first, "SIGUSR1")]  # not twice
    assert state(job) == State.RUNNING
    # The grace runs out: the agent stops it, reports the exit, the control plane requeues
    # it as preempted (no retry spent) with the GPU-seconds it received kept.
    sim.clock.advance(1)
    sim.beat(2)
    job.refresh_from_db()
    assert (job.state, job.retries) == (State.PENDING, 0)
    assert (State.PREEMPTED, "preempted to make room for critical-class work") in events(job)
    assert job.attained_gpu_s >= 400
    queued = {r.request_id: r for r in snapshot._queue(region.pk, region.code)[0]}
    assert queued[str(job.pk)].checkpointable
    assert queued[str(job.pk)].attained_service == job.attained_gpu_s
    attained = job.attained_gpu_s

    # The critical work runs on the freed GPU, ends; the job runs again and resumes from
    # its checkpoint: only the 600 s of work left.
    run_cycle(region_id=region.pk)
    sim.beat(2)
    assert state(critical) == State.RUNNING
    workload_stop(workload=critical)
    sim.beat(2)
    assert state(critical) == State.STOPPED
    run_cycle(region_id=region.pk)
    sim.beat(2)
    job.refresh_from_db()
    assert job.state == State.RUNNING and job.attained_gpu_s == attained
    [second] = attempts_of(sim, job)
    assert second != first
    assert "resumed from checkpoint at 400 s" in sim.runtime.logs(second)
    sim.clock.advance(599)
    sim.beat()
    assert state(job) == State.RUNNING
    sim.clock.advance(1)
    sim.beat(2)
    assert state(job) == State.SUCCEEDED


def test_a_job_without_a_checkpoint_gets_no_signal_and_stops_at_the_end_of_its_notice(
    make_sim_host, region, alice
):
    sim = make_sim_host("sim-one", count=1)
    sim.agent.clock = sim.clock
    sim.beat()
    job = submit(alice.tenant, region, "plain", kind="job", priority="low",
                 env={"GPUCLOUD_SIM_DURATION_S": "1000"})
    run_cycle(region_id=region.pk)
    sim.beat(2)
    submit(alice.tenant, region, "urgent", priority="critical")
    noticed_at = timezone.now()
    run_cycle(region_id=region.pk, now=noticed_at)
    [desired] = host_desired_containers(host=sim.host)
    assert desired.checkpoint_signal is None and desired.stop_by is None
    sim.clock.advance(60)
    sim.beat(2)
    assert sim.runtime.signals == [] and state(job) == State.RUNNING
    run_cycle(region_id=region.pk, now=noticed_at + timezone.timedelta(seconds=31))
    sim.beat(2)
    assert state(job) == State.PENDING
    assert not any(o.state == "running" and o.instance_id.startswith(str(job.pk)) for o in sim.runtime.list())
    assert sim.runtime.signals == []


def test_the_real_agent_process_signals_stops_and_the_job_resumes(
    live_server, region, tmp_path, alice, triggered, settings
):
    settings.AGENT_HEARTBEAT_INTERVAL_S = 1  # the live server tells the agent its interval
    argv = [sys.executable, "-m", "agents.host", "--server", live_server.url,
            "--bootstrap-token", new_token(region), "--gpu-backend", "sim", "--runtime", "sim",
            "--sim-gpus", "1", "--sim-model", "H100", "--state-dir", str(tmp_path),
            "--hostname", "sim-daemon", "--log-level", "DEBUG"]
    log = tmp_path / "agent.log"
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=log.open("w"))

    def wait_for(predicate, what: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            assert proc.poll() is None, log.read_text()
            time.sleep(0.1)
        pytest.fail(f"timed out waiting for {what}\n{log.read_text()[-3000:]}")

    def job_log() -> str:
        return ContainerLog.objects.filter(workload=job).values_list("text", flat=True).first() or ""

    try:
        wait_for(lambda: Host.objects.filter(name="sim-daemon").exists(), "registration")
        job = checkpointing_job(alice.tenant, region, duration_s=3600)
        Workload.objects.filter(pk=job.pk).update(checkpoint_grace_s=1)
        run_cycle(region_id=region.pk)
        wait_for(lambda: state(job) == State.RUNNING, "the job RUNNING")
        critical = submit(alice.tenant, region, "urgent", priority="critical")
        run_cycle(region_id=region.pk)
        # signal, a 1 s grace, the stop, the exit reported: requeued, well before the notice
        # (30 s) would have run out
        wait_for(lambda: state(job) == State.PENDING, "the job requeued")
        job.refresh_from_db()
        assert job.retries == 0 and job.attained_gpu_s > 0
        assert (State.PREEMPTED, "preempted to make room for critical-class work") in events(job)
        # the container's last output (sent with its exit) records the signal
        wait_for(lambda: "received SIGUSR1; checkpoint saved at" in job_log(), "the signal in the log")
        run_cycle(region_id=region.pk)
        wait_for(lambda: state(critical) == State.RUNNING, "the critical work RUNNING")
        workload_stop(workload=critical)
        wait_for(lambda: state(critical) == State.STOPPED, "the critical work STOPPED")
        run_cycle(region_id=region.pk)
        wait_for(lambda: state(job) == State.RUNNING, "the job RUNNING again")
        workload_logs_request(workload=job, tail=50)
        wait_for(lambda: "resumed from checkpoint at" in job_log(), "the resumed run's log")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
