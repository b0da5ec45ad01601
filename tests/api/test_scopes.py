"""Key scopes over every API route: the table in gpucloud/api/scopes.py is what the API does.

`test_every_route_and_method_is_in_the_table` walks the URL resolver: a new route
under /api/ (or a new method on one) without a row fails it. The big test then calls
every row with a `read`, a `write` and an `admin` key of an owner (so the role never
restricts): a key below the row's scope gets 403 `insufficient_scope` and changes
nothing in the database; a key with it is never refused for its scope. Each request
runs in a savepoint that is rolled back, so every row sees the same world and the
whole sweep is one database setup.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import date
from decimal import Decimal
from typing import Any

import pytest
from django.apps import apps
from django.core.cache import cache
from django.core.management import call_command
from django.db import connection, transaction
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from rest_framework.test import APIClient

from alarms.services import alarm_create
from autoscaling.services import group_create, policy_create, scheduled_create
from billing.models import Invoice, LedgerEntry
from billing.services import budget_create
from gpucloud.api.scopes import ANY_METHOD, NO_KEY, ROUTE_SCOPES, required_scope
from gpucloud.catalogue.models import GpuModel, InstanceType, Price, Region
from gpucloud.tenancy import permissions as perms
from gpucloud.tenancy.choices import Role, Scope
from gpucloud.tenancy.models import ApiKey, AuditEvent, Membership
from gpucloud.tenancy.services import api_key_create, invitation_create, ssh_key_add
from notifications.models import Notification
from scheduler.models import JobArray, Workload
from tests.api.test_isolation import ED25519
from tests.conftest import make_actor, make_user
from volumes.services import volume_create

pytestmark = pytest.mark.django_db

SCOPES = (Scope.READ, Scope.WRITE, Scope.ADMIN)
UNSAFE = {"POST", "PUT", "PATCH", "DELETE"}
RANK = perms.SCOPE_RANK


def api_routes() -> list[tuple[str, str, URLPattern]]:
    """(view name, path pattern, URLPattern) of every route under /api/."""
    def walk(patterns, prefix="", namespace=""):
        for p in patterns:
            if isinstance(p, URLResolver):
                ns = f"{namespace}{p.namespace}:" if p.namespace else namespace
                yield from walk(p.url_patterns, prefix + str(p.pattern), ns)
            elif isinstance(p, URLPattern):
                yield f"{namespace}{p.name}", prefix + str(p.pattern), p
    return [r for r in walk(get_resolver().url_patterns) if r[1].startswith("api/")]


def route_methods(pattern: URLPattern) -> list[str]:
    """Every method the route's view handles (HEAD and OPTIONS follow GET and read)."""
    callback = pattern.callback
    actions = getattr(callback, "actions", None)
    if actions:  # a viewset route: method -> action (DRF adds "head" at the first GET)
        return sorted(m.upper() for m in actions if m not in ("head", "options"))
    cls = getattr(callback, "cls", None) or getattr(callback, "view_class", None)
    if cls is None:  # a function view answers every method alike
        return [ANY_METHOD]
    return sorted(m.upper() for m in cls.http_method_names
                  if m not in ("head", "options") and hasattr(cls, m))


def table_rows() -> list[tuple[str, str]]:
    return sorted((name, method) for name, _, p in api_routes() for method in route_methods(p))


def test_every_route_and_method_is_in_the_table():
    rows = set(table_rows())
    assert rows - set(ROUTE_SCOPES) == set(), "add the new routes to ROUTE_SCOPES in gpucloud/api/scopes.py"
    assert set(ROUTE_SCOPES) - rows == set(), "stale rows in ROUTE_SCOPES"


def test_no_unsafe_method_needs_only_read():
    for (route, method), scope in ROUTE_SCOPES.items():
        if method in UNSAFE:
            assert scope in (Scope.WRITE, Scope.ADMIN, NO_KEY), (route, method)


def test_a_route_missing_from_the_table_fails_closed():
    assert required_scope("no-such-route", "GET") == Scope.READ
    assert required_scope("no-such-route", "POST") == Scope.ADMIN
    assert required_scope("instance-list", "HEAD") == Scope.READ


def test_no_unsafe_action_declares_a_read_permission():
    """The permission layer agrees: a change never hides behind a `.read` permission."""
    reads = perms.SCOPE_PERMISSIONS[Scope.READ]
    checked = 0
    for name, _, pattern in api_routes():
        cls = getattr(pattern.callback, "cls", None)
        permission_map = getattr(cls, "permission_map", None)
        if permission_map is None:
            continue
        actions = getattr(pattern.callback, "actions", None) or {
            m: m for m in cls.http_method_names if hasattr(cls, m)}
        for method, action in actions.items():
            if method.upper() in UNSAFE:
                assert permission_map[action] not in reads, (name, method, permission_map[action])
                checked += 1
    assert checked >= 15, "the walk found the tenant views' unsafe actions"


# ---------------------------------------------------------------- the sweep


@dataclass
class World:
    keys: dict[str, str]  # scope -> secret, all alice's (an owner)
    objects: dict[str, Any]  # route basename -> the row its {pk}/{code} names
    bodies: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)


@pytest.fixture
def world(db) -> World:
    call_command("seed_catalog", stdout=open("/dev/null", "w"))
    alice = make_actor("alice@acme.test", tenant_name="Acme")
    # A second owner, so alice may leave (and be demoted) without a last_owner refusal.
    Membership.objects.create(tenant=alice.tenant, user=make_user("olga@acme.test"), role=Role.OWNER)
    keys = {scope: api_key_create(membership=alice.membership, name=scope, scopes=[scope])[1]
            for scope in SCOPES}
    target_key, _ = api_key_create(membership=alice.membership, name="another of alice's", scopes=["read"])
    invitation, _ = invitation_create(actor=alice.membership, email="inv@x.test", role=Role.MEMBER)
    charlie = make_actor("charlie@globex.test", tenant_name="Globex")
    _, token = invitation_create(actor=charlie.membership, email="alice@acme.test", role=Role.MEMBER)

    def workload(kind: str) -> Workload:
        return Workload.objects.create(
            tenant=alice.tenant, kind=kind, name=kind, image="busybox",
            instance_type=InstanceType.objects.get(code="h100.1x"), region=Region.objects.get(code="us-east-1"))

    launch = {"name": "w", "instance_type": "h100.1x", "region": "us-east-1", "image": "busybox"}
    objects = {
        "member": alice.membership,  # leaving: the `write` case of DELETE (others: see below)
        "invitation": invitation,
        "api-key": target_key,
        "audit-event": AuditEvent.objects.filter(tenant=alice.tenant).first(),
        "instance": workload("instance"),
        "job": workload("job"),
        "job-array": JobArray.objects.create(tenant=alice.tenant, name="sweep", count=1),
        "region": Region.objects.first(),
        "gpu-model": GpuModel.objects.first(),
        "instance-type": InstanceType.objects.first(),
        "price": Price.objects.first(),
        "ledger-entry": LedgerEntry.objects.filter(tenant=alice.tenant).first(),
        "invoice": Invoice.objects.create(tenant=alice.tenant, period_start=date(2025, 1, 1),
                                          period_end=date(2025, 2, 1)),
        "budget": budget_create(tenant=alice.tenant, name="b", monthly_amount=Decimal("100")),
        "ssh-key": ssh_key_add(membership=alice.membership, name="laptop", public_key=ED25519),
        "alarm": alarm_create(tenant=alice.tenant, name="queue", target_kind="tenant", metric="queued_gpus",
                              threshold=4, comparison="gt")[0],
        "notification": Notification.objects.create(user=alice.user, tenant=alice.tenant, event="instance.running",
                                                    key="scopes", subject="Instance w is running"),
    }
    group = group_create(tenant=alice.tenant, name="g", instance_type="h100.1x", region="us-east-1",
                         image="busybox", max_size=2)
    objects |= {
        "autoscaling-group": group,
        "scaling-policy": policy_create(group=group, name="p", kind="target_tracking", metric="gpu_util",
                                        target=50),
        "scheduled-action": scheduled_create(group=group, name="s", cron="0 20 * * *", desired=0),
        "volume": volume_create(tenant=alice.tenant, name="data", region="us-east-1", size_gib=10),
    }
    bodies = {
        ("tenant", "PATCH"): {"name": "Acme 2"},
        ("member-detail", "PATCH"): {"role": Role.OWNER},
        ("invitation-list", "POST"): {"email": "new@x.test", "role": Role.MEMBER},
        ("invitation-accept", "POST"): {"token": token},
        ("api-key-list", "POST"): {"name": "k", "scopes": ["read"]},
        ("instance-list", "POST"): launch,
        ("job-list", "POST"): launch,
        ("budget-list", "POST"): {"name": "b2", "monthly_amount": "10"},
        ("budget-detail", "PUT"): {"name": "b3", "monthly_amount": "20"},
        ("budget-detail", "PATCH"): {"monthly_amount": "20"},
        ("ssh-key-list", "POST"): {"name": "desk", "public_key": ED25519},
        ("autoscaling-group-list", "POST"): {**launch, "max_size": 1},
        ("autoscaling-group-detail", "PATCH"): {"desired": 1},
        ("autoscaling-group-protection", "POST"): {"instance": str(objects["instance"].pk), "protected": True},
        ("scaling-policy-list", "POST"): {"group": str(group.pk), "name": "p2", "kind": "target_tracking",
                                          "metric": "gpu_util", "target": 60},
        ("scaling-policy-detail", "PATCH"): {"target": 70},
        ("scheduled-action-list", "POST"): {"group": str(group.pk), "name": "s2", "cron": "0 8 * * *",
                                            "desired": 1},
        ("scheduled-action-detail", "PATCH"): {"desired": 2},
        ("alarm-list", "POST"): {"name": "a2", "target_kind": "tenant", "metric": "queue_wait", "threshold": 600,
                                 "comparison": "gt"},
        ("alarm-detail", "PUT"): {"name": "a3", "target_kind": "tenant", "metric": "spend_rate", "threshold": 50,
                                  "comparison": "ge"},
        ("alarm-detail", "PATCH"): {"threshold": 8},
        ("volume-list", "POST"): {"name": "data2", "region": "us-east-1", "size_gib": 1},
        ("volume-detail", "PATCH"): {"size_gib": 20},
    }
    for secret in keys.values():  # first use is recorded; do it before any snapshot
        _client(secret).get("/api/v1/tenant")
    return World(keys=keys, objects=objects, bodies=bodies)


def _client(secret: str | None) -> APIClient:
    client = APIClient()
    if secret:
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


# A key's use is recorded on its row (at most once a minute): that is not a change the
# request made.
_IGNORED_COLUMNS = {("tenancy_apikey", "last_used_at"), ("tenancy_apikey", "last_used_ip")}


def _snapshot_sql() -> str:
    qn = connection.ops.quote_name
    parts, seen = [], set()
    for model in apps.get_models(include_auto_created=True):
        table = model._meta.db_table
        if model._meta.proxy or not model._meta.managed or table in seen:
            continue
        seen.add(table)
        cols = [qn(f.column) for f in model._meta.concrete_fields if (table, f.column) not in _IGNORED_COLUMNS]
        row = f"(ROW({', '.join(cols)}))::text"
        parts.append(f"SELECT '{table}', count(*), md5(coalesce(string_agg({row}, '|' ORDER BY {row}), '')) "
                     f"FROM {qn(table)}")
    return " UNION ALL ".join(parts)


def _snapshot(sql: str) -> dict[str, tuple[int, str]]:
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return {table: (n, digest) for table, n, digest in cursor.fetchall()}


def _url(route: str, pattern: URLPattern, objects: dict[str, Any]) -> str:
    if route == "api-not-found":
        return "/api/v1/no-such-route"
    params = list(pattern.pattern.regex.groupindex)
    if not params:
        return reverse(route)
    obj = objects[route.rsplit("-", 1)[0]]
    return reverse(route, kwargs={p: getattr(obj, p) for p in params})


# Generating the OpenAPI schema takes about a second: its route (GET only, `read`) is
# called with the read key alone (the narrowest that must pass); tests/api/test_schema.py
# reads it in full.
NARROWEST_KEY_ONLY = {("schema", "GET")}


def _call(secret: str | None, method: str, url: str, body: dict[str, Any], sql: str | None):
    """One request in a savepoint rolled back after it: (response, whether the database
    changed; only looked at when `sql` is given)."""
    cache.clear()  # throttle counters: every request starts with a full budget
    with transaction.atomic():
        before = _snapshot(sql) if sql else None
        client = _client(secret)
        if method == "GET":
            resp = client.get(url)
        else:
            resp = client.generic(method, url, data=json.dumps(body),
                                  content_type="application/json")
        changed = sql is not None and _snapshot(sql) != before
        transaction.set_rollback(True)
    return resp, changed


def _error_code(resp) -> str | None:
    try:
        return resp.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None


def test_every_route_answers_each_key_as_its_scope_says(world):
    sql = _snapshot_sql()
    patterns = {name: pattern for name, _, pattern in api_routes()}
    failures, calls = [], 0
    for route, method in table_rows():
        pattern = patterns[route]
        url = _url(route, pattern, world.objects)
        methods = ["GET", "POST", "PUT", "PATCH", "DELETE"] if method == ANY_METHOD else [method]
        for m in methods:
            body = world.bodies.get((route, m), {})
            needed = ROUTE_SCOPES[(route, method)]
            if needed is NO_KEY:
                anonymous, _ = _call(None, m, url, body, None)
            for scope, secret in world.keys.items():
                if (route, m) in NARROWEST_KEY_ONLY and scope != needed:
                    continue
                # "Nothing changed" is checked where a key must not act (the snapshot costs).
                must_not_act = needed is NO_KEY or RANK[scope] < RANK[needed]
                resp, changed = _call(secret, m, url, body, sql if must_not_act else None)
                calls += 1
                code = _error_code(resp)
                seen = (route, m, scope, resp.status_code, code)
                if resp.status_code >= 500:
                    failures.append(("server error", *seen))
                elif needed is NO_KEY:
                    # The key is no authentication here: it gets what anybody gets, changing nothing.
                    if resp.status_code != anonymous.status_code or changed:
                        failures.append(("a key acted where keys do not apply", *seen, changed))
                elif RANK[scope] < RANK[needed]:
                    body_ok = resp.status_code == 403 and set(resp.json()["error"]) == {"code", "message", "fields"}
                    if not body_ok or code != "insufficient_scope" or changed:
                        failures.append((f"a {scope} key was not refused ({needed} needed)", *seen, changed))
                elif resp.status_code == 403 and code == "insufficient_scope":
                    failures.append((f"a {scope} key was refused ({needed} is enough)", *seen))
    assert failures == []
    assert calls >= 3 * len(ROUTE_SCOPES) - 2 * len(NARROWEST_KEY_ONLY)
    # ...and the snapshot does see a change when one is made.
    revoke = reverse("api-key-revoke", kwargs={"pk": world.objects["api-key"].pk})
    resp, changed = _call(world.keys[Scope.ADMIN], "POST", revoke, {}, sql)
    assert resp.status_code == 200 and changed


# ---------------------------------------------------------------- the findings, by name


def test_read_key_cannot_revoke_keys_leave_or_accept_invitations(alice, charlie):
    """The issue's cases: each answered 2xx to a `read` key before."""
    _, read = api_key_create(membership=alice.membership, name="read", scopes=["read"])
    other, _ = api_key_create(membership=alice.membership, name="other", scopes=["admin"])
    _, token = invitation_create(actor=charlie.membership, email="alice@acme.test", role=Role.MEMBER)
    client = alice.client(read)
    attempts = [
        client.post(f"/api/v1/api-keys/{other.pk}/revoke"),
        client.delete(f"/api/v1/api-keys/{other.pk}"),
        client.delete(f"/api/v1/members/{alice.membership.pk}"),
        client.post("/api/v1/invitations/accept", {"token": token}, format="json"),
    ]
    for resp in attempts:
        assert resp.status_code == 403, resp.json()
        assert resp.json()["error"]["code"] == "insufficient_scope"
    assert ApiKey.objects.get(pk=other.pk).revoked_at is None
    assert Membership.objects.filter(user=alice.user).count() == 1  # still in Acme, not in Globex


def test_write_key_may_leave_and_revoke_its_own_but_not_others(alice, bob, victor):
    _, write = api_key_create(membership=alice.membership, name="w", scopes=["write"])
    bobs, _ = api_key_create(membership=bob.membership, name="b", scopes=["read"])
    client = alice.client(write)
    for resp in (client.delete(f"/api/v1/members/{victor.membership.pk}"),
                 client.post(f"/api/v1/api-keys/{bobs.pk}/revoke")):
        assert resp.status_code == 403 and resp.json()["error"]["code"] == "insufficient_scope"
    assert Membership.objects.filter(pk=victor.membership.pk).exists()
    assert ApiKey.objects.get(pk=bobs.pk).revoked_at is None
    # bob (a member) leaves with his write key; his own keys he revokes with it too.
    _, bob_write = api_key_create(membership=bob.membership, name="bw", scopes=["write"])
    assert bob.client(bob_write).post(f"/api/v1/api-keys/{bobs.pk}/revoke").status_code == 200
    assert bob.client(bob_write).delete(f"/api/v1/members/{bob.membership.pk}").status_code == 204


def test_a_session_is_not_narrowed_by_scopes(alice, charlie):
    _, token = invitation_create(actor=charlie.membership, email="alice@acme.test", role=Role.MEMBER)
    session = APIClient()
    session.force_login(alice.user)
    resp = session.post("/api/v1/invitations/accept", {"token": token}, format="json")
    assert resp.status_code == 201
