"""`/metrics`: per-GPU series under dcgm-exporter's names, and the platform's own, read by
prometheus_client's parser. Heartbeats go through the real agent API (fast path, Redis,
flush to PostgreSQL); cycles through the real scheduler."""
from __future__ import annotations

import pytest
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from agents import fastpath
from agents.models import Gpu, Host
from gpucloud import metrics
from scheduler.cycle import run_cycle
from tests.agents.test_agent_api import (  # noqa: F401 (fixtures)
    beat_body,
    new_token,
    place,
    post,
    region,
    register_body,
    registered,
    triggered,
)
from tests.scheduler.fleet import make_hosts

pytestmark = pytest.mark.django_db

DCGM = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL")


def scrape(client) -> dict[str, list]:
    resp = client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret")
    assert resp.status_code == 200
    return {f.name: f.samples for f in text_string_to_metric_families(resp.content.decode())}


def by_uuid(samples) -> dict[str, object]:
    return {s.labels["UUID"]: s for s in samples}


@override_settings(METRICS_TOKEN="s3cret")
def test_every_gpu_has_the_dcgm_series_with_its_tenant_and_workload(client, registered, alice):
    host_id, token = registered
    w = place(Host.objects.get(), alice.tenant)  # holds GPU-h1-0 whole
    gpus = [{"uuid": "GPU-h1-0", "gpu_util": 87.5, "mem_used_mib": 40000, "temperature_c": 71.0,
             "power_w": 512.5, "ecc_uncorrected": 0},
            {"uuid": "GPU-h1-1", "gpu_util": 0.0, "mem_used_mib": 512, "temperature_c": 33.0, "power_w": 70.0}]
    for seq in (1, 2):
        assert post(client, "/agent/v1/heartbeat", beat_body(host_id, seq, containers=None, gpus=gpus),
                    token=token).status_code == 200
    fastpath.heartbeats_flush()
    fams = scrape(client)
    for name in DCGM:
        assert set(by_uuid(fams[name])) == {"GPU-h1-0", "GPU-h1-1"}, name
    busy = {name: by_uuid(fams[name])["GPU-h1-0"] for name in DCGM}
    assert busy["DCGM_FI_DEV_GPU_UTIL"].value == 87.5
    assert busy["DCGM_FI_DEV_FB_USED"].value == 40000
    assert busy["DCGM_FI_DEV_FB_FREE"].value == Gpu.objects.get(uuid="GPU-h1-0").memory_mib - 40000
    assert busy["DCGM_FI_DEV_GPU_TEMP"].value == 71.0
    assert busy["DCGM_FI_DEV_POWER_USAGE"].value == 512.5
    labels = busy["DCGM_FI_DEV_GPU_UTIL"].labels
    assert labels == {"gpu": "0", "UUID": "GPU-h1-0", "device": "nvidia0", "modelName": "H100",
                      "Hostname": "h1", "tenant": alice.tenant.slug, "workload": str(w.pk)}
    idle = by_uuid(fams["DCGM_FI_DEV_GPU_UTIL"])["GPU-h1-1"]
    assert idle.value == 0.0 and idle.labels["tenant"] == "" and idle.labels["workload"] == ""
    # the heartbeats themselves: the first took the slow path, the second was answered from Redis
    beats = {s.labels["path"]: s.value for s in fams["gpucloud_heartbeats"] if s.name.endswith("_total")}
    assert beats == {"slow": 1.0, "fast": 1.0}
    count = {s.labels["path"]: s.value for s in fams["gpucloud_heartbeat_seconds"] if s.name.endswith("_count")}
    assert count == {"slow": 1.0, "fast": 1.0}


@override_settings(METRICS_TOKEN="s3cret")
def test_a_fatal_xid_and_ecc_errors_show(client, registered):
    host_id, token = registered
    gpus = [{"uuid": "GPU-h1-0", "gpu_util": 10.0, "xid_events": [79], "ecc_uncorrected": 2},
            {"uuid": "GPU-h1-1", "gpu_util": 10.0}]
    assert post(client, "/agent/v1/heartbeat", beat_body(host_id, 1, containers=None, gpus=gpus),
                token=token).status_code == 200
    fams = scrape(client)
    assert by_uuid(fams["DCGM_FI_DEV_XID_ERRORS"])["GPU-h1-0"].value == 79
    assert by_uuid(fams["DCGM_FI_DEV_XID_ERRORS"])["GPU-h1-1"].value == 0
    assert by_uuid(fams["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"])["GPU-h1-0"].value == 2


def test_the_scrape_costs_one_query_for_one_host_or_many(catalog):
    def fleet(n: int) -> int:
        now = timezone.now()
        for host in make_hosts(n=n, gpus=8):
            Gpu.objects.filter(host=host).update(sampled_at=now, utilisation=0.5, memory_used_mib=1000,
                                                 temperature_c=50, power_w=300)
        with CaptureQueriesContext(connection) as q:
            text = metrics.dcgm_text()
        assert text.count("DCGM_FI_DEV_GPU_TEMP{") == Gpu.objects.count()
        return len(q.captured_queries)

    assert fleet(1) == fleet(6) == 1


def test_a_gpu_never_measured_has_no_series_and_unknown_values_are_left_out(catalog):
    [host] = make_hosts(n=1, gpus=2)
    Gpu.objects.filter(host=host, index=0).update(sampled_at=timezone.now(), utilisation=0.25)
    text = metrics.dcgm_text()
    assert text.count("DCGM_FI_DEV_GPU_UTIL{") == 1 and 'gpu="0"' in text and 'gpu="1"' not in text
    assert "DCGM_FI_DEV_GPU_TEMP{" not in text  # no temperature reported: no sample, not a 0


@override_settings(METRICS_TOKEN="s3cret")
def test_cycles_record_phases_placements_and_queue_waits(alice, catalog, client):
    [host] = make_hosts(n=1, gpus=8)
    for name in ("a", "b"):
        assert alice.client().post("/api/v1/instances", {"name": name, "instance_type": "h100.4x",
                                                         "region": "us-east-1", "image": "busybox"},
                                   format="json").status_code == 201
    alice.client().post("/api/v1/instances", {"name": "c", "instance_type": "h100.1x", "region": "us-east-1",
                                              "image": "busybox", "priority": "low"}, format="json")
    run_cycle(region_id=host.region_id)
    fams = scrape(client)
    region = str(host.region_id)
    phases = {s.labels["phase"]: s.value for s in fams["gpucloud_scheduler_cycle_phase_seconds"]
              if s.name.endswith("_count") and s.labels["region"] == region}
    assert phases == {"load": 1.0, "plan": 1.0, "apply": 1.0}
    inf = [s for s in fams["gpucloud_scheduler_cycle_phase_seconds"]
           if s.name.endswith("_bucket") and s.labels["le"] == "+Inf" and s.labels["phase"] == "plan"]
    assert [s.value for s in inf] == [1.0]
    placed = [s.value for s in fams["gpucloud_scheduler_placements"] if s.name.endswith("_total")]
    assert placed == [2.0]
    waits = {s.labels["priority"]: s.value for s in fams["gpucloud_scheduler_queue_wait_seconds"]
             if s.name.endswith("_count")}
    assert waits == {"standard": 2.0}
    pending = {s.labels["priority"]: s.value for s in fams["gpucloud_queue_pending"]}
    assert pending == {"low": 1.0}
    assert [s.labels["priority"] for s in fams["gpucloud_queue_oldest_wait_seconds"]] == ["low"]
