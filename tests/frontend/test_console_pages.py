"""Every console page in a browser: no sideways scrolling on a 375 px phone, screenshots of
each, and a viewer who sees no launch or stop controls and whose forged POST is refused.
"""
from __future__ import annotations

from decimal import Decimal

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from tests.frontend.conftest import horizontal_overflow, shot, sign_in


@pytest.fixture
def acme(alice, victor, catalog):
    """Acme with something on every page: an instance, a job, a budget, a key, an invoice."""
    from billing.services import budget_create, invoice_refresh
    from gpucloud.tenancy.services import ssh_key_add
    from scheduler.services import WorkloadSpec, workload_launch
    from tests.scheduler.fleet import make_hosts

    make_hosts(n=1)  # launches are refused where no host could ever run them
    make_hosts(n=1, model="A100", region="eu-central-1")
    from volumes.services import volume_create

    volume = volume_create(tenant=alice.tenant, name="datasets-with-a-rather-long-name-01", region="us-east-1",
                           size_gib=1000)
    instance = workload_launch(tenant=alice.tenant, user=alice.user, spec=WorkloadSpec(
        kind="instance", name="notebook-with-a-rather-long-name-01", instance_type="h100.8x",
        region="us-east-1", image="quay.io/jupyter/pytorch-notebook:cuda12-latest", ports=[8888],
        env={"HF_HOME": "/data/huggingface/cache/with/a/long/path"},
        volumes=[{"volume": volume.pk, "mount_path": "/workspace/datasets"}]))
    job = workload_launch(tenant=alice.tenant, user=alice.user, spec=WorkloadSpec(
        kind="job", name="nightly-eval", instance_type="a100.quarter", region="eu-central-1",
        image="pytorch/pytorch:2.4.0", command=["python", "eval.py"], max_retries=2))
    budget_create(tenant=alice.tenant, name="monthly", monthly_amount=Decimal("500.00"), hard_stop=True)
    ssh_key_add(membership=alice.membership, name="laptop",
                public_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGx0cmFpbmluZ2tleWZvcnRlc3RzIGxvbmc alice@laptop")
    invoice = invoice_refresh(tenant_id=alice.tenant.pk, month=timezone.now().date())
    from autoscaling.reconcile import reconcile_group
    from autoscaling.services import group_create, scheduled_create

    group = group_create(tenant=alice.tenant, user=alice.user, name="inference-servers-with-a-long-name",
                         instance_type="h100.1x", region="us-east-1", image="vllm/vllm-openai:latest",
                         min_size=1, max_size=4, desired=2, job_queue="render-frames-queue")
    scheduled_create(group=group, name="weeknights", cron="0 20 * * 1-5", timezone="Europe/Berlin", desired=1)
    reconcile_group(group.pk)
    from alarms.services import alarm_create

    alarm = alarm_create(tenant=alice.tenant, name="gpu utilisation over eighty percent", target_kind="workload",
                         target_id=str(instance.pk), metric="gpu_util", threshold=80, comparison="gt")[0]
    return {"instance": instance, "job": job, "invoice": invoice, "group": group, "alarm": alarm, "volume": volume}


def test_every_page_fits_a_phone(phone, live_server, alice, acme):
    pages = {
        "dashboard": "/console/", "catalogue": "/console/catalogue/", "launch": "/console/launch/",
        "instances": "/console/instances/", "instance": f"/console/instances/{acme['instance'].pk}/",
        "jobs": "/console/jobs/", "job": f"/console/jobs/{acme['job'].pk}/", "usage": "/console/usage/",
        "invoice": f"/console/invoices/{acme['invoice'].pk}/", "api-keys": "/console/settings/api-keys/",
        "ssh-keys": "/console/settings/ssh-keys/", "members": "/console/settings/members/",
        "quotas": "/console/settings/quotas/", "groups": "/console/groups/", "group-create": "/console/groups/new",
        "group": f"/console/groups/{acme['group'].pk}/",
        "alarms": "/console/alarms/",
        "alarm": f"/console/alarms/{acme['alarm'].pk}/",
        "volumes": "/console/volumes/",
        "volume": f"/console/volumes/{acme['volume'].pk}/",
    }
    for name, url in {"signin": "/console/signin/", "signup": "/console/signup/", "home": "/"}.items():
        phone.goto(url)
        assert horizontal_overflow(phone) == [], name
        shot(phone, f"phone-{name}")
    sign_in(phone, alice.user, live_server.url)
    for name, url in pages.items():
        phone.goto(url)
        expect(phone.locator("main h1")).to_be_visible()
        assert horizontal_overflow(phone) == [], name
        shot(phone, f"phone-{name}")


def test_viewer_sees_no_controls_and_a_forged_post_is_refused(page, live_server, victor, acme):
    from scheduler.models import Workload

    sign_in(page, victor.user, live_server.url)
    instance = acme["instance"]
    page.goto(f"/console/instances/{instance.pk}/")
    expect(page.locator("#state")).to_have_text("Pending")
    expect(page.get_by_role("button", name="Stop")).to_have_count(0)
    expect(page.get_by_role("button", name="Terminate")).to_have_count(0)
    expect(page.get_by_role("link", name="Launch")).to_have_count(0)
    page.goto("/console/catalogue/")
    expect(page.locator("#catalogue tbody tr").first).to_be_visible()
    expect(page.get_by_role("link", name="Launch")).to_have_count(0)
    shot(page, "viewer-catalogue")

    # A forged POST with a valid CSRF token, straight from the viewer's browser session.
    workloads = Workload.objects.count()
    token = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
    for action in ("stop", "terminate"):
        answer = page.request.post(f"/console/instances/{instance.pk}/{action}",
                                   headers={"X-CSRFToken": token}, max_redirects=0)
        assert answer.status == 403
        assert "Your role (viewer) does not allow workloads.manage." in answer.text()
    answer = page.request.post("/console/launch/", headers={"X-CSRFToken": token},
                               form={"name": "forged", "instance_type": "h100.1x", "region": "us-east-1",
                                     "template": "pytorch", "kind": "instance"}, max_redirects=0)
    assert answer.status == 403
    instance.refresh_from_db()
    assert (instance.state, instance.deleted_at) == ("pending", None)
    assert Workload.objects.count() == workloads  # the forged launch made nothing
