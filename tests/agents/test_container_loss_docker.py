"""Acceptance (issue 28, deliverable 1; issue 27, finding 3): what the runtime does is what the
renter sees, on a real Docker engine with the busybox image.

* Two agents with different Docker scopes share one engine: neither touches the other's
  containers (the demo's scopes are unique per var dir, tests/test_commands.py).
* A container removed, restarted or killed behind its agent's back becomes an event on its
  workload (`container_lost` / `container_restarted`, with the count and what the agent saw),
  in the API; an instance is recreated and says so, a job's run ends (no silent re-run) and
  it is billed for the seconds it ran.
* A start runc refuses is tried up to the bound, then the workload is FAILED with runc's own
  message, its GPUs free and nothing billed.
"""
from __future__ import annotations

import time
import uuid
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from test_agent_api import triggered  # noqa: F401 - a fixture, used by name
from test_docker_runtime import IMAGE
from test_e2e_docker import (  # noqa: F401 - fixtures, used by name
    IDLE,
    SCOPE,
    AgentConfig,
    docker_host,
    egress_rules,
    engine,
    launch,
    schedule,
    start_agent,
    state,
    tenant_networks,
    us_east,
)

from agents.host.docker import LABEL_AGENT
from agents.models import Gpu
from agents.services.registration import bootstrap_token_create
from billing.models import LedgerEntry
from billing.services import metering_run
from scheduler.choices import State
from scheduler.models import ContainerEvent, Workload

SCOPE_B = f"{SCOPE}-b"


def containers(engine, scope: str, w: Workload | None = None) -> list:
    labels = [f"{LABEL_AGENT}={scope}"] + ([f"gpucloud.workload={w.pk}"] if w is not None else [])
    return engine.containers.list(all=True, filters={"label": labels})


def beat_until(hosts, done, what: str, timeout_s: float = 60.0) -> None:
    """Heartbeat (each agent one pass) until `done()`: waiting on observed state."""
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"timed out: {what}"
        for h in hosts:
            h.beat()
        time.sleep(0.1)


@pytest.fixture
def second_host(live_server, us_east, engine, tmp_path, docker_host, tenant_networks):
    cfg = AgentConfig(
        server=live_server.url, bootstrap_token=bootstrap_token_create(region=us_east)[1], gpu_backend="sim",
        runtime="docker", docker_scope=SCOPE_B, sim_gpus=4, sim_model="L40S", state_dir=tmp_path / "agent-b",
        hostname=f"docker-{SCOPE_B}").validated()
    h = start_agent(cfg)
    h.beat()
    yield h
    for ctr in containers(engine, SCOPE_B):
        ctr.remove(force=True)


def test_two_agents_on_one_engine_keep_to_their_own_and_a_container_lost_behind_their_back_is_said(
    docker_host, second_host, us_east, engine, alice, tenant_networks
):
    a, b = docker_host, second_host
    boxes = [launch(alice, name=f"box-{i}") for i in range(3)]  # 2 GPUs each, 4 per host: both hosts
    schedule(us_east)
    beat_until([a, b], lambda: all(state(w) == State.RUNNING for w in boxes), "all run")
    on_a = [w for w in boxes if w.allocations.filter(active=True, host=a.host).exists()]
    on_b = [w for w in boxes if w.allocations.filter(active=True, host=b.host).exists()]
    assert on_a and on_b and len(on_a) + len(on_b) == 3
    ids = {c.id for c in containers(engine, SCOPE) + containers(engine, SCOPE_B)}
    assert len(containers(engine, SCOPE)) == len(on_a) and len(containers(engine, SCOPE_B)) == len(on_b)
    for _ in range(3):  # neither agent removes, stops or recreates the other's containers
        a.beat()
        b.beat()
    assert {c.id for c in containers(engine, SCOPE) + containers(engine, SCOPE_B)} == ids
    assert all(c.status == "running" for c in containers(engine, SCOPE) + containers(engine, SCOPE_B))
    assert not ContainerEvent.objects.exists()

    # docker rm -f behind agent A's back: the event, what A saw, and the instance recreated, said so
    lost = on_a[0]
    (gone,) = containers(engine, SCOPE, lost)
    gone.remove(force=True)
    a.beat()
    (event,) = ContainerEvent.objects.filter(workload=lost)
    assert (event.kind, event.count) == ("container_lost", 1)
    assert gone.id[:12] in event.detail and "the agent did not remove it" in event.detail
    assert state(lost) == State.RUNNING and lost.reason.startswith("container lost (1 of at most 3), recreated")
    beat_until([a], lambda: [c.status for c in containers(engine, SCOPE, lost)] == ["running"], "recreated")
    assert containers(engine, SCOPE, lost)[0].id != gone.id
    shown = alice.client().get(f"/api/v1/instances/{lost.pk}").json()
    assert [(e["kind"], e["count"]) for e in shown["container_events"]] == [("container_lost", 1)]
    assert shown["container_events"][0]["detail"] == event.detail
    assert {c.id for c in containers(engine, SCOPE_B)} == {c.id for c in containers(engine, SCOPE_B)} and all(
        c.status == "running" for c in containers(engine, SCOPE_B))  # B's untouched

    # docker restart behind agent B's back: container_restarted, counted
    restarted = on_b[0]
    (ctr,) = containers(engine, SCOPE_B, restarted)
    ctr.restart(timeout=1)
    beat_until([b], lambda: ContainerEvent.objects.filter(workload=restarted).exists(), "the restart is seen")
    (event,) = ContainerEvent.objects.filter(workload=restarted)
    assert (event.kind, event.count) == ("container_restarted", 1) and "without the agent's order" in event.detail
    assert state(restarted) == State.RUNNING

    # docker kill behind agent B's back: the instance ends FAILED with the exit, its GPUs free
    (ctr,) = containers(engine, SCOPE_B, restarted)
    ctr.kill()
    beat_until([b], lambda: state(restarted) == State.FAILED, "the kill is seen")
    assert restarted.reason == "container exited with code 137"
    assert not restarted.allocations.filter(active=True).exists()


def test_a_job_whose_container_is_removed_behind_the_agents_back_is_not_rerun_and_is_billed_for_its_run(
    docker_host, us_east, engine, alice, tenant_networks
):
    job = launch(alice, "jobs", name="long", command=IDLE, max_retries=0)
    schedule(us_east)
    beat_until([docker_host], lambda: state(job) == State.RUNNING, "the job runs")
    # it runs a few whole seconds first, so "billed for the seconds it ran" is a number to compare
    beat_until([docker_host], lambda: (timezone.now() - job.started_at).total_seconds() >= 3, "3 s of running")
    (ctr,) = containers(engine, SCOPE, job)
    ctr.remove(force=True)
    docker_host.beat()
    assert state(job) == State.FAILED and job.reason.startswith("container lost: container ")
    (event,) = ContainerEvent.objects.filter(workload=job)
    assert (event.kind, event.count) == ("container_lost", 1)
    docker_host.beat(3)
    assert containers(engine, SCOPE, job) == []  # not re-created: its retry policy allows one run
    assert job.events.filter(to_state=State.RUNNING).count() == 1
    assert not Gpu.objects.filter(used_milli__gt=0).exists()
    metering_run(now=timezone.now() + timedelta(hours=2))
    billed = sum(e.seconds for e in LedgerEntry.objects.filter(workload=job))
    ran = (job.ended_at - job.started_at).total_seconds()
    assert 0 < billed and abs(billed - ran) <= 1  # the seconds it ran, one run


def test_a_start_runc_refuses_fails_with_runcs_message_after_the_bound_and_holds_nothing(
    docker_host, us_east, engine, alice, tenant_networks
):
    w = launch(alice, name="refused")
    # A volume over /proc: the engine creates the container, runc refuses to start it. The API
    # refuses such a path (and its disguises, /./proc); the row is written here because this is a
    # test of what a refused start does, whatever spec made it (a runtime bug, an older check).
    volume = f"refused-{SCOPE}"
    Workload.objects.filter(pk=w.pk).update(mounts=[{"volume_id": str(uuid.uuid4()), "name": volume,
                                                     "path": "/proc", "read_only": False}])
    schedule(us_east)
    assert state(w) == State.SCHEDULED
    gpus = list(w.allocations.filter(active=True).values_list("gpu_id", flat=True))
    beat_until([docker_host], lambda: state(w) == State.FAILED, "the start is given up", timeout_s=120)
    assert w.reason.startswith("could not start (after 3 attempts): ")
    assert "runc" in w.reason and "/proc" in w.reason  # runc's own words
    assert not Gpu.objects.filter(uuid__in=gpus, used_milli__gt=0).exists()
    docker_host.beat(2)
    assert containers(engine, SCOPE, w) == []  # nothing left behind, nothing tried again
    assert docker_host.agent.runtime.list() == [] or all(
        o.instance_id.split(".")[0] != str(w.pk) for o in docker_host.agent.runtime.list())
    metering_run(now=timezone.now() + timedelta(hours=2))
    assert not LedgerEntry.objects.filter(workload=w).exists()
    assert alice.client().get(f"/api/v1/instances/{w.pk}").json()["cost_so_far"] == "0.00"
    for v in engine.volumes.list(filters={"name": volume}):
        v.remove(force=True)


@pytest.fixture
def demo_like_host(live_server, us_east, engine, tmp_path, tenant_networks, egress_rules, triggered):  # noqa: F811
    """An agent as the demo runs it: images the engine lacks run as the local busybox stand-in."""
    cfg = AgentConfig(
        server=live_server.url, bootstrap_token=bootstrap_token_create(region=us_east)[1], gpu_backend="sim",
        runtime="docker", docker_scope=SCOPE, docker_image_fallback=IMAGE, sim_gpus=4, sim_model="L40S",
        state_dir=tmp_path / "agent-demo", hostname=f"docker-{SCOPE}-demo").validated()
    h = start_agent(cfg)
    h.beat()
    return h


def test_a_mistyped_image_running_as_the_stand_in_is_said_in_the_reason_and_on_the_page(
    demo_like_host, us_east, engine, alice
):
    w = launch(alice, name="typo", image="pytorch/pytroch:2.4.0", command=[])
    schedule(us_east)
    beat_until([demo_like_host], lambda: state(w) == State.RUNNING, "it runs (as the stand-in)")
    said = "image pytorch/pytroch:2.4.0 is not on this host (a demo pulls nothing): the busybox stand-in runs"
    assert said in w.reason
    assert said in alice.client().get(f"/api/v1/instances/{w.pk}").json()["reason"]
    console = Client()
    console.force_login(alice.user)
    page = console.get(f"/console/instances/{w.pk}/")
    assert page.status_code == 200 and said in page.content.decode()
