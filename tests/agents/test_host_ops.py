# ruff: noqa: F811 - the agent API tests' fixtures are imported and then used as arguments
"""Operating hosts: cordon / drain / uncordon (also across an outage), GPU health from
samples (XID, uncorrectable ECC) failing the work on that GPU, GPU metrics stored and
rolled up, and container logs fetched through the heartbeat. Simulated agents on the
live server (the sim backend and runtime: no Docker needed here), placements by hand.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

# The agent API tests' helpers and fixtures (a small catalogue, sim hosts, a live server).
from test_agent_api import (  # noqa: F401 - fixtures are used by name
    beat_body,
    events,
    make_sim_host,
    new_token,
    place,
    post,
    region,
    registered,
    state,
    triggered,
)

from agents.choices import AdminState, HostState
from agents.models import ContainerLog, Gpu, GpuSample, GpuSampleMinute, Host
from agents.protocol import FINAL_TAIL_LINES
from agents.protocol import GpuSample as GpuSampleMsg
from agents.selectors import host_desired_containers
from agents.services.gpus import gpu_fault, gpu_samples_rollup
from agents.services.host_ops import gpu_mark_healthy, host_cordon, host_drain, host_replace_allow, host_uncordon
from agents.services.liveness import hosts_check_liveness
from agents.tasks import heartbeats_flush_task
from scheduler import snapshot
from scheduler.choices import State
from scheduler.cycle import run_cycle
from scheduler.notice import notice_text


def ready_hosts(region) -> dict[str, bool]:
    return {h.host_id: h.ready for h in snapshot._hosts(region.pk, region.code)}


def test_cordon_takes_no_new_work_and_uncordon_gives_it_back(make_sim_host, region, alice):
    a = make_sim_host("sim-a")
    a.beat()
    w = place(a.host, alice.tenant)
    a.beat(2)
    host = host_cordon(host=a.host)
    assert (host.state, host.admin_state) == (HostState.CORDONED, AdminState.CORDONED)
    assert ready_hosts(region) == {str(host.pk): False}  # the scheduler sees it as not ready
    a.beat()
    assert state(w) == State.RUNNING  # running work is left alone
    assert host_uncordon(host=a.host).state == HostState.READY
    assert ready_hosts(region) == {str(host.pk): True}


def test_drain_requeues_jobs_keeps_instances_and_survives_an_outage(
    make_sim_host, region, alice, settings
):
    a = make_sim_host("sim-a")
    a.beat()
    inst = place(a.host, alice.tenant)
    job = place(a.host, alice.tenant, kind="job", max_retries=0)
    a.beat(2)
    assert (state(inst), state(job)) == (State.RUNNING, State.RUNNING)
    drained_at = timezone.now()
    host, noticed = host_drain(host=a.host, now=drained_at)
    assert host.state == HostState.DRAINING and noticed == [str(job.pk)]
    job.refresh_from_db()
    # First a notice, as for a preemption: the job keeps running and may checkpoint.
    assert job.state == State.RUNNING and job.stop_by == drained_at + timedelta(seconds=30)
    assert job.stop_cause == f"host {host.name} is draining"
    assert job.shown_reason == notice_text(job.stop_cause, job.stop_by)
    run_cycle(region_id=region.pk, now=drained_at + timedelta(seconds=29))
    assert state(job) == State.RUNNING
    # Then the scheduler's cycle ends it. Not the job's fault: back in the queue without
    # spending a retry.
    run_cycle(region_id=region.pk, now=drained_at + timedelta(seconds=31))
    job.refresh_from_db()
    assert (job.state, job.retries) == (State.PENDING, 0)
    assert (State.PREEMPTED, f"host {host.name} is draining") in events(job)
    assert [d.instance_id.split(".")[0] for d in host_desired_containers(host=host)] == [
        str(inst.pk)
    ]
    a.beat(2)
    assert state(inst) == State.RUNNING
    assert {o.instance_id.split(".")[0] for o in a.runtime.list() if o.state == "running"} == {
        str(inst.pk)
    }
    # The host goes silent, is marked DOWN, and comes back: still DRAINING (the old bug).
    later = timezone.now() + timedelta(seconds=settings.HOST_DOWN_AFTER_S + 1)
    assert hosts_check_liveness(now=later).down == [str(host.pk)]
    assert Host.objects.get(pk=host.pk).state == HostState.DOWN
    a.beat()
    host.refresh_from_db()
    assert (host.state, host.admin_state) == (HostState.DRAINING, AdminState.DRAINING)
    assert ready_hosts(region) == {str(host.pk): False}
    # So does a re-registration (a reinstalled agent) after an outage.
    hosts_check_liveness(now=later + timedelta(seconds=settings.HOST_DOWN_AFTER_S + 1))
    host.refresh_from_db()
    assert host.state == HostState.DOWN
    a.agent.state = None  # a lost state dir: the agent registers again, as the operator allows
    host_replace_allow(host=host)
    a.agent.config = replace(a.agent.config, bootstrap_token=new_token(region))
    a.beat()
    host.refresh_from_db()
    assert host.state == HostState.DRAINING
    assert host_uncordon(host=host).state == HostState.READY


@pytest.mark.parametrize(
    "sample, fault",
    [
        (GpuSampleMsg("g", xid_events=[79]), "XID 79"),
        (GpuSampleMsg("g", xid_events=[13, 43]), None),  # application faults: the GPU is fine
        (GpuSampleMsg("g", ecc_uncorrected=2), "uncorrectable ECC errors: 2"),
        (GpuSampleMsg("g", healthy=False, error="GPU is lost"), "GPU is lost"),
        (GpuSampleMsg("g", ecc_corrected=500), None),
    ],
)
def test_which_samples_take_a_gpu_out(sample, fault):
    assert gpu_fault(sample, ecc_before=None) == fault


def test_an_ecc_count_that_does_not_grow_is_no_new_fault():
    assert gpu_fault(GpuSampleMsg("g", ecc_uncorrected=2), ecc_before=2) is None
    assert gpu_fault(GpuSampleMsg("g", ecc_uncorrected=3), ecc_before=2) is not None


def test_a_fatal_xid_fails_the_job_on_that_gpu_until_an_operator_clears_it(
    make_sim_host, region, alice
):
    a = make_sim_host("sim-a")
    a.beat()
    job = place(a.host, alice.tenant, kind="job", max_retries=1)
    other = place(a.host, alice.tenant)  # on another GPU: untouched
    a.beat(2)
    gpu = job.allocations.get().gpu
    a.backend.inject_xid(gpu.uuid, 79)
    a.beat()
    gpu.refresh_from_db()
    assert gpu.healthy is False and gpu.unhealthy_reason.startswith("XID 79")
    assert gpu.unhealthy_since is not None and (gpu.whole, gpu.used_milli) == (False, 0)
    job.refresh_from_db()
    assert (job.state, job.retries) == (State.PENDING, 1)  # a failure spends a retry
    reason = f"GPU {gpu.uuid} failed: XID 79"
    assert (State.FAILED, reason) in [(s, r[: len(reason)]) for s, r in events(job)]
    assert state(other) == State.RUNNING
    # Healthy samples do not bring it back, and the scheduler does not see it.
    a.beat(2)
    gpu.refresh_from_db()
    assert gpu.healthy is False
    host_view = next(h for h in snapshot._hosts(region.pk, region.code))
    assert gpu.uuid not in {g.uuid for g in host_view.gpus}
    gpu_mark_healthy(gpu=gpu)
    gpu.refresh_from_db()
    assert (gpu.healthy, gpu.unhealthy_reason, gpu.unhealthy_since) == (True, "", None)
    host_view = next(h for h in snapshot._hosts(region.pk, region.code))
    assert gpu.uuid in {g.uuid for g in host_view.gpus}


def test_an_uncorrectable_ecc_error_fails_an_instance(client, registered, alice):
    host_id, token = registered
    host = Host.objects.get(pk=host_id)
    w = place(host, alice.tenant)
    gpu = w.allocations.get().gpu
    body = beat_body(host_id, gpus=[{"uuid": gpu.uuid, "gpu_util": 50.0, "ecc_uncorrected": 1}])
    post(client, "/agent/v1/heartbeat", body, token=token)
    w.refresh_from_db()
    gpu.refresh_from_db()
    assert gpu.healthy is False and gpu.unhealthy_reason == "uncorrectable ECC errors: 1"
    assert w.state == State.FAILED and w.reason == f"GPU {gpu.uuid} failed: {gpu.unhealthy_reason}"


def test_samples_are_stored_rolled_up_into_minutes_and_pruned(make_sim_host, settings):
    a = make_sim_host("sim-a", count=2)
    a.beat(3)
    heartbeats_flush_task()  # what beat runs every second: heartbeats answered from Redis
    assert GpuSample.objects.count() == 6
    sample = GpuSample.objects.first()
    assert sample.gpu_util is not None and sample.power_w and sample.temperature_c
    later = timezone.now() + timedelta(minutes=2)
    out = gpu_samples_rollup(now=later)
    assert out.minutes >= 2 and GpuSampleMinute.objects.filter(samples__gt=0).count() >= 2
    assert sum(GpuSampleMinute.objects.values_list("samples", flat=True)) == 6
    assert gpu_samples_rollup(now=later).minutes >= 2  # idempotent: upserts, no duplicates
    assert sum(GpuSampleMinute.objects.values_list("samples", flat=True)) == 6
    much_later = later + timedelta(seconds=settings.GPU_SAMPLE_RAW_RETENTION_S)
    assert gpu_samples_rollup(now=much_later).raw_pruned == 6
    end = much_later + timedelta(days=settings.GPU_SAMPLE_MINUTE_RETENTION_DAYS)
    gpu_samples_rollup(now=end)
    assert not GpuSampleMinute.objects.exists()


def test_a_changed_heartbeat_buffers_its_samples_for_the_flush(client, registered):
    """A heartbeat taking the slow path whose GPUs stay healthy buffers its samples as the
    fast path does (no INSERT of its own, so no transaction for them); the once-a-second
    flush writes them with the fast path's batch (one COPY, outside Django's cursor)."""
    host_id, token = registered
    gpus = [{"uuid": u, "gpu_util": 10.0} for u in Gpu.objects.values_list("uuid", flat=True)]
    with CaptureQueriesContext(connection) as ctx:
        post(client, "/agent/v1/heartbeat", beat_body(host_id, gpus=gpus), token=token)
    assert not [q for q in ctx.captured_queries if '"agents_gpusample"' in q["sql"]]
    assert GpuSample.objects.count() == 0
    heartbeats_flush_task()
    assert sorted(GpuSample.objects.values_list("gpu_id", "gpu_util")) == sorted(
        (g["uuid"], 10.0) for g in gpus)
    # 16: the answer names the purged volumes the host should delete (one query, agents.signals.removals)
    # and the volume moves it takes part in (one query, read once for both signals: volumes.moves)
    assert len(ctx.captured_queries) <= 16, [q["sql"][:80] for q in ctx.captured_queries]


def test_instance_metrics_per_gpu_and_average_for_its_tenant_only(
    make_sim_host, alice, charlie
):
    a = make_sim_host("sim-a")
    a.beat()
    w = place(a.host, alice.tenant, it_code="h100.2x")
    a.beat(3)
    heartbeats_flush_task()  # samples reach the database with the once-a-second flush
    url = f"/api/v1/instances/{w.pk}/metrics"
    r = alice.client().get(url, {"step": 5})
    assert r.status_code == 200, r.content
    body = r.json()
    assert body["source"] == "raw" and body["step"] == 5
    assert [g["index"] for g in body["gpus"]] == [0, 1]
    points = [p for g in body["gpus"] for p in g["points"]]
    assert points and all(p["gpu_util"] > 30 for p in points)  # the sim load follows the container
    assert body["average"] and body["average"][-1]["gpus"] == 2
    # the default (the last hour, a minute a point) has points in its first minute: raw samples,
    # before any minute roll-up exists
    default = alice.client().get(url).json()
    assert default["source"] == "raw" and default["step"] == 60 and default["average"], default
    older = (timezone.now() - timedelta(hours=3)).isoformat()
    assert alice.client().get(url, {"since": older}).json()["source"] == "minute"
    r = alice.client().get(url, {"step": 5, "since": "2000-01-01T00:00:00Z"})
    assert r.status_code == 400 and "step" in r.json()["error"]["fields"]
    assert charlie.client().get(url).status_code == 404


def test_logs_come_through_the_next_heartbeat(make_sim_host, alice, charlie):
    a = make_sim_host("sim-a")
    a.beat()
    w = place(a.host, alice.tenant)
    a.beat(2)
    url = f"/api/v1/instances/{w.pk}/logs"
    first = alice.client().get(url, {"tail": 5}).json()
    assert first == {"text": "", "captured_at": None, "pending": True}
    assert charlie.client().get(url).status_code == 404
    a.beat()  # the answer carries the request
    assert ContainerLog.objects.get(workload=w).requested_at is not None
    a.beat()  # this heartbeat carries the tail
    log = ContainerLog.objects.get(workload=w)
    assert log.requested_at is None and "started gpucloud/test:1" in log.text
    body = alice.client().get(url, {"tail": 5}).json()
    assert "started gpucloud/test:1" in body["text"] and body["captured_at"]
    assert body["pending"] is False  # the tail arrived (each call still asks for a fresher one)
    assert alice.client().get(url, {"tail": 5}).json()["pending"] is True  # that request is unanswered
    a.beat(2)
    assert alice.client().get(url, {"tail": 5}).json()["pending"] is False
    a.runtime.stop(next(iter(a.agent.desired)).instance_id)
    a.beat(2)  # the instance ended; its last tail stays readable
    assert state(w) == State.FAILED
    body = alice.client().get(url).json()
    assert body["pending"] is False and "started gpucloud/test:1" in body["text"]


def test_operators_cordon_drain_uncordon_and_mark_gpus_healthy_in_the_admin(
    admin_client, registered
):
    from django.urls import reverse

    from gpucloud.tenancy.models import AuditEvent

    host_id, _ = registered
    url = reverse("admin:agents_host_changelist")
    for action, expected in (("cordon", HostState.CORDONED), ("drain", HostState.DRAINING),
                             ("uncordon", HostState.READY)):
        r = admin_client.post(url, {"action": action, "_selected_action": [host_id]})
        assert r.status_code == 302
        assert Host.objects.get(pk=host_id).state == expected
    assert {"host.cordon", "host.drain", "host.uncordon"} <= set(
        AuditEvent.objects.values_list("action", flat=True)
    )
    gpu = Gpu.objects.first()
    Gpu.objects.filter(pk=gpu.pk).update(healthy=False, unhealthy_reason="XID 79",
                                         unhealthy_since=timezone.now())
    r = admin_client.post(reverse("admin:agents_gpu_changelist"),
                          {"action": "mark_healthy", "_selected_action": [gpu.pk]})
    assert r.status_code == 302
    gpu.refresh_from_db()
    assert gpu.healthy and not gpu.unhealthy_reason


def test_log_tails_never_make_a_heartbeat_too_big_to_accept(make_sim_host, alice):
    """tqdm's bars are non-ASCII: a 256 KiB tail is 1.5 MB of JSON. Two at once must not
    make the host's heartbeat too big for the control plane (it would go DOWN)."""
    a = make_sim_host("sim-a")
    a.beat()
    work = [place(a.host, alice.tenant) for _ in range(4)]
    a.beat(2)
    for c in a.runtime._containers.values():
        c.log.append("epoch 1: " + "\u2588" * 300_000)
        c.log.append("loss 0.1")
    for w in work:
        alice.client().get(f"/api/v1/instances/{w.pk}/logs", {"tail": 10})
    for _ in range(6):
        a.beat()  # each reaches the control plane
    for w in work:
        body = alice.client().get(f"/api/v1/instances/{w.pk}/logs").json()
        assert body["text"].endswith("\u2588\nloss 0.1"), "every tail arrives, the newest part kept"
    assert {state(w) for w in work} == {State.RUNNING}


def test_a_finished_jobs_last_output_stays_readable_without_asking(make_sim_host, alice):
    """Nobody asked for the logs while it ran: the agent sends the last lines with the exit."""
    a = make_sim_host("sim-a")
    a.beat()
    job = place(a.host, alice.tenant, kind="job",
                env={"GPUCLOUD_SIM_DURATION_S": "5", "GPUCLOUD_SIM_EXIT_CODE": "3"})
    a.beat(2)
    assert state(job) == State.RUNNING and not ContainerLog.objects.filter(workload=job).exists()
    [c] = a.runtime._containers.values()
    c.log += [f"step {i}" for i in range(300)] + ["Traceback: CUDA out of memory"]
    a.clock.advance(6)
    a.beat()  # the exit, and the last lines with it
    assert state(job) == State.FAILED
    body = alice.client().get(f"/api/v1/jobs/{job.pk}/logs").json()
    lines = body["text"].splitlines()
    assert len(lines) == FINAL_TAIL_LINES and body["pending"] is False
    assert lines[-2:] == ["Traceback: CUDA out of memory", "job finished with exit code 3"]
    captured = ContainerLog.objects.get(workload=job).captured_at
    a.beat(3)  # sent once; the container is removed, the tail stays
    assert a.runtime.list() == []
    assert ContainerLog.objects.get(workload=job).captured_at == captured
    assert alice.client().get(f"/api/v1/jobs/{job.pk}/logs").json()["text"] == body["text"]


def test_a_host_cannot_store_log_tails_for_work_it_does_not_run(make_sim_host, alice):
    a, b = make_sim_host("sim-a"), make_sim_host("sim-b")
    a.beat()
    b.beat()
    w = place(a.host, alice.tenant)
    a.beat(2)
    [iid] = [d.instance_id for d in a.agent.desired]
    b.runtime._containers[iid] = copy.deepcopy(a.runtime._containers[iid])  # b claims a's container exited
    b.runtime._containers[iid].log.append("forged")
    b.runtime._containers[iid].state = "exited"
    b.beat()
    assert not ContainerLog.objects.filter(workload=w).exists()
    assert state(w) == State.RUNNING
