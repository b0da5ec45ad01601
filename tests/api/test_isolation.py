"""Tenant isolation over every API route: another tenant's objects answer 404, lists never leak.

The route tables below must name every route in the URLconf; a new route that
is in neither table fails `test_every_route_is_covered`, so isolation is
checked for it before it ships.
"""
from __future__ import annotations

import pytest
from django.urls import URLPattern, URLResolver, get_resolver

from alarms.models import Alarm
from autoscaling.models import AutoscalingGroup, ScalingPolicy, ScheduledAction
from billing.models import Budget, Invoice, LedgerEntry
from gpucloud.tenancy.choices import Role
from gpucloud.tenancy.models import ApiKey, AuditEvent, Invitation, Membership, SshKey
from gpucloud.tenancy.services import api_key_create, invitation_create
from notifications.models import Notification
from scheduler.models import JobArray, Workload
from tests.conftest import make_user
from volumes.models import Volume

pytestmark = pytest.mark.django_db


def _member(actor):
    user = make_user(f"extra-{actor.tenant.slug}@x.test")
    return Membership.objects.create(tenant=actor.tenant, user=user, role=Role.MEMBER)


def _invitation(actor):
    invitation, _ = invitation_create(actor=actor.membership, email="inv@x.test", role=Role.MEMBER)
    return invitation


def _api_key(actor):
    key, _ = api_key_create(membership=actor.membership, name="victim", scopes=["read"])
    return key


def _audit_event(actor):
    return AuditEvent.objects.filter(tenant=actor.tenant).first()


def _workload(kind):
    def make(actor):
        from django.core.management import call_command

        from gpucloud.catalogue.models import InstanceType, Region
        from scheduler.models import Workload

        if not InstanceType.objects.exists():
            call_command("seed_catalog", stdout=open("/dev/null", "w"))
        return Workload.objects.create(
            tenant=actor.tenant, kind=kind, name=f"{kind}-{actor.tenant.slug}", image="busybox",
            instance_type=InstanceType.objects.get(code="h100.1x"), region=Region.objects.get(code="us-east-1"),
        )
    return make


def _job_array(actor):
    from scheduler.models import JobArray

    task = _workload("job")(actor)
    array = JobArray.objects.create(tenant=actor.tenant, name=f"array-{actor.tenant.slug}", count=1)
    Workload.objects.filter(pk=task.pk).update(array=array, array_index=0)
    return array


def _ledger_entry(actor):
    from billing.models import LedgerEntry

    return LedgerEntry.objects.filter(tenant=actor.tenant).first()  # the sign-up credit


def _invoice(actor):
    from datetime import date

    from billing.models import Invoice

    return Invoice.objects.get_or_create(tenant=actor.tenant, period_start=date(2025, 1, 1),
                                         defaults={"period_end": date(2025, 2, 1)})[0]


def _budget(actor):
    from decimal import Decimal

    from billing.services import budget_create

    return budget_create(tenant=actor.tenant, name=f"budget-{actor.tenant.slug}", monthly_amount=Decimal("100"))


def _alarm(actor):
    from alarms.models import Alarm
    from alarms.services import alarm_create

    n = Alarm.objects.filter(tenant=actor.tenant).count()
    return alarm_create(tenant=actor.tenant, name=f"alarm-{actor.tenant.slug}-{n}", target_kind="tenant",
                        metric="queued_gpus", threshold=4, comparison="gt")[0]


def _ssh_key(actor):
    from gpucloud.tenancy.services import ssh_key_add

    return ssh_key_add(membership=actor.membership, name=f"key-{actor.tenant.slug}", public_key=ED25519)


def _group(actor):
    import uuid

    from django.core.management import call_command

    from autoscaling.services import group_create
    from gpucloud.catalogue.models import InstanceType

    if not InstanceType.objects.exists():
        call_command("seed_catalog", stdout=open("/dev/null", "w"))
    return group_create(tenant=actor.tenant, name=f"g-{uuid.uuid4().hex[:8]}", instance_type="h100.1x",
                        region="us-east-1", image="busybox", max_size=2)


def _policy(actor):
    from autoscaling.services import policy_create

    return policy_create(group=_group(actor), name="util", kind="target_tracking", metric="gpu_util", target=50)


def _scheduled(actor):
    from autoscaling.services import scheduled_create

    return scheduled_create(group=_group(actor), name="night", cron="0 20 * * *", desired=0)
def _volume(actor):
    from django.core.management import call_command

    from gpucloud.catalogue.models import Region
    from volumes.services import volume_create

    if not Region.objects.filter(code="us-east-1").exists():
        call_command("seed_catalog", stdout=open("/dev/null", "w"))
    return volume_create(tenant=actor.tenant, name=f"vol-{actor.tenant.slug}", region="us-east-1", size_gib=10)


def _notification(actor):
    from notifications.models import Notification

    n = Notification.objects.filter(tenant=actor.tenant).count()
    return Notification.objects.create(user=actor.user, tenant=actor.tenant, event="instance.running",
                                       key=f"test:{actor.tenant.pk}:{n}", subject="Instance x is running")


ED25519 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIMeVOCYy/wjDgJNKrNZvHv2AK3f35LoEeTzSNC4Zt7Rj t@x"


# route name -> factory of one object of the given tenant
TENANT_OBJECT_ROUTES = {
    "ssh-key-detail": _ssh_key,
    "member-detail": _member,
    "invitation-detail": _invitation,
    "api-key-detail": _api_key,
    "api-key-revoke": _api_key,
    "audit-event-detail": _audit_event,
    "instance-detail": _workload("instance"),
    "instance-stop": _workload("instance"),
    "instance-start": _workload("instance"),
    "job-detail": _workload("job"),
    "job-stop": _workload("job"),
    "instance-metrics": _workload("instance"),
    "instance-logs": _workload("instance"),
    "job-metrics": _workload("job"),
    "job-logs": _workload("job"),
    "job-array-detail": _job_array,
    "job-array-stop": _job_array,
    "ledger-entry-detail": _ledger_entry,
    "invoice-detail": _invoice,
    "budget-detail": _budget,
    "autoscaling-group-detail": _group,
    "autoscaling-group-activities": _group,
    "autoscaling-group-protection": _group,
    "scaling-policy-detail": _policy,
    "scheduled-action-detail": _scheduled,
    "alarm-detail": _alarm,
    "alarm-history": _alarm,
    "volume-detail": _volume,
    "notification-detail": _notification,
}
# route name -> the model whose rows a list must restrict to the tenant
TENANT_LIST_ROUTES = {
    "member-list": Membership,
    "invitation-list": Invitation,
    "api-key-list": ApiKey,
    "audit-event-list": AuditEvent,
    "instance-list": Workload,
    "job-list": Workload,
    "job-array-list": JobArray,
    "ledger-entry-list": LedgerEntry,
    "invoice-list": Invoice,
    "budget-list": Budget,
    "ssh-key-list": SshKey,
    "autoscaling-group-list": AutoscalingGroup,
    "scaling-policy-list": ScalingPolicy,
    "scheduled-action-list": ScheduledAction,
    "alarm-list": Alarm,
    "volume-list": Volume,
    "notification-list": Notification,
}
# route name -> (query parameter naming the object, factory, other parameters): GET with another
# tenant's id is 404
TENANT_QUERY_ROUTES = {
    "metrics": ("workload", _workload("instance"), {"metric": "gpu_util"}),
}
# routes whose answer is about the caller's own tenant, without an object id
TENANT_SELF_ROUTES = {"tenant", "my-tenants", "quotas", "invitation-accept", "signup", "balance", "usage",
                      "availability", "notification-read", "notification-settings"}
# the public catalogue, the same for everybody
PUBLIC_ROUTES = {
    "region-list", "region-detail", "gpu-model-list", "gpu-model-detail", "instance-type-list",
    "instance-type-detail", "price-list", "price-detail", "spot-price-list", "api-not-found",
    "payments-webhook",  # the payment provider's: no tenant, signed by the provider
}


def api_routes():
    """(name, pattern) of every route under /api/v1/."""
    resolver = next(p for p in get_resolver().url_patterns
                    if isinstance(p, URLResolver) and str(p.pattern) == "api/v1/")

    def walk(patterns):
        for p in patterns:
            if isinstance(p, URLResolver):
                yield from walk(p.url_patterns)
            elif isinstance(p, URLPattern):
                yield p.name, p
    return list(walk(resolver.url_patterns))


def test_every_route_is_covered():
    names = {name for name, _ in api_routes()}
    covered = (set(TENANT_OBJECT_ROUTES) | set(TENANT_LIST_ROUTES) | set(TENANT_QUERY_ROUTES)
               | TENANT_SELF_ROUTES | PUBLIC_ROUTES)
    assert names - covered == set(), "add the new routes to the isolation tables"
    assert covered - names == set(), "stale names in the isolation tables"


def _path(name: str, pk) -> str:
    from django.urls import reverse

    return reverse(name, kwargs={"pk": pk})


def _snapshot():
    return {
        model.__name__: sorted(map(str, model.objects.values_list("pk", flat=True)))
        for model in (Membership, Invitation, ApiKey, SshKey)
    } | {"workloads": sorted(Workload.objects.values_list("state", "deleted_at"), key=str)} | {
        "revoked": sorted(str(k) for k in ApiKey.objects.filter(revoked_at__isnull=False).values_list("pk", flat=True))}


@pytest.mark.parametrize("route", sorted(TENANT_OBJECT_ROUTES))
def test_other_tenants_object_answers_404_for_every_method(route, alice, charlie):
    obj = TENANT_OBJECT_ROUTES[route](charlie)
    assert obj is not None
    pattern = dict(api_routes())[route]
    actions = getattr(pattern.callback, "actions", {})
    url = _path(route, obj.pk)
    before = _snapshot()
    for method in ("get", "patch", "put", "delete", "post"):
        resp = getattr(alice.client(), method)(url, {"role": "viewer", "name": "x"}, format="json")
        if method in actions:
            assert resp.status_code == 404, (route, method, resp.status_code)
            assert resp.json()["error"]["code"] == "not_found"
        else:
            assert resp.status_code == 405, (route, method, resp.status_code)
    assert _snapshot() == before
    # ...and the owner still reaches it: the 404 was isolation, not a broken route.
    if "get" in actions:
        assert charlie.client().get(url).status_code == 200


@pytest.mark.parametrize("route", sorted(TENANT_QUERY_ROUTES))
def test_another_tenants_object_named_in_the_query_answers_404(route, alice, charlie):
    from django.urls import reverse

    param, factory, rest = TENANT_QUERY_ROUTES[route]
    obj = factory(charlie)
    query = {param: str(obj.pk), **rest}
    resp = alice.client().get(reverse(route), query)
    assert resp.status_code == 404, resp.content
    assert resp.json()["error"]["code"] == "not_found"
    assert charlie.client().get(reverse(route), query).status_code == 200


@pytest.mark.parametrize("route", sorted(TENANT_LIST_ROUTES))
def test_lists_never_include_another_tenants_rows(route, alice, bob, charlie):
    for factory in TENANT_OBJECT_ROUTES.values():
        factory(charlie)
        factory(alice) if factory is not _member else None
    model = TENANT_LIST_ROUTES[route]
    from django.urls import reverse

    results = alice.client().get(reverse(route), {"page_size": 200}).json()["results"]
    assert results, "the list is not empty, or this test proves nothing"
    theirs = {str(pk) for pk in model.objects.filter(tenant=charlie.tenant).values_list("pk", flat=True)}
    assert theirs, "the other tenant has rows of this kind"
    assert not theirs & {str(r["id"]) for r in results}


def test_session_user_without_header_sees_only_own_tenant(alice, charlie):
    from rest_framework.test import APIClient

    client = APIClient()
    client.force_login(charlie.user)
    ids = {m["id"] for m in client.get("/api/v1/members").json()["results"]}
    assert ids == {str(charlie.membership.pk)}
    assert client.get(f"/api/v1/members/{alice.membership.pk}").status_code == 404
