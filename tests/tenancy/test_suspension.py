from __future__ import annotations

import pytest

from gpucloud.tenancy import permissions as perms
from gpucloud.tenancy.choices import Role, Scope, TenantStatus
from gpucloud.tenancy.models import AuditEvent
from gpucloud.tenancy.services import tenant_reactivate, tenant_suspend

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("role", list(Role))
def test_suspended_tenant_can_read_but_not_launch(role):
    active = perms.effective_permissions(role=role, scopes=None, suspended=False)
    suspended = perms.effective_permissions(role=role, scopes=None, suspended=True)
    assert perms.WORKLOADS_LAUNCH not in suspended
    assert {p for p in active if p.endswith(".read")} <= suspended
    # stopping work stays possible, so a suspended tenant can cut its costs
    assert (perms.WORKLOADS_MANAGE in active) == (perms.WORKLOADS_MANAGE in suspended)


def test_scopes_narrow_roles():
    owner_read = perms.effective_permissions(role=Role.OWNER, scopes=[Scope.READ], suspended=False)
    assert owner_read and all(p.endswith(".read") for p in owner_read)
    viewer_admin = perms.effective_permissions(role=Role.VIEWER, scopes=[Scope.ADMIN], suspended=False)
    assert viewer_admin == perms.ROLE_PERMISSIONS[Role.VIEWER]


def test_suspend_and_reactivate_are_idempotent(alice):
    tenant_suspend(tenant=alice.tenant, reason="unpaid")
    tenant_suspend(tenant=alice.tenant, reason="unpaid again")
    assert AuditEvent.objects.filter(action="tenant.suspend").count() == 1
    tenant_reactivate(tenant=alice.tenant)
    assert alice.tenant.status == TenantStatus.ACTIVE and alice.tenant.suspended_reason == ""
