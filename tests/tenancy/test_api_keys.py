from __future__ import annotations

import hashlib
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from gpucloud.tenancy.models import ApiKey, AuditEvent

pytestmark = pytest.mark.django_db


def create_key(actor, **body):
    body.setdefault("name", "ci")
    return actor.client().post("/api/v1/api-keys", body, format="json")


def test_secret_is_shown_once_and_stored_only_as_hash(alice):
    resp = create_key(alice, scopes=["read", "write"])
    assert resp.status_code == 201, resp.json()
    secret = resp.json()["secret"]
    assert secret.startswith(resp.json()["prefix"] + "_")

    # The row as PostgreSQL holds it: no column contains the secret.
    with connection.cursor() as cur:
        cur.execute("SELECT * FROM tenancy_apikey WHERE id = %s", [resp.json()["id"]])
        row = cur.fetchone()
    assert all(secret not in str(col) for col in row)
    assert hashlib.sha256(secret.encode()).hexdigest() in row

    detail = alice.client().get(f"/api/v1/api-keys/{resp.json()['id']}").json()
    assert "secret" not in detail and detail["prefix"] == resp.json()["prefix"]
    listed = alice.client().get("/api/v1/api-keys").json()["results"]
    assert all("secret" not in k for k in listed)


def test_new_key_authenticates_and_records_last_use(alice):
    body = create_key(alice, scopes=["read"]).json()
    resp = alice.client(body["secret"]).get("/api/v1/tenant", REMOTE_ADDR="10.1.2.3")
    assert resp.status_code == 200
    key = ApiKey.objects.get(pk=body["id"])
    assert key.last_used_at is not None and key.last_used_ip == "10.1.2.3"


def test_revoked_key_gets_401(alice):
    body = create_key(alice, scopes=["read"]).json()
    assert alice.client().post(f"/api/v1/api-keys/{body['id']}/revoke").status_code == 200
    resp = alice.client(body["secret"]).get("/api/v1/tenant")
    assert resp.status_code == 401
    assert resp.json()["error"]["code"] == "authentication_failed"
    assert resp["WWW-Authenticate"].startswith("Bearer")


def test_delete_revokes_and_keeps_the_row_for_the_audit_trail(alice):
    body = create_key(alice, scopes=["read"]).json()
    assert alice.client().delete(f"/api/v1/api-keys/{body['id']}").status_code == 204
    key = ApiKey.objects.get(pk=body["id"])
    assert key.revoked_at is not None
    assert alice.client(body["secret"]).get("/api/v1/tenant").status_code == 401


def test_expired_key_gets_401(alice):
    body = create_key(alice, scopes=["read"], expires_in_days=1).json()
    assert alice.client(body["secret"]).get("/api/v1/tenant").status_code == 200
    ApiKey.objects.filter(pk=body["id"]).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert alice.client(body["secret"]).get("/api/v1/tenant").status_code == 401


def test_tampered_secret_gets_401(alice):
    body = create_key(alice, scopes=["read"]).json()
    forged = body["secret"][:-2] + ("AA" if not body["secret"].endswith("AA") else "BB")
    assert alice.client(forged).get("/api/v1/tenant").status_code == 401


def test_read_key_gets_403_on_post(alice):
    secret = create_key(alice, scopes=["read"]).json()["secret"]
    before = ApiKey.objects.count()
    resp = alice.client(secret).post("/api/v1/api-keys", {"name": "x", "scopes": ["read"]}, format="json")
    assert resp.status_code == 403
    assert resp.json()["error"]["code"] == "insufficient_scope"
    assert ApiKey.objects.count() == before


def test_viewer_cannot_create_api_keys(victor):
    before = ApiKey.objects.count()
    session = victor.client()
    session.credentials()
    session.force_login(victor.user)
    resp = session.post("/api/v1/api-keys", {"name": "x", "scopes": ["read"]}, format="json")
    assert resp.status_code == 403
    assert resp.json()["error"]["code"] == "permission_denied"
    assert ApiKey.objects.count() == before


def test_member_cannot_mint_an_admin_key(bob):
    resp = create_key(bob, scopes=["admin"])
    assert resp.status_code == 403
    assert resp.json()["error"]["fields"] == {"scopes": ["Exceeds your role."]}


def test_member_revokes_own_key_but_not_anothers(alice, bob):
    own = create_key(bob, scopes=["read"]).json()
    assert bob.client().post(f"/api/v1/api-keys/{own['id']}/revoke").status_code == 200
    alices = create_key(alice, scopes=["read"]).json()
    resp = bob.client().post(f"/api/v1/api-keys/{alices['id']}/revoke")
    assert resp.status_code == 403
    assert ApiKey.objects.get(pk=alices["id"]).revoked_at is None
    # ...while an admin may revoke anybody's key in the tenant.
    assert alice.client().post(f"/api/v1/api-keys/{own['id']}/revoke").status_code == 200


def test_removed_members_keys_are_revoked(alice, bob):
    assert bob.client().get("/api/v1/tenant").status_code == 200
    assert alice.client().delete(f"/api/v1/members/{bob.membership.pk}").status_code == 204
    resp = bob.client().get("/api/v1/tenant")
    assert resp.status_code == 401 and resp.json()["error"]["code"] == "authentication_failed"
    key = ApiKey.objects.get(created_by=bob.user)
    assert key.revoked_at is not None
    event = AuditEvent.objects.get(action="api_key.revoke", object_id=str(key.pk))
    assert event.actor_user == alice.user and event.data == {"reason": "member.remove"}
    removal = AuditEvent.objects.get(action="member.remove", object_id=str(bob.membership.pk))
    assert removal.data["api_keys_revoked"] == [key.prefix]


def test_removed_members_keys_do_not_revive_when_they_rejoin(alice, bob, charlie):
    from gpucloud.tenancy.services import api_key_create

    globex = charlie.client().post("/api/v1/invitations", {"email": bob.user.email}, format="json")
    session = APIClient()
    session.force_login(bob.user)
    assert session.post("/api/v1/invitations/accept", {"token": globex.json()["token"]},
                        format="json").status_code == 201
    _, bobs_globex_key = api_key_create(
        membership=bob.user.memberships.get(tenant=charlie.tenant), name="globex", scopes=["read"])
    assert bob.client().get("/api/v1/tenant").status_code == 200

    assert alice.client().delete(f"/api/v1/members/{bob.membership.pk}").status_code == 204
    invite = alice.client().post("/api/v1/invitations", {"email": bob.user.email}, format="json")
    resp = session.post("/api/v1/invitations/accept", {"token": invite.json()["token"]}, format="json")
    assert resp.status_code == 201  # bob is back in Acme...
    resp = bob.client().get("/api/v1/tenant")
    assert resp.status_code == 401, resp.json()  # ...but his old Acme key stays dead
    # Only his keys in the tenant he left: his Globex key still works.
    assert bob.client(bobs_globex_key).get("/api/v1/tenant").json()["id"] == str(charlie.tenant.pk)


def test_leaving_revokes_ones_own_keys(bob):
    assert bob.client().delete(f"/api/v1/members/{bob.membership.pk}").status_code == 204
    assert ApiKey.objects.get(created_by=bob.user).revoked_at is not None


def test_migration_revokes_keys_of_members_removed_before(alice, bob):
    """Keys of members removed before removal revoked them: 0002 revokes them once."""
    import importlib

    from django.apps import apps

    migration = importlib.import_module("gpucloud.tenancy.migrations.0002_revoke_keys_of_removed_members")
    bob.membership.delete()  # removed the old way: the key stays unrevoked
    bobs = ApiKey.objects.get(created_by=bob.user)
    assert bobs.revoked_at is None
    migration.revoke_orphaned_keys(apps, None)
    bobs.refresh_from_db()
    assert bobs.revoked_at is not None
    assert ApiKey.objects.get(created_by=alice.user).revoked_at is None  # alice is still a member
    assert AuditEvent.objects.filter(action="api_key.revoke", object_id=str(bobs.pk)).count() == 1


def test_key_creation_and_revocation_are_audited(alice):
    body = create_key(alice, scopes=["read"]).json()
    alice.client().post(f"/api/v1/api-keys/{body['id']}/revoke", REMOTE_ADDR="192.0.2.7")
    events = AuditEvent.objects.filter(object_id=body["id"]).order_by("created_at")
    assert [e.action for e in events] == ["api_key.create", "api_key.revoke"]
    assert events[1].actor_user == alice.user
    assert events[1].source_ip == "192.0.2.7"
    assert "via key" in events[1].actor
