"""The operators' panel: every model is registered, and its list renders with search and filters;
each action calls its service, is audited as the operator and says per object what happened;
the fleet page is staff-only, shows every GPU, and costs the same queries for any fleet size.
The browser journey (cordon a host, instances land elsewhere) is tests/frontend/test_operator.py.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.apps import apps
from django.contrib import admin
from django.contrib.messages import get_messages
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from gpucloud.tenancy.models import AuditEvent

pytestmark = pytest.mark.django_db

OUR_APPS = ("tenancy", "catalogue", "scheduler", "billing", "agents")


def our_models():
    return [m for m in apps.get_models() if m._meta.app_label in OUR_APPS]


def test_every_model_is_registered():
    missing = [m.__name__ for m in our_models() if m not in admin.site._registry]
    assert missing == []


@pytest.mark.parametrize("model", our_models(), ids=lambda m: m.__name__)
def test_changelist_renders_with_search(model, admin_client, alice, catalog):
    model_admin = admin.site._registry[model]
    assert len(model_admin.list_display) >= 3, "useful list columns"
    url = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
    assert admin_client.get(url).status_code == 200
    if model_admin.search_fields:
        assert admin_client.get(url, {"q": "acme"}).status_code == 200


def test_suspend_action_in_the_admin(admin_client, alice):
    url = reverse("admin:tenancy_tenant_changelist")
    resp = admin_client.post(
        url,
        {"action": "suspend", "_selected_action": [str(alice.tenant.pk)]},
        follow=True,
        REMOTE_ADDR="198.51.100.1",
    )
    assert resp.status_code == 200
    alice.tenant.refresh_from_db()
    assert alice.tenant.status == "suspended"
    event = AuditEvent.objects.get(tenant=alice.tenant, action="tenant.suspend")
    assert event.actor_user.is_staff and event.source_ip == "198.51.100.1"
    # a suspended tenant still reads
    assert alice.client().get("/api/v1/tenant").json()["status"] == "suspended"
    assert alice.client().get("/api/v1/quotas").status_code == 200


# --- the operators' actions: each calls a service, is audited as the operator, and says
# --- per object what happened (docs/operators.md) --------------------------------------

OPERATOR_IP = "198.51.100.7"


def make_host(
    name: str, *, gpus: int = 2, model: str = "H100", region: str = "us-east-1", **fields
):
    """A host and its GPUs as registration leaves them (no agent needed for admin pages)."""
    from agents.models import Gpu, Host
    from gpucloud.catalogue.models import GpuModel, Region

    host = Host.objects.create(
        name=name,
        region=Region.objects.get(code=region),
        vcpus=224,
        memory_mib=2 * 1024 * 1024,
        last_heartbeat_at=timezone.now(),
        **fields,
    )
    gm = GpuModel.objects.get(code=model)
    for i in range(gpus):
        Gpu.objects.create(
            uuid=f"GPU-{name}-{i}",
            host=host,
            index=i,
            gpu_model=gm,
            utilisation=i / max(gpus - 1, 1),
            sampled_at=timezone.now(),
        )
    return host


def act(client, model: str, action: str, pks, **data):
    """Run an admin action on the changelist of `model` ("app_model"); returns the response."""
    url = reverse(f"admin:{model}_changelist")
    return client.post(
        url,
        {"action": action, "_selected_action": [str(pk) for pk in pks], **data},
        follow=True,
        REMOTE_ADDR=OPERATOR_IP,
    )


def said(resp) -> list[tuple[str, str]]:
    return [(m.level_tag, str(m)) for m in get_messages(resp.wsgi_request)]


def last_audit(action: str) -> AuditEvent:
    return AuditEvent.objects.filter(action=action).latest("created_at")


def assert_by_operator(event: AuditEvent) -> None:
    assert event.actor_user.is_staff and event.source_ip == OPERATOR_IP


def test_cordon_drain_and_uncordon_hosts_through_the_admin(admin_client, catalog):
    a, b = make_host("gpu-a"), make_host("gpu-b")
    resp = act(admin_client, "agents_host", "cordon", [a.pk, b.pk])
    assert (
        "success",
        "Cordoned gpu-a and gpu-b: no new work lands there; what runs there keeps running.",
    ) in said(resp)
    a.refresh_from_db()
    assert (a.state, a.admin_state) == ("cordoned", "cordoned")
    assert_by_operator(last_audit("host.cordon"))

    resp = act(admin_client, "agents_host", "drain", [a.pk])
    assert (
        "success",
        "Draining gpu-a: no new work lands there; instances run until their owners "
        "stop them; 0 batch job(s) got notice and go back to the queue when it ends.",
    ) in said(resp)
    assert_by_operator(last_audit("host.drain"))

    resp = act(admin_client, "agents_host", "uncordon", [a.pk, b.pk])
    assert ("success", "Uncordoned gpu-a and gpu-b: new work may land there again.") in said(resp)
    a.refresh_from_db()
    assert (a.state, a.admin_state) == ("ready", "ready")
    assert_by_operator(last_audit("host.uncordon"))


def test_replace_host_lets_one_registration_take_the_host_over(admin_client, catalog, client):
    from agents.models import Host
    from agents.services.registration import bootstrap_token_create
    from gpucloud.catalogue.models import Region

    a = make_host("gpu-a", token_hash="0" * 64)
    body = {
        "protocol_version": 1, "hostname": "gpu-a", "agent_version": "t", "gpu_backend": "sim",
        "runtime": "sim", "cpu_count": 224, "memory_mib": 2 * 1024 * 1024, "gpus": [],
    }

    def register():
        token = bootstrap_token_create(region=Region.objects.get(code="us-east-1"))[1]
        return client.post(
            "/agent/v1/register", {**body, "bootstrap_token": token},
            content_type="application/json",
        )

    assert register().status_code == 409  # not yet allowed
    resp = act(admin_client, "agents_host", "replace", [a.pk])
    [(level, text)] = said(resp)
    assert level == "success" and text.startswith("gpu-a: the next registration")
    assert_by_operator(last_audit("host.replace_allow"))
    taken = register()
    assert taken.status_code == 200 and taken.json()["host_id"] == str(a.pk)
    a.refresh_from_db()
    assert a.replace_allowed_at is None and a.token_hash != "0" * 64
    assert register().status_code == 409  # one takeover per permission
    assert Host.objects.count() == 1


def test_an_action_with_nothing_to_do_says_so_per_host(admin_client, catalog):
    a, b = make_host("gpu-a"), make_host("gpu-b", state="down", down_since=timezone.now())
    act(admin_client, "agents_host", "cordon", [a.pk])
    resp = act(admin_client, "agents_host", "cordon", [a.pk, b.pk])
    assert said(resp) == [
        ("success", "Cordoned gpu-b: no new work lands there; what runs there keeps running."),
        ("warning", "gpu-a was already cordoned: nothing changed."),
        ("warning", "gpu-b is down (no heartbeat): the change applies when the agent is back."),
    ]
    b.refresh_from_db()
    assert (b.state, b.admin_state) == ("down", "cordoned")


def test_clear_an_unhealthy_gpu(admin_client, catalog):
    from agents.models import Gpu

    make_host("gpu-a")
    Gpu.objects.filter(uuid="GPU-gpu-a-0").update(
        healthy=False, unhealthy_reason="XID 79: fell off the bus", unhealthy_since=timezone.now()
    )
    resp = act(admin_client, "agents_gpu", "mark_healthy", ["GPU-gpu-a-0", "GPU-gpu-a-1"])
    assert said(resp) == [
        ("success", "Cleared gpu-a#0: marked healthy, they take new work again."),
        ("warning", "GPU gpu-a#1 (GPU-gpu-a-1) is healthy: there was nothing to clear."),
    ]
    assert Gpu.objects.get(uuid="GPU-gpu-a-0").healthy
    event = last_audit("gpu.mark_healthy")
    assert_by_operator(event)
    assert event.data == {"was": "XID 79: fell off the bus"}


def test_suspend_and_resume_say_what_changed(admin_client, alice, charlie):
    act(admin_client, "tenancy_tenant", "suspend", [alice.tenant.pk])
    resp = act(admin_client, "tenancy_tenant", "suspend", [alice.tenant.pk, charlie.tenant.pk])
    assert said(resp) == [
        (
            "success",
            "Suspended Globex: they can still read and stop their work, but launch nothing new.",
        ),
        ("warning", "Acme was already suspended: nothing changed."),
    ]
    resp = act(admin_client, "tenancy_tenant", "reactivate", [alice.tenant.pk])
    assert said(resp) == [("success", "Resumed Acme: they can launch again.")]
    alice.tenant.refresh_from_db()
    assert alice.tenant.status == "active"
    assert_by_operator(last_audit("tenant.reactivate"))


def test_grant_credit_asks_how_much_and_why_then_credits_each_tenant(admin_client, alice, charlie):
    from billing.models import Account, LedgerEntry

    before = {a.tenant_id: a.balance for a in Account.objects.all()}
    pks = [alice.tenant.pk, charlie.tenant.pk]
    form = act(admin_client, "tenancy_tenant", "grant_credit", pks)
    assert form.status_code == 200 and b"Grant credit" in form.content and b"Globex" in form.content

    refused = act(
        admin_client, "tenancy_tenant", "grant_credit", pks, apply="1", amount="-5", memo=""
    )
    assert b"A credit is a positive amount: at least 0.01." in refused.content
    assert b"Say why the credit is granted" in refused.content
    assert not LedgerEntry.objects.filter(kind="credit").exists()

    resp = act(
        admin_client, "tenancy_tenant", "grant_credit", pks, apply="1", amount="25", memo="outage"
    )
    assert said(resp) == [("success", "Granted 25.00 of credit to Acme and Globex.")]
    for pk in pks:
        assert Account.objects.get(tenant_id=pk).balance == before.get(pk, 0) + Decimal(25)
    assert_by_operator(last_audit("billing.credit"))


def test_the_ledger_add_form_refuses_a_non_positive_credit_in_words(admin_client, alice):
    from billing.models import LedgerEntry

    url = reverse("admin:billing_ledgerentry_add")
    resp = admin_client.post(
        url, {"tenant": alice.tenant.pk, "kind": "credit", "amount": "0", "memo": "x"}
    )
    assert resp.status_code == 200
    assert b"A credit or payment is a positive amount" in resp.content
    assert not LedgerEntry.objects.filter(kind="credit").exists()


def test_a_bootstrap_token_is_shown_once_and_only_its_hash_is_kept(admin_client, catalog):
    from agents.models import BootstrapToken
    from agents.selectors import hash_token
    from gpucloud.catalogue.models import Region

    region = Region.objects.get(code="us-east-1")
    resp = act(admin_client, "catalogue_region", "create_bootstrap_token", [region.pk])
    [(level, text)] = said(resp)
    assert level == "warning" and "shown only once" in text
    secret = text.split("--bootstrap-token ")[1].strip()
    token = BootstrapToken.objects.get(token_hash=hash_token(secret))
    assert token.region == region and token.created_by.is_staff
    assert secret not in str(BootstrapToken.objects.values_list().get(pk=token.pk))
    assert_by_operator(last_audit("bootstrap_token.create"))
    # the message is consumed: the next page does not show it again
    assert (
        secret.encode()
        not in admin_client.get(reverse("admin:agents_bootstraptoken_changelist")).content
    )

    resp = admin_client.post(
        reverse("admin:agents_bootstraptoken_add"),
        {"region": region.pk, "note": "rack 7", "expires_at_0": "", "expires_at_1": ""},
        follow=True,
    )
    assert [text for level, text in said(resp) if "--bootstrap-token gpb_" in text]
    assert BootstrapToken.objects.filter(note="rack 7", created_by__is_staff=True).count() == 1


# --- the fleet page ---------------------------------------------------------------------


def test_the_fleet_page_is_for_staff_only(client, alice, admin_client):
    url = reverse("admin-fleet")
    for path in (url, reverse("admin-fleet-live"), reverse("admin-fleet-allocation")):
        anon = client.get(path)
        assert anon.status_code == 302 and "/admin/login/" in anon["Location"]
    client.force_login(alice.user)  # a tenant's owner, not staff
    refused = client.get(url)
    assert refused.status_code == 302 and "/admin/login/" in refused["Location"]
    assert admin_client.get(url).status_code == 200
    assert url.encode() in admin_client.get(reverse("admin:index")).content  # linked from the index


def test_an_empty_fleet_says_so(admin_client, db):
    page = admin_client.get(reverse("admin-fleet")).content.decode()
    assert "No hosts have joined yet." in page
    assert "No GPUs yet: no host has joined." in page
    assert "The queue is empty" in page
    assert (
        "Loading the allocation history" in page
    )  # the chart's loading state, until fleet.js answers


def test_the_fleet_page_shows_every_gpu_hosts_by_state_and_the_queue(
    admin_client, alice, catalog, settings
):
    from gpucloud.catalogue.models import InstanceType, Region
    from scheduler.models import Workload

    make_host("gpu-a", gpus=4)
    make_host("gpu-b", gpus=2, state="cordoned", admin_state="cordoned")
    make_host(
        "gpu-c",
        gpus=8,
        state="down",
        admin_state="draining",
        down_since=timezone.now() - timedelta(seconds=settings.HOST_LOST_GRACE_S + 5),
    )
    it, region = InstanceType.objects.get(code="h100.8x"), Region.objects.get(code="us-east-1")
    for priority, reason in [
        ("critical", "no host in us-east-1 has 8 free H100 GPUs"),
        ("standard", "no host in us-east-1 has 8 free H100 GPUs; 1 request ahead of you"),
        ("standard", "quota: 8 of 8 H100 GPUs in use"),
    ]:
        Workload.objects.create(
            tenant=alice.tenant,
            kind="instance",
            name="w",
            instance_type=it,
            region=region,
            image="pytorch/pytorch:2.4.0",
            priority=priority,
            reason=reason,
        )
    page = admin_client.get(reverse("admin-fleet")).content.decode()
    assert page.count('data-gpu="') == 14
    assert (
        'data-gpu="GPU-gpu-c-7"' in page and "c stale" in page
    )  # a down host's GPUs have no fresh sample
    assert '<td class="num" data-total="up">2</td>' in page
    assert '<td class="num" data-total="lost">1</td>' in page
    assert '<strong data-figure="pending">3</strong>' in page
    # the same wait, whatever the number of requests ahead, is one row
    assert (
        '<tr><td>no host in us-east-1 has 8 free H100 GPUs</td><td class="num">2</td></tr>' in page
    )
    live = admin_client.get(reverse("admin-fleet-live")).content.decode()
    assert live.count('hx-swap-oob="true"') == 2 and live.count('data-gpu="') == 14


def test_the_fleet_page_costs_the_same_queries_for_any_fleet_size(admin_client, catalog):
    def queries() -> int:
        with CaptureQueriesContext(connection) as ctx:
            assert admin_client.get(reverse("admin-fleet")).status_code == 200
        return len(ctx)

    make_host("gpu-a")
    small = queries()
    for i in range(6):
        make_host(f"gpu-x{i}", gpus=8)
    assert queries() == small


@pytest.mark.parametrize(
    "changes, expected",
    [
        ([], [0, 0, 0, 0]),
        ([(-5, 2)], [2, 2, 2, 2]),  # before the window: counts from its start
        ([(10, 1)], [0, 1, 1, 1]),  # on an edge
        ([(5, 1), (15, -1)], [0.5, 0.5, 0, 0]),  # half of two buckets
        (
            [(20, 4), (25, -4), (25, 2), (50, -2)],
            [0, 0, 3, 2],
        ),  # simultaneous changes; one past the end
    ],
)
def test_step_means_weigh_each_level_by_its_time(changes, expected):
    from frontend.fleet.selectors import step_means

    t0 = timezone.now()
    got = step_means(
        [(t0 + timedelta(seconds=s), d) for s, d in changes],
        start=t0,
        step=timedelta(seconds=10),
        points=4,
    )
    assert got == pytest.approx(expected)


def test_the_allocation_ratio_over_time(admin_client, alice, catalog):
    from agents.models import Gpu, Host
    from gpucloud.catalogue.models import InstanceType
    from scheduler.models import Allocation, Workload

    now = timezone.now()
    host = make_host("gpu-a", gpus=4)
    Host.objects.filter(pk=host.pk).update(created_at=now - timedelta(days=1))
    w = Workload.objects.create(
        tenant=alice.tenant,
        kind="instance",
        name="w",
        region=host.region,
        instance_type=InstanceType.objects.get(code="h100.2x"),
        image="pytorch/pytorch:2.4.0",
        state="running",
    )
    for gpu in Gpu.objects.filter(host=host)[:2]:  # half the fleet, for the last half hour
        Allocation.objects.create(
            gpu=gpu, host=host, workload=w, milli=1000, created_at=now - timedelta(minutes=30)
        )
    data = admin_client.get(reverse("admin-fleet-allocation"), {"window": "1h"}).json()
    assert len(data["times"]) == len(data["ratio"]) == 120
    assert data["ratio"][0] == 0 and data["ratio"][-1] == pytest.approx(0.5)
    assert data["capacity_gpus"][-1] == 4
    bad = admin_client.get(reverse("admin-fleet-allocation"), {"window": "2y"})
    assert (
        bad.status_code == 400 and "choose one of 1h, 6h, 24h, 7d" in bad.json()["error"]["message"]
    )


def test_a_service_refusal_becomes_a_sentence_not_a_server_error(alice):
    from billing.services import credit_grant
    from gpucloud.tenancy.admin import Outcome

    outcome = Outcome()
    outcome.attempt("Acme", "credit", lambda: credit_grant(tenant=alice.tenant, amount=Decimal(-1)))
    assert outcome.failed == ["Could not credit Acme: A credit is a positive amount."]
    assert outcome.done == []


def test_an_operator_cannot_point_a_budget_webhook_at_an_internal_address(admin_client, alice):
    from billing import services as billing_services

    budget = billing_services.budget_create(tenant=alice.tenant, name="b", monthly_amount=Decimal("10"))
    url = reverse("admin:billing_budget_change", args=[budget.pk])
    form = {"tenant": str(alice.tenant.pk), "name": "b", "monthly_amount": "10", "thresholds": "[50]",
            "notify_email": "on", "webhook_secret": budget.webhook_secret, "created_at_0": "2025-03-01",
            "created_at_1": "00:00:00"}
    resp = admin_client.post(url, {**form, "webhook_url": "https://169.254.169.254/latest/meta-data/"})
    assert resp.status_code == 200 and "metadata address" in resp.content.decode()
    budget.refresh_from_db()
    assert budget.webhook_url == ""
    assert admin_client.post(url, {**form, "webhook_url": "https://8.8.8.8/hook"}).status_code == 302
    budget.refresh_from_db()
    assert budget.webhook_url == "https://8.8.8.8/hook"
