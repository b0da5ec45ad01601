"""No key or invitation grants more than its creator holds: their role AND, acting through an
API key, that key's scopes (issue 27, finding 2; gpucloud.tenancy.permissions.grant_within).

The class, in three parts:
  * every write of a role or a key's scopes in the code is one of the grant services
    (an AST walk over the source: a new place that makes members or keys fails it);
  * every route, API or console, whose handler reaches a grant service is in GRANT_ROUTES
    (a walk over the URLconf: a new route that grants fails it until it is swept here);
  * each route in GRANT_ROUTES is called for EVERY combination of creator role x credential
    (a browser session, or an API key of each of the 7 scope sets) x requested grant, and is
    allowed iff the grant is within what the creator holds; a refusal is a 403 in the one
    error shape (the API) and changes nothing.
Each call runs in a savepoint rolled back after it, so every combination sees the same world.
"""
from __future__ import annotations

import ast
import inspect
import json
import re
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import Any

import pytest
from django.core.cache import cache
from django.db import transaction
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from rest_framework.test import APIClient

from gpucloud.tenancy.choices import Role, Scope
from gpucloud.tenancy.models import ApiKey, Invitation, Membership
from gpucloud.tenancy.services import api_key_create, invitation_create, tenant_create
from tests.conftest import make_user

pytestmark = pytest.mark.django_db

ROLES = (Role.VIEWER, Role.MEMBER, Role.ADMIN, Role.OWNER)
SCOPES = (Scope.READ, Scope.WRITE, Scope.ADMIN)
SCOPE_SETS = tuple(frozenset(c) for n in (1, 2, 3) for c in combinations(SCOPES, n))
CREDENTIALS: tuple[frozenset[str] | None, ...] = (None, *SCOPE_SETS)  # None: a browser session
ANY = "ANY"  # a function view: every method alike

# ---------------------------------------------------------------- the rule, as the issue states it
# Written here from the issue, not imported: the widest scope each role's keys may carry, and
# the nesting of scopes and roles.
S_RANK = {Scope.READ: 0, Scope.WRITE: 1, Scope.ADMIN: 2}
R_RANK = {Role.VIEWER: 0, Role.MEMBER: 1, Role.ADMIN: 2, Role.OWNER: 3}
KEY_CEILING = {Role.VIEWER: Scope.READ, Role.MEMBER: Scope.WRITE, Role.ADMIN: Scope.ADMIN, Role.OWNER: Scope.ADMIN}


def held(role: str, cred: frozenset[str] | None) -> int:
    ceiling = S_RANK[KEY_CEILING[role]]
    return ceiling if cred is None else min(ceiling, max(S_RANK[s] for s in cred))


def may_create_keys(role: str, cred: frozenset[str] | None) -> bool:  # api_keys.create
    return role != Role.VIEWER and (cred is None or bool(cred & {Scope.WRITE, Scope.ADMIN}))


def may_manage_members(role: str, cred: frozenset[str] | None) -> bool:  # members.manage
    return role in (Role.ADMIN, Role.OWNER) and (cred is None or Scope.ADMIN in cred)


def key_grant_ok(role, cred, scopes: frozenset[str]) -> bool:
    return may_create_keys(role, cred) and max(S_RANK[s] for s in scopes) <= held(role, cred)


def role_grant_ok(role, cred, granted: str) -> bool:
    return (may_manage_members(role, cred) and R_RANK[granted] <= R_RANK[role]
            and S_RANK[KEY_CEILING[granted]] <= held(role, cred))


# ---------------------------------------------------------------- part 1: where grants are written

GRANT_SERVICES = ("api_key_create", "invitation_create", "member_update_role", "invitation_accept")
# tenant_create makes its caller the owner of the tenant it makes: nothing held to exceed.
EXPECTED_WRITERS = {
    ("gpucloud/tenancy/services.py", "api_key_create"),
    ("gpucloud/tenancy/services.py", "invitation_create"),
    ("gpucloud/tenancy/services.py", "member_update_role"),
    ("gpucloud/tenancy/services.py", "invitation_accept"),
    ("gpucloud/tenancy/services.py", "tenant_create"),
}
_GRANT_MODELS = {"ApiKey", "Membership", "Invitation"}
_CREATES = {"create", "get_or_create", "update_or_create", "bulk_create"}
REPO = Path(__file__).resolve().parents[2]


def _grant_writes(tree: ast.AST) -> set[str]:
    """The functions of a module that write a member's role, an invitation or a key's scopes."""
    found: set[str] = set()

    def visit(node: ast.AST, fn: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else fn
            if isinstance(child, ast.Call):
                f = child.func
                if isinstance(f, ast.Name) and f.id in _GRANT_MODELS:  # ApiKey(...), then save()
                    found.add(name)
                if isinstance(f, ast.Attribute):
                    on = f.value
                    if (f.attr in _CREATES and isinstance(on, ast.Attribute) and on.attr == "objects"
                            and isinstance(on.value, ast.Name) and on.value.id in _GRANT_MODELS):
                        found.add(name)
                    if f.attr == "update" and any(k.arg in ("role", "scopes") for k in child.keywords):
                        found.add(name)
            if isinstance(child, ast.Assign | ast.AnnAssign | ast.AugAssign):
                targets = child.targets if isinstance(child, ast.Assign) else [child.target]
                if any(isinstance(t, ast.Attribute) and t.attr in ("role", "scopes") for t in targets):
                    found.add(name)
            visit(child, name)

    visit(tree, "<module>")
    return found


def test_roles_and_key_scopes_are_written_only_by_the_grant_services():
    writers = set()
    # Every package of the control plane (a top-level folder with an __init__.py), the tests,
    # the SDK and migrations (history, not paths a request takes) aside.
    packages = [p.parent for p in REPO.glob("*/__init__.py") if p.parent.name not in ("tests", "sdk")]
    assert {"gpucloud", "frontend", "gateway"} <= {p.name for p in packages}
    for path in (f for package in packages for f in package.rglob("*.py")):
        rel = path.relative_to(REPO)
        if "migrations" in rel.parts or "node_modules" in rel.parts:
            continue
        writers |= {(str(rel), fn) for fn in _grant_writes(ast.parse(path.read_text(), str(rel)))}
    assert writers == EXPECTED_WRITERS, "a new grant path: hold it to permissions.grant_within and sweep it here"


# ---------------------------------------------------------------- part 2: which routes grant

# (route name, method) -> the sweep that calls it with every combination.
GRANT_ROUTES = {
    ("api-key-list", "POST"): "keys",
    ("console:api_keys", ANY): "keys",
    ("invitation-list", "POST"): "invite",
    ("console:members", ANY): "invite",
    ("member-detail", "PATCH"): "role",
    ("console:member_role", ANY): "role",
    ("invitation-accept", "POST"): "accept",
    ("console:invitation_accept", ANY): "accept",
    ("signup", "POST"): "signup",  # the new owner's first key, in the tenant they just made
}
_CALLS_GRANT = re.compile(r"\b(" + "|".join(GRANT_SERVICES) + r")\s*\(")


def all_routes():
    def walk(patterns, namespace=""):
        for p in patterns:
            if isinstance(p, URLResolver):
                yield from walk(p.url_patterns, f"{namespace}{p.namespace}:" if p.namespace else namespace)
            elif isinstance(p, URLPattern):
                yield f"{namespace}{p.name}", p
    return list(walk(get_resolver().url_patterns))


def _handlers(pattern: URLPattern) -> dict[str, Any]:
    """method -> the function that handles it (DRF's action, an APIView's method, or the view)."""
    callback = pattern.callback
    cls = getattr(callback, "cls", None) or getattr(callback, "view_class", None)
    actions = getattr(callback, "actions", None)
    if actions:
        return {m.upper(): getattr(cls, a) for m, a in actions.items() if m not in ("head", "options")}
    if cls is not None:
        return {m.upper(): getattr(cls, m) for m in cls.http_method_names
                if m not in ("head", "options") and hasattr(cls, m)}
    return {ANY: inspect.unwrap(callback)}


def _reaches_grant(fn: Any) -> bool:
    """Whether the handler's source, or a function of its module it calls (followed through),
    calls a grant service."""
    module = inspect.getmodule(fn)
    seen, todo = set(), [fn]
    while todo:
        f = todo.pop()
        if f in seen:
            continue
        seen.add(f)
        try:
            source = inspect.getsource(f)
        except (OSError, TypeError):
            continue
        if _CALLS_GRANT.search(source):
            return True
        for name in re.findall(r"\b([a-z_][a-z0-9_]*)\s*\(", source):
            helper = getattr(module, name, None)
            if inspect.isfunction(helper) and inspect.getmodule(helper) is module:
                todo.append(inspect.unwrap(helper))
    return False


def test_every_route_that_grants_is_swept():
    granting = {(name, method) for name, pattern in all_routes()
                for method, fn in _handlers(pattern).items() if _reaches_grant(fn)}
    assert granting == set(GRANT_ROUTES), "a route that grants: add it to GRANT_ROUTES and its sweep"


# ---------------------------------------------------------------- part 3: every combination


@dataclass
class Creator:
    user: Any
    membership: Membership
    keys: dict[frozenset[str], str]  # scope set -> secret


@dataclass
class World:
    tenant: Any
    creators: dict[str, Creator]
    target: Membership  # a viewer whose role the "role" sweep changes


@pytest.fixture
def world(db) -> World:
    alice = make_user("alice@acme.test")
    tenant = tenant_create(name="Acme", owner=alice)
    creators = {}
    for role in ROLES:
        user = make_user(f"{role}@acme.test")
        # Keys of every scope set, made while an owner; then the role the sweep needs. A key
        # that outlived its creator's demotion is a case of its own: it holds only the role's.
        membership = Membership.objects.create(tenant=tenant, user=user, role=Role.OWNER)
        keys = {scopes: api_key_create(membership=membership, name="k", scopes=sorted(scopes))[1]
                for scopes in SCOPE_SETS}
        Membership.objects.filter(pk=membership.pk).update(role=role)
        membership.refresh_from_db()
        creators[role] = Creator(user=user, membership=membership, keys=keys)
    target = Membership.objects.create(tenant=tenant, user=make_user("target@acme.test"), role=Role.VIEWER)
    return World(tenant=tenant, creators=creators, target=target)


def _state() -> tuple:
    """What a grant changes: keys and their scopes, invitations and their roles, members' roles."""
    return (sorted((str(k.pk), tuple(k.scopes), str(k.revoked_at)) for k in ApiKey.objects.all()),
            sorted((str(i.pk), i.role, str(i.accepted_at)) for i in Invitation.objects.all()),
            sorted((str(m.pk), m.role) for m in Membership.objects.all()))


def _api(world: World, role: str, cred: frozenset[str] | None) -> APIClient:
    client = APIClient()
    creator = world.creators[role]
    if cred is None:
        client.force_login(creator.user)
    else:
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {creator.keys[cred]}")
    return client


def _console(world: World, role: str) -> Client:
    client = Client()
    client.force_login(world.creators[role].user)
    return client


def _call(client, method: str, url: str, body: dict[str, Any]) -> tuple[Any, bool, tuple, tuple]:
    """One request (JSON to the API, a form to the console) in a savepoint rolled back after
    it: (response, changed, before, after)."""
    cache.clear()  # throttle counters
    with transaction.atomic():
        before = _state()
        if isinstance(client, APIClient):
            resp = client.generic(method, url, data=json.dumps(body), content_type="application/json")
        else:
            resp = client.post(url, body)
        after = _state()
        transaction.set_rollback(True)
    return resp, before != after, before, after


def _error_shape(resp) -> bool:
    try:
        return set(resp.json()["error"]) == {"code", "message", "fields"}
    except (ValueError, KeyError, TypeError):
        return False


def _routes(kind: str) -> list[tuple[str, str]]:
    return [r for r, k in GRANT_ROUTES.items() if k == kind]


def _new_keys(before, after) -> list[tuple[str, ...]]:
    return [scopes for _, scopes, _ in set(after[0]) - set(before[0])]


def _judge(failures, route, case, resp, changed, allowed, granted_as_asked: bool, api: bool):
    seen = (route, *case, resp.status_code)
    if resp.status_code >= 500:
        failures.append(("server error", *seen))
    elif allowed and not (changed and granted_as_asked):
        failures.append(("refused a grant within what the creator holds", *seen))
    elif not allowed and changed:
        failures.append(("granted more than the creator holds", *seen))
    elif not allowed and api and not (resp.status_code == 403 and _error_shape(resp)):
        failures.append(("refused, but not with a 403 in the error shape", *seen))


def test_keys_are_minted_only_within_what_their_creator_holds(world):
    failures, calls = [], 0
    for route, _ in _routes("keys"):
        for role in ROLES:
            for cred in CREDENTIALS if route.startswith("api-") else (None,):
                for wanted in SCOPE_SETS:
                    scopes = sorted(wanted)
                    client = _api(world, role, cred) if route.startswith("api-") else _console(world, role)
                    resp, changed, before, after = _call(client, "POST", reverse(route),
                                                         {"name": "new", "scopes": scopes})
                    calls += 1
                    _judge(failures, route, (role, cred and sorted(cred), scopes), resp, changed,
                           key_grant_ok(role, cred, wanted), _new_keys(before, after) == [tuple(scopes)],
                           api=route.startswith("api-"))
    assert failures == []
    assert calls == len(ROLES) * len(CREDENTIALS) * len(SCOPE_SETS) + len(ROLES) * len(SCOPE_SETS)


def test_invitations_grant_only_within_what_their_creator_holds(world):
    failures, calls = [], 0
    for route, _ in _routes("invite"):
        for role in ROLES:
            for cred in CREDENTIALS if route.startswith("invitation-") else (None,):
                for granted in ROLES:
                    client = _api(world, role, cred) if route.startswith("invitation-") else _console(world, role)
                    resp, changed, before, after = _call(client, "POST", reverse(route),
                                                         {"email": "new@elsewhere.test", "role": granted})
                    calls += 1
                    new = [r for _, r, _ in set(after[1]) - set(before[1])]
                    _judge(failures, route, (role, cred and sorted(cred), granted), resp, changed,
                           role_grant_ok(role, cred, granted), new == [granted],
                           api=route.startswith("invitation-"))
    assert failures == []
    assert calls == len(ROLES) * len(CREDENTIALS) * len(ROLES) + len(ROLES) * len(ROLES)


def test_role_changes_grant_only_within_what_their_maker_holds(world):
    failures, calls = [], 0
    target = world.target
    for route, _ in _routes("role"):
        for role in ROLES:
            for cred in CREDENTIALS if route.startswith("member-") else (None,):
                for granted in (Role.MEMBER, Role.ADMIN, Role.OWNER):  # the target is a viewer
                    client = _api(world, role, cred) if route.startswith("member-") else _console(world, role)
                    resp, changed, before, after = _call(client, "PATCH", reverse(route, kwargs={"pk": target.pk}),
                                                         {"role": granted})
                    calls += 1
                    now = dict(after[2])[str(target.pk)]
                    _judge(failures, route, (role, cred and sorted(cred), granted), resp, changed,
                           role_grant_ok(role, cred, granted), now == granted, api=route.startswith("member-"))
    assert failures == []
    assert calls == len(ROLES) * len(CREDENTIALS) * 3 + len(ROLES) * 3


def test_an_invitation_grants_only_what_its_sender_still_holds(world):
    """The role is granted at acceptance: an owner's invitation, accepted after the owner is
    demoted (or gone), grants no more than they hold then."""
    failures = []
    inviter = world.creators[Role.OWNER].membership
    invitee = make_user("new@elsewhere.test")
    for route, _ in _routes("accept"):
        for granted in ROLES:
            for now_role in (*ROLES, None):  # None: the sender left the tenant
                cache.clear()
                with transaction.atomic():
                    _, token = invitation_create(actor=inviter, email=invitee.email, role=granted)
                    if now_role is None:
                        Membership.objects.filter(pk=inviter.pk).delete()
                    else:
                        Membership.objects.filter(pk=inviter.pk).update(role=now_role)
                    client = APIClient() if route.startswith("invitation-") else Client()
                    client.force_login(invitee)
                    if route.startswith("invitation-"):
                        resp = client.post(reverse(route), {"token": token}, format="json")
                    else:
                        resp = client.post(reverse(route), {"token": token})
                    joined = Membership.objects.filter(user=invitee).values_list("role", flat=True).first()
                    transaction.set_rollback(True)
                allowed = now_role in (Role.ADMIN, Role.OWNER) and R_RANK[granted] <= R_RANK[now_role]
                seen = (route, granted, now_role, resp.status_code, joined)
                if resp.status_code >= 500 or (allowed and joined != granted) or (not allowed and joined):
                    failures.append(seen)
                elif not allowed and route.startswith("invitation-") and not (
                        resp.status_code == 403 and _error_shape(resp)):
                    failures.append(("not a 403 in the error shape", *seen))
    assert failures == []


def test_signup_key_is_its_owner_s_own(db):
    """The one grant without a creator above it: sign-up's first key, admin, for the owner of
    the tenant sign-up just made (within what an owner's session holds)."""
    resp = APIClient().post(reverse("signup"), {"email": "new@owner.test", "password": "correct horse battery",
                                                "tenant_name": "New", "create_api_key": True}, format="json")
    assert resp.status_code == 201, resp.json()
    key = ApiKey.objects.get(created_by__email="new@owner.test")
    assert key.scopes == [Scope.ADMIN]
    assert Membership.objects.get(user=key.created_by).role == Role.OWNER


# ---------------------------------------------------------------- the finding, as reported


def test_a_write_key_cannot_mint_an_admin_key(alice):
    """Issue 27, finding 2: an owner's `write` key created a key with ["admin"] (201), which then
    invited an admin and revoked the write key."""
    _, write = api_key_create(membership=alice.membership, name="ci", scopes=[Scope.WRITE])
    before = _state()
    resp = alice.client(write).post("/api/v1/api-keys", {"name": "escalate", "scopes": ["admin"]}, format="json")
    assert resp.status_code == 403, resp.content
    error = resp.json()["error"]
    assert set(error) == {"code", "message", "fields"}
    assert error["code"] == "insufficient_scope" and "scopes" in error["fields"]
    assert _state() == before
    assert not ApiKey.objects.filter(name="escalate").exists()
    # ...while the key still mints what it holds.
    resp = alice.client(write).post("/api/v1/api-keys", {"name": "ok", "scopes": ["write"]}, format="json")
    assert resp.status_code == 201 and json.loads(resp.content)["scopes"] == ["write"]
