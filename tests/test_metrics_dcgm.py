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


def reference_dcgm_text() -> str:
    """The DCGM text as the per-GPU formatting before the bulk one wrote it (ORM rows, one
    escape per label value, Python's repr for every number): the exposition must not change."""
    from scheduler.models import Allocation

    def esc(v: str) -> str:
        return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')

    owners: dict[str, list] = {}
    for a in Allocation.objects.filter(active=True).values("gpu_id", "workload_id", "workload__tenant__slug"):
        owners.setdefault(a["gpu_id"], []).append(a)
    lines: dict[str, list[str]] = {name: [] for name, _, _ in metrics._DCGM}
    for g in Gpu.objects.filter(sampled_at__isnull=False).select_related("host", "gpu_model").order_by("uuid"):
        own = owners.get(g.uuid, [])
        tenants = ",".join(sorted({a["workload__tenant__slug"] for a in own}))
        workloads = ",".join(sorted(str(a["workload_id"]) for a in own))
        lab = (f'{{gpu="{g.index}",UUID="{esc(g.uuid)}",device="nvidia{g.index}",modelName="{esc(g.gpu_model.name)}",'
               f'Hostname="{esc(g.host.name)}",tenant="{tenants}",workload="{workloads}"}} ')
        xid = metrics._XID.match(g.unhealthy_reason) if g.unhealthy_reason else None
        values = (round(g.utilisation * 100, 3), g.memory_used_mib, max(0, g.memory_mib - g.memory_used_mib),
                  g.temperature_c, g.power_w, int(xid.group(1)) if xid else 0, g.ecc_uncorrected or 0)
        for (name, _, _), v in zip(metrics._DCGM, values, strict=True):
            if v is not None:
                lines[name].append(f"{name}{lab}{repr(v)}\n")
    return "".join(f"# HELP {name} {doc}\n# TYPE {name} {kind}\n" + "".join(sorted(lines[name]))
                   for name, doc, kind in metrics._DCGM)


def sorted_blocks(text: str) -> str:
    """Each family's sample lines in a stable order (the query's row order is not specified)."""
    out, block = [], []
    for line in text.splitlines(keepends=True):
        if line.startswith("#"):
            out.extend(sorted(block))
            block = []
            out.append(line)
        else:
            block.append(line)
    return "".join(out + sorted(block))


def test_the_text_is_the_per_gpu_formatting_s_to_the_byte(catalog, alice):
    """Awkward values on a small fleet: names to escape, a GPU shared by two workloads of two
    tenants (and by two of one), integral and huge floats, no temperature, an XID, ECC counts,
    memory over the total, a GPU never measured."""
    from gpucloud.tenancy.models import Tenant
    from scheduler.models import Allocation, Workload
    from tests.conftest import make_actor

    a, b = make_hosts(n=2, gpus=4)
    Host.objects.filter(pk=a.pk).update(name='odd "host"\\with\nnewline')
    other = make_actor("carol@other.test", tenant_name="Zeta-9").tenant
    now = timezone.now()
    values = [(0.875, 40000, 71.0, 512.5, "", 0), (1.0, 90000, None, 1e16, "XID 79: fell off the bus", 2),
              (0.1234567, 0, 33.3, 1e15, "XID 013 graphics", None), (0.0, 512, 0.1 + 0.2, 70.0, "hot", 7),
              (0.3333333333, 1, -0.0, 123456.789, "", None), (0.5, 2, 45.25, None, "", 1),
              (0.25, 3, 1e-05, 2.5e-07, "", 0)]
    gpus = list(Gpu.objects.order_by("uuid"))
    for g, (util, used, temp, power, why, ecc) in zip(gpus, values, strict=False):
        Gpu.objects.filter(pk=g.pk).update(sampled_at=now, utilisation=util, memory_used_mib=used,
                                           temperature_c=temp, power_w=power, unhealthy_reason=why,
                                           ecc_uncorrected=ecc)
    from gpucloud.catalogue.models import InstanceType

    it = InstanceType.objects.get(code="h100.1x")

    def hold(tenant: Tenant, gpu: Gpu, milli: int) -> None:
        w = Workload.objects.create(tenant=tenant, kind="instance", name="w", instance_type=it,
                                    region=a.region, image="busybox", command=["true"])
        Allocation.objects.create(gpu=gpu, host=gpu.host, workload=w, milli=milli)

    hold(alice.tenant, gpus[0], 1000)
    for tenant in (other, alice.tenant, alice.tenant):
        hold(tenant, gpus[1], 250)
    hold(other, gpus[2], 500)
    text = metrics.dcgm_text()
    assert sorted_blocks(text) == reference_dcgm_text()
    assert 'Hostname="odd \\"host\\"\\\\with\\nnewline"' in text
    assert f'tenant="{alice.tenant.slug},{other.slug}"' in text or f'tenant="{other.slug},{alice.tenant.slug}"' in text
    assert text.count("DCGM_FI_DEV_GPU_UTIL{") == len(values)  # the eighth GPU was never measured
    assert " 1e+16\n" in text and " 1000000000000000.0\n" in text and " 0.30000000000000004\n" in text
