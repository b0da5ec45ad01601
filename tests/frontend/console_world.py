"""The console's routes and one world to call them in, shared by the console sweeps
(test_console_routes.py, test_console_forms.py) and the issue 27 reproductions.

`world`: an owner (alice), a viewer (victor) of the same tenant, and a row for every console
route that names one (`pks`: route name -> row), each kind of thing the console changes.
"""
from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pytest
from django.core.cache import cache
from django.db import transaction
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse

from alarms.services import alarm_create
from autoscaling.services import group_create
from billing.services import budget_create
from gpucloud.catalogue.models import InstanceType, Region
from gpucloud.tenancy.choices import Role
from gpucloud.tenancy.models import Membership
from gpucloud.tenancy.services import api_key_create, ssh_key_add
from scheduler.choices import State
from scheduler.models import JobArray, Workload
from tests.api.test_isolation import ED25519
from tests.api.test_scopes import _snapshot
from tests.conftest import make_actor, make_user
from volumes.services import volume_create

# A GET may write these, and they are no change a user made: the session (messages, the
# tenant kept in it) and the log tail a workload's page asks its agent for.
GET_MAY_WRITE = {"django_session", "agents_containerlog"}


def console_routes() -> list[tuple[str, URLPattern]]:
    """(name, URLPattern) of every route in the `console` namespace."""
    def walk(patterns, namespace=""):
        for p in patterns:
            if isinstance(p, URLResolver):
                yield from walk(p.url_patterns, f"{namespace}{p.namespace}:" if p.namespace else namespace)
            elif isinstance(p, URLPattern):
                yield f"{namespace}{p.name}", p
    return sorted((name.removeprefix("console:"), p) for name, p in walk(get_resolver().url_patterns)
                  if name.startswith("console:"))


@dataclass
class World:
    alice: Any  # owner
    victor: Any  # viewer
    pks: dict[str, Any]  # route name -> the row its <pk> names


def _workload(tenant, kind: str, name: str, state: str = State.PENDING) -> Workload:
    return Workload.objects.create(tenant=tenant, kind=kind, name=name, image="busybox", state=state,
                                   instance_type=InstanceType.objects.get(code="h100.1x"),
                                   region=Region.objects.get(code="us-east-1"))


@pytest.fixture
def world(catalog) -> World:
    alice = make_actor("alice@acme.test", tenant_name="Acme")
    victor = make_actor("victor@acme.test", tenant=alice.tenant, role=Role.VIEWER)
    # A second owner, so alice's own membership is not the last owner's.
    Membership.objects.create(tenant=alice.tenant, user=make_user("olga@acme.test"), role=Role.OWNER)
    t = alice.tenant
    instance = _workload(t, "instance", "box")
    stopped = _workload(t, "instance", "stopped-box", State.STOPPED)
    job = _workload(t, "job", "train")
    group = group_create(tenant=t, name="g", instance_type="h100.1x", region="us-east-1", image="busybox",
                         max_size=2)
    alarm, _ = alarm_create(tenant=t, name="queue", target_kind="tenant", metric="queued_gpus", threshold=4,
                            comparison="gt")
    key, _ = api_key_create(membership=alice.membership, name="ci", scopes=["read"])
    pks = {
        "job_array_stop": JobArray.objects.create(tenant=t, name="sweep", count=1),
        "group": group, "group_scale": group, "group_protect": group, "group_schedule": group, "group_delete": group,
        "alarm": alarm, "alarm_delete": alarm,
        "volume": volume_create(tenant=t, name="data", region="us-east-1", size_gib=10),
        "budget_delete": budget_create(tenant=t, name="cap", monthly_amount=Decimal("100"), hard_stop=True),
        "api_key_revoke": key,
        "ssh_key_delete": ssh_key_add(membership=alice.membership, name="laptop", public_key=ED25519),
        "member_role": alice.membership, "member_remove": alice.membership,
        "invoice": None, "invoice_csv": None,
    }
    pks["volume_delete"] = pks["volume"]
    for kind, row in (("instance", instance), ("job", job)):
        for suffix in ("", "_live", "_metrics", "_logs", "_stop", "_terminate"):
            pks[kind + suffix] = row
    pks["instance_start"] = stopped
    pks["instance_terminal"] = instance
    return World(alice=alice, victor=victor, pks=pks)


def _url(name: str, pattern: URLPattern, pks: dict[str, Any]) -> str:
    params = list(pattern.pattern.regex.groupindex)
    if not params:
        return reverse(f"console:{name}")
    if name == "password_reset_confirm":
        return reverse(f"console:{name}", kwargs={"uidb64": "MQ", "token": "set-password"})
    row = pks.get(name)
    pk = row.pk if row is not None else "00000000-0000-0000-0000-000000000000"
    return reverse(f"console:{name}", kwargs={"pk": pk})


def _signed_in(actor, *, csrf: bool = False) -> Client:
    client = Client(enforce_csrf_checks=csrf, raise_request_exception=False)
    client.force_login(actor.user)
    return client


# Where a cross-site link or form comes from, as a browser says it.
CROSS_SITE = {"HTTP_ORIGIN": "http://evil.example", "HTTP_REFERER": "http://evil.example/",
              "HTTP_SEC_FETCH_SITE": "cross-site"}


def _call(client: Client, method: str, url: str, sql: str | None, data: dict | None = None,
          **extra) -> tuple[Any, list[str]]:
    """One request in a savepoint rolled back after it: (response, the tables it changed, when
    `sql` is given)."""
    cache.clear()
    with transaction.atomic():
        before = _snapshot(sql) if sql else {}
        if method == "POST":
            resp = client.post(url, data or {}, **extra)
        else:
            resp = client.generic(method, url, **extra)
        after = _snapshot(sql) if sql else {}
        transaction.set_rollback(True)
    return resp, sorted(t for t in before if before[t] != after[t] and t not in GET_MAY_WRITE)
