"""Shared fixtures: three users, as in healthchecks' hc/test.py.

alice (owner) and bob (member) share the tenant "Acme"; victor is Acme's viewer;
charlie owns "Globex". Every API test has a cross-tenant case with charlie.
"""
from __future__ import annotations

from dataclasses import dataclass

import pytest
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.core.management import call_command
from rest_framework.test import APIClient

from gpucloud.tenancy.choices import Role, Scope
from gpucloud.tenancy.models import Membership, Tenant
from gpucloud.tenancy.services import api_key_create, tenant_create

User = get_user_model()


@dataclass
class Actor:
    user: object
    tenant: Tenant
    membership: Membership
    key: str  # an admin-scoped (or the role's widest) API key's secret

    def client(self, key: str | None = None) -> APIClient:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {key or self.key}")
        return client


def make_user(email: str):
    return User.objects.create_user(username=email, email=email, password="correct horse battery")


def _widest_scope(role: str) -> list[str]:
    return {Role.VIEWER: [Scope.READ], Role.MEMBER: [Scope.READ, Scope.WRITE]}.get(role, [Scope.ADMIN])


def make_actor(email: str, tenant: Tenant | None = None, role: str = Role.OWNER,
               tenant_name: str = "Tenant") -> Actor:
    user = make_user(email)
    if tenant is None:
        tenant = tenant_create(name=tenant_name, owner=user)
        membership = Membership.objects.get(tenant=tenant, user=user)
    else:
        membership = Membership.objects.create(tenant=tenant, user=user, role=role)
    _, secret = api_key_create(membership=membership, name=f"{email} key",
                               scopes=_widest_scope(membership.role))
    return Actor(user=user, tenant=tenant, membership=membership, key=secret)


@pytest.fixture(autouse=True)
def _clean_cache():
    # Throttle counters live in Redis (a database of the tests' own); start each test at zero.
    cache.clear()
    yield


@pytest.fixture
def alice(db) -> Actor:
    return make_actor("alice@acme.test", tenant_name="Acme")


@pytest.fixture
def bob(alice) -> Actor:
    return make_actor("bob@acme.test", tenant=alice.tenant, role=Role.MEMBER)


@pytest.fixture
def victor(alice) -> Actor:
    return make_actor("victor@acme.test", tenant=alice.tenant, role=Role.VIEWER)


@pytest.fixture
def charlie(db) -> Actor:
    return make_actor("charlie@globex.test", tenant_name="Globex")


@pytest.fixture
def catalog(db):
    call_command("seed_catalog", stdout=open("/dev/null", "w"))


@pytest.fixture
def anon() -> APIClient:
    return APIClient()
