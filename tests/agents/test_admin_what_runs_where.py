"""Operators see what runs where (issue 28): each GPU's workload and tenant on the host page,
a Host column in the workloads admin, both without a query per row."""
from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from scheduler.cycle import run_cycle
from scheduler.models import Allocation
from scheduler.services import WorkloadSpec, workload_launch
from tests.scheduler.fleet import make_hosts

pytestmark = pytest.mark.django_db


def launch(actor, name: str, itype: str = "h100.1x"):
    return workload_launch(tenant=actor.tenant, spec=WorkloadSpec(
        kind="instance", name=name, instance_type=itype, region="us-east-1", image="gpucloud/test:1"))


def test_the_host_page_lists_each_gpus_workload_and_tenant(admin_client, alice, charlie, catalog):
    [host] = make_hosts(n=1, gpus=8)
    mine, theirs = launch(alice, "alice-nb"), launch(charlie, "charlie-train", "h100.2x")
    run_cycle(region_id=host.region_id)
    assert Allocation.objects.filter(active=True).count() == 3
    page = admin_client.get(reverse("admin:agents_host_change", args=[host.pk])).content.decode()
    assert "workload (tenant)" in page.lower()
    assert "alice-nb</a> (instance, Acme)" in page and page.count("charlie-train</a> (instance, Globex)") == 2
    assert reverse("admin:scheduler_workload_change", args=[mine.pk]) in page
    assert reverse("admin:scheduler_workload_change", args=[theirs.pk]) in page


def test_the_workloads_admin_has_a_host_column_without_a_query_per_row(admin_client, alice, catalog):
    [host] = make_hosts(n=1, gpus=8)
    launch(alice, "one")
    run_cycle(region_id=host.region_id)
    url = reverse("admin:scheduler_workload_changelist")
    with CaptureQueriesContext(connection) as one:
        page = admin_client.get(url).content.decode()
    assert "column-host" in page and f'<td class="field-host">{host.name}</td>' in page
    for i in range(4):
        launch(alice, f"more-{i}")
    run_cycle(region_id=host.region_id)
    with CaptureQueriesContext(connection) as five:
        page = admin_client.get(url).content.decode()
    assert page.count(f'<td class="field-host">{host.name}</td>') == 5
    assert len(five.captured_queries) == len(one.captured_queries)
    # and an operator finds the work on a host by the host's name
    assert admin_client.get(url, {"q": host.name}).content.decode().count('class="field-host"') == 5
