"""Saved SSH keys belong to the membership (issue 27, finding 10; issue 29: they live in tenancy).

A removed member's saved keys stayed in the tenant: the gateway refused them only while the
person was away, and let them in again the day they rejoined. Removal now deletes them in the
same transaction that revokes the member's API keys, whichever way the member goes (removed
through the API, the console or the operators' admin, or leaving). Migration tenancy 0005 moves the rows from the
console's table to tenancy's, keeping them, and deletes the keys removal left behind before.
"""
from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from gateway import access
from gpucloud.tenancy.choices import Role
from gpucloud.tenancy.models import ApiKey, AuditEvent, Membership, SshKey
from gpucloud.tenancy.services import invitation_create, ssh_key_add
from tests.agents.test_agent_api import make_sim_host, place, region, state, triggered  # noqa: F401
from tests.api.test_isolation import ED25519
from tests.conftest import make_actor
from tests.gateway.test_gateway_ssh import running_instance

OTHER_ED25519 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHziNYTO++j1tTOhNVBAXJUY+AqMJCci13TW3GYTliOz other@laptop"


def _remove(how: str, alice, bob) -> None:
    """bob leaves Acme: removed by alice through the API or the console, by an operator in
    /admin/, or leaving himself."""
    if how == "api":
        resp = alice.client().delete(f"/api/v1/members/{bob.membership.pk}")
        assert resp.status_code == 204, resp.content
    elif how == "console":
        client = Client()
        client.force_login(alice.user)
        resp = client.post(reverse("console:member_remove", kwargs={"pk": bob.membership.pk}))
        assert resp.status_code == 302, resp.content
    elif how == "operator":  # in /admin/, as an operator
        client = Client()
        client.force_login(get_user_model().objects.create_superuser("op@example.test", "op@example.test", "x"))
        resp = client.post(reverse("admin:tenancy_membership_delete", args=[bob.membership.pk]), {"post": "yes"})
        assert resp.status_code == 302, resp.content
    else:
        resp = bob.client().delete(f"/api/v1/members/{bob.membership.pk}")
        assert resp.status_code == 204, resp.content
    assert not Membership.objects.filter(pk=bob.membership.pk).exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("how", ["api", "console", "operator", "leave"])
def test_a_removed_member_s_ssh_keys_go_with_them_and_do_not_come_back(how, make_sim_host, alice):  # noqa: F811
    bob = make_actor("bob@acme.test", tenant=alice.tenant, role=Role.MEMBER)
    _, w = running_instance(make_sim_host, alice.tenant)
    resp = bob.client().post("/api/v1/ssh-keys", {"name": "laptop", "public_key": ED25519}, format="json")
    assert resp.status_code == 201, resp.content
    ssh_key_add(membership=alice.membership, name="alice's", public_key=OTHER_ED25519)
    grant = access.authorize(username=str(w.pk), public_key=ED25519)
    assert grant is not None and grant.user_id == bob.user.pk  # the gateway lets bob's key in

    _remove(how, alice, bob)
    assert access.authorize(username=str(w.pk), public_key=ED25519) is None
    assert not SshKey.objects.filter(user=bob.user).exists()
    assert SshKey.objects.filter(user=alice.user).count() == 1  # nobody else's
    deleted = AuditEvent.objects.get(tenant=alice.tenant, action="ssh_key.delete")
    assert deleted.data["reason"] == "member.remove" and deleted.object_repr == "laptop"
    removal = AuditEvent.objects.get(tenant=alice.tenant, action="member.remove")
    assert removal.data["ssh_keys_removed"] == [resp.json()["fingerprint"]]
    assert removal.data["api_keys_revoked"] and ApiKey.objects.filter(created_by=bob.user,
                                                                    revoked_at__isnull=True).count() == 0

    # bob is invited back: his old key stays out, at the gateway and in his list.
    _, token = invitation_create(actor=alice.membership, email=bob.user.email, role=Role.MEMBER)
    session = APIClient()
    session.force_login(bob.user)
    assert session.post("/api/v1/invitations/accept", {"token": token}, format="json").status_code == 201
    assert access.authorize(username=str(w.pk), public_key=ED25519) is None
    assert session.get("/api/v1/ssh-keys", HTTP_X_TENANT=alice.tenant.slug).json()["results"] == []
    assert access.authorize(username=str(w.pk), public_key=OTHER_ED25519).user_id == alice.user.pk


@pytest.mark.django_db(transaction=True)
def test_migration_moves_saved_keys_to_tenancy_keeping_them_and_drops_those_left_behind():
    """tenancy 0005 on a database as it was before: a member's key keeps its row (id, name,
    key, date) under tenancy's model; a key whose owner was removed the old way is deleted,
    audited; backwards puts the table back where it was."""
    before = [("tenancy", "0004_tenant_launch_blocked"), ("frontend", "0001_sshkey")]
    after = [("tenancy", "0005_sshkey_from_frontend"), ("frontend", "0002_sshkey_to_tenancy")]
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    try:
        old = executor.loader.project_state(before).apps
        user_model, tenant_model = old.get_model("auth", "User"), old.get_model("tenancy", "Tenant")
        kept_user = user_model.objects.create(username="kept@acme.test", email="kept@acme.test")
        gone_user = user_model.objects.create(username="gone@acme.test", email="gone@acme.test")
        tenant = tenant_model.objects.create(name="Acme", slug="acme")
        old.get_model("tenancy", "Membership").objects.create(tenant=tenant, user=kept_user, role="member")
        old_key = old.get_model("frontend", "SshKey")
        kept = old_key.objects.create(tenant=tenant, user=kept_user, name="laptop", public_key=ED25519)
        gone = old_key.objects.create(tenant=tenant, user=gone_user, name="old", public_key=OTHER_ED25519)
        executor = MigrationExecutor(connection)
        executor.migrate(after)
        new = executor.loader.project_state(after).apps.get_model("tenancy", "SshKey")
        assert new._meta.db_table == "tenancy_sshkey"
        assert [(k.pk, k.name, k.public_key, k.created_at, k.user_id) for k in new.objects.all()] == [
            (kept.pk, "laptop", ED25519, kept.created_at, kept_user.pk)]
        audit = executor.loader.project_state(after).apps.get_model("tenancy", "AuditEvent")
        assert list(audit.objects.filter(action="ssh_key.delete").values_list("object_id", "data")) == [
            (str(gone.pk), {"reason": "member.remove"})]
        # ...and back: the console's table again, with the row.
        executor = MigrationExecutor(connection)
        executor.migrate(before)
        assert "frontend_sshkey" in connection.introspection.table_names()
        assert "tenancy_sshkey" not in connection.introspection.table_names()
        assert executor.loader.project_state(before).apps.get_model("frontend", "SshKey").objects.get().pk == kept.pk
    finally:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes())
    assert SshKey.objects.get().pk == kept.pk  # the app's own model reads the moved row
