from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from gpucloud.tenancy.choices import Role
from gpucloud.tenancy.models import AuditEvent, Invitation, Membership, Tenant

pytestmark = pytest.mark.django_db
User = get_user_model()


def session_for(user) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def test_signup_creates_a_tenant_owned_by_the_new_user(anon):
    resp = anon.post("/api/v1/auth/signup", {
        "email": "Dana@Example.test", "password": "a long enough passphrase",
        "tenant_name": "Dana's Lab", "create_api_key": True,
    }, format="json")
    assert resp.status_code == 201, resp.json()
    body = resp.json()
    tenant = Tenant.objects.get(pk=body["tenant"]["id"])
    user = User.objects.get(email="dana@example.test")
    assert Membership.objects.get(tenant=tenant, user=user).role == Role.OWNER
    # signed in by session, and the returned key works
    assert anon.get("/api/v1/tenant").json()["slug"] == tenant.slug
    keyed = APIClient()
    keyed.credentials(HTTP_AUTHORIZATION=f"Bearer {body['api_key']}")
    assert keyed.get("/api/v1/tenant").json()["id"] == str(tenant.pk)
    assert AuditEvent.objects.filter(tenant=tenant, action="tenant.create", actor_user=user).exists()


def test_signup_refuses_a_taken_email_and_weak_password(alice, anon):
    before = (User.objects.count(), Tenant.objects.count())
    resp = anon.post("/api/v1/auth/signup", {"email": "alice@acme.test", "password": "x" * 20,
                                              "tenant_name": "X"}, format="json")
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "email_taken"
    resp = anon.post("/api/v1/auth/signup", {"email": "new@x.test", "password": "123",
                                              "tenant_name": "X"}, format="json")
    assert resp.status_code == 400 and "password" in resp.json()["error"]["fields"]
    assert (User.objects.count(), Tenant.objects.count()) == before


def test_invite_accept_and_remove(alice):
    resp = alice.client().post("/api/v1/invitations", {"email": "erin@acme.test", "role": "member"},
                               format="json")
    assert resp.status_code == 201, resp.json()
    token = resp.json()["token"]
    assert not Invitation.objects.filter(token_hash__contains=token).exists()
    assert "token" not in alice.client().get(f"/api/v1/invitations/{resp.json()['id']}").json()

    erin = User.objects.create_user(username="erin@acme.test", email="erin@acme.test", password="pw-erin-123")
    resp = session_for(erin).post("/api/v1/invitations/accept", {"token": token}, format="json")
    assert resp.status_code == 201
    membership = Membership.objects.get(tenant=alice.tenant, user=erin)
    assert membership.role == Role.MEMBER
    # used once only
    again = session_for(erin).post("/api/v1/invitations/accept", {"token": token}, format="json")
    assert again.status_code == 404 and again.json()["error"]["code"] == "invitation_invalid"

    assert alice.client().delete(f"/api/v1/members/{membership.pk}").status_code == 204
    assert not Membership.objects.filter(pk=membership.pk).exists()
    actions = list(AuditEvent.objects.filter(tenant=alice.tenant).values_list("action", flat=True))
    assert {"invitation.create", "invitation.accept", "member.remove"} <= set(actions)


def test_invitation_for_another_email_cannot_be_taken(alice, charlie):
    token = alice.client().post("/api/v1/invitations", {"email": "erin@acme.test"}, format="json").json()["token"]
    resp = session_for(charlie.user).post("/api/v1/invitations/accept", {"token": token}, format="json")
    assert resp.status_code == 403
    assert not Membership.objects.filter(tenant=alice.tenant, user=charlie.user).exists()


def test_member_cannot_invite_or_remove_others(alice, bob, victor):
    resp = bob.client().post("/api/v1/invitations", {"email": "x@acme.test"}, format="json")
    assert resp.status_code == 403
    resp = bob.client().delete(f"/api/v1/members/{victor.membership.pk}")
    assert resp.status_code == 403
    assert Membership.objects.filter(pk=victor.membership.pk).exists()


def test_anyone_may_leave(bob):
    assert bob.client().delete(f"/api/v1/members/{bob.membership.pk}").status_code == 204
    assert not Membership.objects.filter(pk=bob.membership.pk).exists()


def test_admin_cannot_remove_or_demote_an_owner_nor_grant_owner(alice, bob):
    admin = bob
    Membership.objects.filter(pk=admin.membership.pk).update(role=Role.ADMIN)
    client = session_for(admin.user)
    assert client.delete(f"/api/v1/members/{alice.membership.pk}").status_code == 403
    resp = client.patch(f"/api/v1/members/{alice.membership.pk}", {"role": "viewer"}, format="json")
    assert resp.status_code == 403
    resp = client.post("/api/v1/invitations", {"email": "z@z.test", "role": "owner"}, format="json")
    assert resp.status_code == 403
    assert Membership.objects.get(pk=alice.membership.pk).role == Role.OWNER


def test_last_owner_stays(alice, bob):
    resp = alice.client().patch(f"/api/v1/members/{alice.membership.pk}", {"role": "admin"}, format="json")
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "last_owner"
    assert alice.client().delete(f"/api/v1/members/{alice.membership.pk}").status_code == 409
    # with a second owner, the first may step down
    alice.client().patch(f"/api/v1/members/{bob.membership.pk}", {"role": "owner"}, format="json")
    resp = alice.client().patch(f"/api/v1/members/{alice.membership.pk}", {"role": "admin"}, format="json")
    assert resp.status_code == 200 and resp.json()["role"] == "admin"


def test_session_user_switches_tenant_with_header(alice, charlie):
    Membership.objects.create(tenant=charlie.tenant, user=alice.user, role=Role.VIEWER)
    client = session_for(alice.user)
    tenants = client.get("/api/v1/tenants").json()
    assert {t["tenant"]["slug"] for t in tenants} == {alice.tenant.slug, charlie.tenant.slug}
    assert client.get("/api/v1/tenant", HTTP_X_TENANT=charlie.tenant.slug).json()["id"] == str(charlie.tenant.pk)
    # her role there is viewer: no invitations
    resp = client.post("/api/v1/invitations", {"email": "q@q.test"}, format="json", HTTP_X_TENANT=charlie.tenant.slug)
    assert resp.status_code == 403
    # a tenant she is not in is not found
    other = Tenant.objects.create(name="Other", slug="other")
    assert client.get("/api/v1/tenant", HTTP_X_TENANT=other.slug).status_code == 404


def test_api_key_lists_only_its_own_tenant(alice, charlie):
    Membership.objects.create(tenant=charlie.tenant, user=alice.user, role=Role.MEMBER)
    tenants = alice.client().get("/api/v1/tenants").json()
    assert [t["tenant"]["slug"] for t in tenants] == [alice.tenant.slug]


def test_owner_renames_tenant_member_cannot(alice, bob):
    assert bob.client().patch("/api/v1/tenant", {"name": "Bob Inc"}, format="json").status_code == 403
    resp = alice.client().patch("/api/v1/tenant", {"name": "Acme Research"}, format="json")
    assert resp.status_code == 200 and resp.json()["name"] == "Acme Research"
