"""GET /api/v1/metrics: one series of one of the tenant's workloads, from the minute roll-ups
and the raw samples the roll-up has not reached yet, against real PostgreSQL."""
from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from agents.models import GpuSample, GpuSampleMinute, Host
from gpucloud.catalogue.models import Price
from scheduler.models import Allocation
from tests.agents.test_agent_api import (  # noqa: F401 (fixtures)
    new_token,
    place,
    post,
    region,
    register_body,
    registered,
    triggered,
)

pytestmark = pytest.mark.django_db

URL = "/api/v1/metrics"


def aligned(t):
    """`t`, or a minute later: a multiple of 120 s since 1970, where a 120 s step begins."""
    return t if int(t.timestamp()) % 120 == 0 else t + timedelta(minutes=1)


def same(t_iso: str, t) -> bool:
    return timezone.datetime.fromisoformat(t_iso.replace("Z", "+00:00")) == t


@pytest.fixture
def history(registered, alice):
    """alice's instance holds GPU-h1-0 since two hours ago; GPU-h1-1 is nobody's and hot.
    Minute roll-ups until 10 minutes ago say 10 %, raw samples since then say 50 % and 70 %."""
    now = timezone.now()
    w = place(Host.objects.get(), alice.tenant)
    Allocation.objects.filter(workload=w).update(created_at=now - timedelta(hours=2))
    last_minute = (now - timedelta(minutes=10)).replace(second=0, microsecond=0)
    minutes, raw = [], []
    t = last_minute - timedelta(minutes=100)
    while t <= last_minute:
        for gpu, util in (("GPU-h1-0", 10.0), ("GPU-h1-1", 99.0)):
            minutes.append(GpuSampleMinute(gpu_id=gpu, minute=t, samples=12, gpu_util=util, temperature_c=40,
                                           power_w=100, mem_used_mib=1000))
        t += timedelta(minutes=1)
    t = last_minute + timedelta(seconds=60)
    i = 0
    while t <= now:
        for gpu, util in (("GPU-h1-0", 50.0 if i % 2 else 70.0), ("GPU-h1-1", 99.0)):
            raw.append(GpuSample(gpu_id=gpu, time=t, gpu_util=util, temperature_c=60, power_w=400,
                                 mem_used_mib=2000))
        t += timedelta(seconds=5)
        i += 1
    GpuSampleMinute.objects.bulk_create(minutes)
    GpuSample.objects.bulk_create(raw)
    return w, now, last_minute


def test_a_series_joins_minute_rollups_and_recent_raw_samples(alice, history):
    w, now, last_minute = history
    body = alice.client().get(URL, {"workload": str(w.pk), "metric": "gpu_util", "step": 60,
                                    "from": (now - timedelta(minutes=30)).isoformat()}).json()
    assert body["metric"] == "gpu_util" and body["unit"] == "percent" and body["stat"] == "avg"
    values = {p["t"]: p["value"] for p in body["points"]}
    when = {timezone.datetime.fromisoformat(t.replace("Z", "+00:00")): v for t, v in values.items()}
    old = [v for t, v in when.items() if t <= last_minute]
    new = [v for t, v in when.items() if t > last_minute]
    assert old and set(old) == {10.0}  # the roll-ups; the unheld GPU's 99 never counts
    assert new and all(50.0 <= v <= 70.0 for v in new)  # the raw samples after the last roll-up
    assert 99.0 not in values.values()


@pytest.mark.parametrize(("stat", "expected"), [("max", 70.0), ("min", 50.0), ("avg", 60.0)])
def test_stats_over_a_steps_samples(alice, history, stat, expected):
    w, now, last_minute = history
    start = aligned(last_minute + timedelta(minutes=2))
    body = alice.client().get(URL, {"workload": str(w.pk), "metric": "gpu_util", "stat": stat, "step": 120,
                                    "from": start.isoformat(), "to": (start + timedelta(minutes=2)).isoformat()})
    assert body.status_code == 200, body.content
    [point] = [p for p in body.json()["points"] if same(p["t"], start)]
    assert point["value"] == expected


def test_p95_is_the_95th_percentile(alice, history):
    w, now, last_minute = history
    start = aligned(last_minute + timedelta(minutes=2))
    GpuSample.objects.filter(gpu_id="GPU-h1-0", time__gte=start, time__lt=start + timedelta(minutes=2)).update(
        gpu_util=1.0)
    GpuSample.objects.filter(pk=GpuSample.objects.filter(gpu_id="GPU-h1-0", time__gte=start).order_by("time")
                             .first().pk).update(gpu_util=100.0)
    body = alice.client().get(URL, {"workload": str(w.pk), "metric": "gpu_util", "stat": "p95", "step": 120,
                                    "from": start.isoformat(), "to": (start + timedelta(minutes=2)).isoformat()})
    [point] = [p for p in body.json()["points"] if same(p["t"], start)]
    n = GpuSample.objects.filter(gpu_id="GPU-h1-0", time__gte=start, time__lt=start + timedelta(minutes=2)).count()
    # 24 samples: one at 100, the rest at 1; the 95th percentile interpolates between ranks 22 and 23
    pos = 0.95 * (n - 1)
    expected = 1.0 + (100.0 - 1.0) * (pos - int(pos)) if int(pos) + 1 == n - 1 else 1.0
    assert point["value"] == pytest.approx(expected, abs=0.01)


def test_other_metrics_and_their_units(alice, history):
    w, _, _ = history
    for metric, unit, value in (("gpu_temp", "celsius", 60.0), ("power", "watts", 400.0),
                                ("gpu_mem_used", "MiB", 2000.0)):
        body = alice.client().get(URL, {"workload": str(w.pk), "metric": metric, "step": 60,
                                        "from": (timezone.now() - timedelta(minutes=5)).isoformat()}).json()
        assert body["unit"] == unit and body["points"] and body["points"][-1]["value"] == value


def test_cost_rate_is_the_price_while_it_holds_gpus(alice, history, region):
    w, now, _ = history
    Price.objects.create(instance_type=w.instance_type, region=region, kind="on_demand",
                         per_hour=Decimal("2.5000"), effective_from=now - timedelta(days=30))
    Allocation.objects.filter(workload=w).update(created_at=now - timedelta(minutes=30))
    body = alice.client().get(URL, {"workload": str(w.pk), "metric": "cost_rate", "step": 600,
                                    "from": (now - timedelta(minutes=60)).isoformat()}).json()
    assert body["unit"] == "USD/hour"
    values = [p["value"] for p in body["points"]]
    assert values[0] == 0.0 and values[-1] == 2.5 and set(values) == {0.0, 2.5}


@pytest.mark.parametrize(("query", "field"), [
    ({"metric": "gpu_util"}, "workload"),
    ({"metric": "bogus"}, "metric"),
    ({"metric": "gpu_util", "stat": "median"}, "stat"),
    ({"metric": "gpu_util", "step": "1"}, "step"),
    ({"metric": "gpu_util", "from": "2026-01-02T00:00:00Z", "to": "2026-01-01T00:00:00Z"}, "from"),
    ({"metric": "gpu_util", "from": "2000-01-01T00:00:00Z", "step": "60"}, "step"),
    ({"metric": "gpu_util", "from": "yesterday"}, "from"),
    ({"metric": "gpu_util", "colour": "red"}, "colour"),
])
def test_bad_parameters_are_400_in_the_error_shape(alice, history, query, field):
    w, _, _ = history
    if field != "workload":
        query = {"workload": str(w.pk), **query}
    resp = alice.client().get(URL, query)
    assert resp.status_code == 400, resp.content
    assert field in resp.json()["error"]["fields"]


def test_another_tenants_workload_is_not_found(alice, charlie, history):
    w, _, _ = history
    resp = charlie.client().get(URL, {"workload": str(w.pk), "metric": "gpu_util"})
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found"
    assert alice.client().get(URL, {"workload": str(w.pk), "metric": "gpu_util"}).status_code == 200
