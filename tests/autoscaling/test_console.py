"""The console's autoscaling pages (in process): list, create, detail with members and activity,
sizes, protection, scheduled actions; a viewer sees no controls, another tenant a 404."""
from __future__ import annotations

import pytest
from django.test import Client

from autoscaling import reconcile, services
from autoscaling.models import AutoscalingGroup, GroupMember, ScalingPolicy, ScheduledAction
from tests.agents.test_agent_api import region, triggered  # noqa: F401 (fixtures)
from tests.autoscaling.test_groups import prices  # noqa: F401 (fixture)

pytestmark = pytest.mark.django_db


def signed_in(actor) -> Client:
    client = Client()
    client.force_login(actor.user)
    return client


@pytest.fixture
def no_queue(prices):
    """The catalogue's slice (h100.1x on demand and spot in us-east-1), no queued evaluations, and
    a host the members could run on (a launch no host could ever run is refused)."""
    from tests.scheduler.fleet import make_hosts

    make_hosts(n=1)


CREATE = {"name": "web", "instance_type": "h100.1x", "region": "us-east-1", "image": "busybox",
          "env": "MODE=serve\nGPUCLOUD_SIM_GPU_UTIL=70", "min_size": "1", "desired": "2", "max_size": "4",
          "on_demand_base": "1", "on_demand_percent": "0", "warmup_s": "60", "target_gpu_util": "60"}


def test_create_a_group_then_see_its_members_activity_and_change_it(alice, no_queue):
    client = signed_in(alice)
    assert "No autoscaling groups yet" in client.get("/console/groups/").content.decode()
    resp = client.post("/console/groups/new", CREATE)
    group = AutoscalingGroup.objects.get(tenant=alice.tenant)
    assert resp.status_code == 302 and resp["Location"] == f"/console/groups/{group.pk}/"
    assert group.env == {"MODE": "serve", "GPUCLOUD_SIM_GPU_UTIL": "70"} and group.on_demand_percent == 0
    assert ScalingPolicy.objects.get(group=group).target == 60
    reconcile.reconcile_group(group.pk)  # what the beat or the queued evaluation does
    page = client.get(f"/console/groups/{group.pk}/").content.decode()
    members = list(GroupMember.objects.filter(group=group).select_related("workload"))
    assert len(members) == 2 and all(m.workload.name in page for m in members)
    assert "launched 2 members (1 on-demand, 1 spot) to reach desired 2" in page
    assert "keep Average GPU utilisation of the members (%) at 60.0" in page
    assert "web" in client.get("/console/groups/").content.decode()

    m = members[0]
    client.post(f"/console/groups/{group.pk}/protect", {"instance": str(m.workload_id), "protected": "1"})
    assert GroupMember.objects.get(pk=m.pk).protected
    client.post(f"/console/groups/{group.pk}/scale", {"min_size": "0", "desired": "3", "max_size": "4"})
    group.refresh_from_db()
    assert (group.min_size, group.desired) == (0, 3)
    resp = client.post(f"/console/groups/{group.pk}/schedule",
                       {"name": "night", "cron": "0 20 * * *", "timezone": "Europe/Berlin", "desired": "0"})
    assert resp.status_code == 302
    assert ScheduledAction.objects.get(group=group).timezone == "Europe/Berlin"
    page = client.get(f"/console/groups/{group.pk}/").content.decode()
    assert "desired 2 → 3 set by hand" in page and "night" in page and "scale-in protection on" in page


def test_bad_input_says_why_and_creates_nothing(alice, no_queue):
    client = signed_in(alice)
    resp = client.post("/console/groups/new", {**CREATE, "desired": "9"})
    assert resp.status_code == 400 and "Between min_size (1) and max_size (4)." in resp.content.decode()
    resp = client.post("/console/groups/new", {**CREATE, "image": "Not An Image"})
    assert resp.status_code == 400 and "Not a container image reference." in resp.content.decode()
    assert not AutoscalingGroup.objects.exists()
    group = services.group_create(tenant=alice.tenant, name="g", instance_type="h100.1x", region="us-east-1",
                                  image="busybox", max_size=2)
    resp = client.post(f"/console/groups/{group.pk}/schedule", {"name": "x", "cron": "every day", "timezone": "UTC",
                                                                "desired": "1"}, follow=True)
    assert "Five cron fields" in resp.content.decode() and not ScheduledAction.objects.exists()


def test_a_viewer_sees_no_controls_and_another_tenant_gets_404(alice, victor, charlie, no_queue):
    group = services.group_create(tenant=alice.tenant, name="g", instance_type="h100.1x", region="us-east-1",
                                  image="busybox", max_size=2, desired=1)
    page = signed_in(victor).get(f"/console/groups/{group.pk}/").content.decode()
    assert "Delete group" not in page and "Add scheduled action" not in page
    assert signed_in(victor).post(f"/console/groups/{group.pk}/delete").status_code == 403
    assert signed_in(victor).get("/console/groups/new").status_code == 403
    other = signed_in(charlie)
    for path in ("", "scale", "protect", "schedule", "delete"):
        url = f"/console/groups/{group.pk}/{path}"
        resp = other.post(url, {}) if path else other.get(url)
        assert resp.status_code == 404, path
    assert AutoscalingGroup.objects.filter(pk=group.pk).exists()


def test_operators_see_every_autoscaling_model_in_the_admin(admin_client, alice, no_queue):
    from django.apps import apps
    from django.contrib import admin
    from django.urls import reverse

    group = services.group_create(tenant=alice.tenant, name="g", instance_type="h100.1x", region="us-east-1",
                                  image="busybox", max_size=2, desired=1)
    reconcile.reconcile_group(group.pk)
    for model in apps.get_app_config("autoscaling").get_models():
        assert model in admin.site._registry, model.__name__
        url = reverse(f"admin:autoscaling_{model._meta.model_name}_changelist")
        assert admin_client.get(url, {"q": "g"}).status_code == 200, model.__name__
    resp = admin_client.get(reverse("admin:autoscaling_autoscalinggroup_change", args=[group.pk]))
    page = resp.content.decode()
    assert resp.status_code == 200 and GroupMember.objects.get(group=group).workload.name in page
