"""Simulated GPUs under the real Docker runtime (issue 28, deliverable 8), as in the demo: a
container's GPUCLOUD_SIM_GPU_UTIL drives the GPUs it was given, read through the runtime
interface (`Runtime.gpu_load`) from the engine's own containers. Before, only the simulated
runtime did, and every GPU of a Docker-run demo read about 0.2 % busy: flat charts, an alarm
on `gpu_util > 50` that never fired, target tracking that always scaled in.

The exporter's DCGM_FI_DEV_GPU_UTIL, the console's chart and an alarm all read the agent's
own samples (its heartbeats, flushed to PostgreSQL as in production)."""
from __future__ import annotations

import secrets
import time
from datetime import UTC, datetime, timedelta
from uuid import UUID

import pytest
from django.test import Client, override_settings
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

# The real engine, the real agent (sim GPUs, docker runtime) and their clean-up: the e2e module's.
from test_e2e_docker import (  # noqa: F401 - fixtures, used by name
    egress_rules,
    engine,
    launch,
    schedule,
    start_agent,
    state,
    triggered,
    us_east,
)

from agents import fastpath
from agents.host.config import AgentConfig
from agents.host.docker import LABEL_AGENT
from agents.host.runtime import LABEL_TENANT
from agents.models import GpuSample
from agents.services.registration import bootstrap_token_create
from alarms import services as alarms
from scheduler.choices import State

pytestmark = pytest.mark.django_db(transaction=True)

# A scope and host name of this module's own: no other test's containers (the e2e module's run
# under one scope for the whole session) can load these simulated GPUs.
SCOPE = f"simload-{secrets.token_hex(4)}"


@pytest.fixture
def docker_host(live_server, us_east, engine, tmp_path, triggered, egress_rules, alice):  # noqa: F811
    cfg = AgentConfig(
        server=live_server.url, bootstrap_token=bootstrap_token_create(region=us_east)[1], gpu_backend="sim",
        runtime="docker", docker_scope=SCOPE, sim_gpus=4, sim_model="L40S", state_dir=tmp_path / "agent",
        hostname=SCOPE,
    ).validated()
    h = start_agent(cfg)
    h.beat()
    yield h
    for ctr in engine.containers.list(all=True, filters={"label": f"{LABEL_AGENT}={SCOPE}"}):
        ctr.remove(force=True)
    for net in engine.networks.list(filters={"label": f"{LABEL_TENANT}={alice.tenant.pk}"}):
        net.remove()


@override_settings(METRICS_TOKEN="s3cret")
def test_a_containers_declared_load_shows_on_its_gpus_chart_and_fires_an_alarm(
    docker_host, us_east, engine, alice
):
    busy = launch(alice, name="busy", env={"GPUCLOUD_SIM_GPU_UTIL": "93"})
    idle = launch(alice, name="idle", env={"GPUCLOUD_SIM_GPU_UTIL": "0"})
    schedule(us_east)
    docker_host.beat(2)  # start both containers; report them running
    assert (state(busy), state(idle)) == (State.RUNNING, State.RUNNING)
    docker_host.beat(2)  # samples taken with the containers running
    fastpath.heartbeats_flush()

    gpus = {str(u) for u in busy.allocations.filter(active=True).values_list("gpu_id", flat=True)}
    others = {str(u) for u in idle.allocations.filter(active=True).values_list("gpu_id", flat=True)}
    assert len(gpus) == len(others) == 2

    # the exporter (what Grafana reads)
    scraped = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret").content.decode()
    util = {s.labels["UUID"]: s.value for f in text_string_to_metric_families(scraped)
            if f.name == "DCGM_FI_DEV_GPU_UTIL" for s in f.samples}
    assert all(util[u] >= 80 for u in gpus), util
    assert all(util[u] <= 5 for u in others), util

    # the console's chart, within a minute (its points average 2 s steps: a step that began before
    # the container ran reads lower, so the agent beats on until a step of its own is drawn)
    console = Client()
    console.force_login(alice.user)
    deadline = time.monotonic() + 60

    def drawn() -> dict:
        return console.get(f"/console/instances/{busy.pk}/metrics.json").json()

    while not ((chart := drawn())["t"] and all(v is not None and v >= 80 for g in chart["gpus"]
                                               for v in g["util"][-1:])):
        assert time.monotonic() < deadline, chart
        docker_host.beat()
        fastpath.heartbeats_flush()

    # an alarm on it fires: two one-minute periods of the agent's samples, on a test clock
    r = alice.client().post("/api/v1/alarms", {
        "name": "busy", "target_kind": "workload", "target_id": str(busy.pk), "metric": "gpu_util",
        "statistic": "avg", "period": 60, "threshold": 50, "comparison": "gt", "evaluation_periods": 2,
        "datapoints_to_alarm": 2,
    }, format="json")
    assert r.status_code == 201, r.content
    alarm_id = r.json()["id"]
    t0 = datetime.fromtimestamp((int(timezone.now().timestamp()) // 60 + 2) * 60, tz=UTC)
    for seconds in (10, 70):
        last = GpuSample.objects.order_by("-id").values_list("id", flat=True).first() or 0
        docker_host.beat()
        fastpath.heartbeats_flush()
        assert GpuSample.objects.filter(id__gt=last).update(time=t0 + timedelta(seconds=seconds))
    assert alarms.alarms_evaluate_due(now=t0 + timedelta(seconds=135)) == [UUID(alarm_id)]
    alarm = alice.client().get(f"/api/v1/alarms/{alarm_id}").json()
    assert alarm["state"] == "ALARM", alarm
    assert all(d["value"] >= 80 for d in alarm["datapoints"])
