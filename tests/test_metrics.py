from __future__ import annotations

import pytest
from django.test import override_settings

from scheduler.cycle import run_cycle
from tests.scheduler.fleet import make_hosts

pytestmark = pytest.mark.django_db


@override_settings(METRICS_TOKEN="s3cret")
def test_metrics_show_the_fleet_and_the_queue(alice, catalog, client):
    [host] = make_hosts(n=1, gpus=8)
    for name in ("a", "b"):
        alice.client().post("/api/v1/instances", {"name": name, "instance_type": "h100.4x", "region": "us-east-1",
                                                  "image": "busybox"}, format="json")
    alice.client().post("/api/v1/instances", {"name": "c", "instance_type": "h100.1x", "region": "us-east-1",
                                              "image": "busybox", "priority": "low"}, format="json")
    run_cycle(region_id=host.region_id)
    body = client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret").content.decode()
    assert 'gpucloud_gpus{healthy="true",model="H100",region="us-east-1"} 8.0' in body
    assert 'gpucloud_gpus_allocated{model="H100",region="us-east-1"} 8.0' in body
    assert 'gpucloud_workloads{kind="instance",priority="standard",state="scheduled"} 2.0' in body
    assert 'gpucloud_workloads{kind="instance",priority="low",state="pending"} 1.0' in body
    assert 'gpucloud_hosts{region="us-east-1",state="ready"} 1.0' in body


@override_settings(METRICS_TOKEN="s3cret")
def test_metrics_token_is_required_when_set(client, db):
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret").status_code == 200


@override_settings(METRICS_TOKEN="", DEBUG=False)
def test_metrics_without_a_token_are_refused_in_production(client, db):
    resp = client.get("/metrics")
    assert resp.status_code == 403 and b"gpucloud_" not in resp.content
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer ").status_code == 403


@override_settings(METRICS_TOKEN="", DEBUG=True)
def test_metrics_without_a_token_are_served_to_the_demo(client, db):
    assert client.get("/metrics").status_code == 200
