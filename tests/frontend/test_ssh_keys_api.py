"""/api/v1/ssh-keys: personal keys per user and tenant, the same rows as the console page."""
from __future__ import annotations

import pytest

from gpucloud.tenancy import permissions as perms
from gpucloud.tenancy.models import AuditEvent, SshKey
from tests.api.test_isolation import ED25519
from tests.conftest import make_actor

pytestmark = pytest.mark.django_db



def test_a_member_adds_lists_and_removes_a_key(alice):
    resp = alice.client().post("/api/v1/ssh-keys", {"name": "laptop", "public_key": ED25519}, format="json")
    assert resp.status_code == 201, resp.json()
    body = resp.json()
    assert body["name"] == "laptop" and body["public_key"] == ED25519
    assert body["fingerprint"] == "SHA256:YC5aAKrSolR1YAvjGF8Ybvwhg8NAKvaFN1QgL+IgExQ"  # as `ssh-keygen -lf`
    assert [k["id"] for k in alice.client().get("/api/v1/ssh-keys").json()["results"]] == [body["id"]]
    assert AuditEvent.objects.filter(tenant=alice.tenant, action="ssh_key.create").exists()
    assert alice.client().delete(f"/api/v1/ssh-keys/{body['id']}").status_code == 204
    assert not SshKey.objects.exists()


def test_keys_are_personal_within_a_tenant(alice, bob):
    alice.client().post("/api/v1/ssh-keys", {"name": "laptop", "public_key": ED25519}, format="json")
    key = SshKey.objects.get()
    assert bob.client().get("/api/v1/ssh-keys").json()["results"] == []
    assert bob.client().get(f"/api/v1/ssh-keys/{key.pk}").status_code == 404
    assert bob.client().delete(f"/api/v1/ssh-keys/{key.pk}").status_code == 404
    assert SshKey.objects.count() == 1


def test_bad_key_and_duplicate_name_are_refused_in_the_error_shape(alice):
    resp = alice.client().post("/api/v1/ssh-keys", {"name": "x", "public_key": "not a key"}, format="json")
    assert resp.status_code == 400
    assert "public_key" in resp.json()["error"]["fields"]
    alice.client().post("/api/v1/ssh-keys", {"name": "x", "public_key": ED25519}, format="json")
    resp = alice.client().post("/api/v1/ssh-keys", {"name": "x", "public_key": ED25519}, format="json")
    assert resp.status_code == 409
    assert SshKey.objects.count() == 1


def test_a_viewer_keeps_keys_but_may_not_connect(alice):
    victor = make_actor("victor@acme.test", tenant=alice.tenant, role="viewer")
    resp = victor.client().post("/api/v1/ssh-keys", {"name": "v", "public_key": ED25519}, format="json")
    assert resp.status_code == 403  # a viewer's widest key is `read`: it cannot write
    from rest_framework.test import APIClient

    session = APIClient()
    session.force_login(victor.user)
    assert session.post("/api/v1/ssh-keys", {"name": "v", "public_key": ED25519}, format="json").status_code == 201
    assert perms.WORKLOADS_CONNECT not in perms.ROLE_PERMISSIONS["viewer"]
    assert perms.WORKLOADS_CONNECT in perms.ROLE_PERMISSIONS["member"]
    assert perms.WORKLOADS_CONNECT not in perms.SCOPE_PERMISSIONS["read"]
    assert perms.WORKLOADS_CONNECT in perms.SCOPE_PERMISSIONS["write"]
