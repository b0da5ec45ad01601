"""Bad input gets a 4xx in the one error shape and writes nothing."""
from __future__ import annotations

import pytest

from gpucloud.tenancy.models import ApiKey, AuditEvent, Invitation, Membership, Tenant

pytestmark = pytest.mark.django_db


def counts():
    return tuple(m.objects.count() for m in (ApiKey, AuditEvent, Invitation, Membership, Tenant))


def assert_error_shape(resp, status, code=None):
    assert resp.status_code == status, (resp.status_code, resp.content)
    body = resp.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"code", "message", "fields"}
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert isinstance(body["error"]["fields"], dict)
    if code:
        assert body["error"]["code"] == code
    return body["error"]


RAW_CASES = [
    ("malformed json", "/api/v1/api-keys", '{"name": "x",', "parse_error", None),
    ("json array", "/api/v1/api-keys", '["read"]', "validation_error", None),
    ("json string", "/api/v1/invitations", '"hello"', "validation_error", None),
]

JSON_CASES = [
    ("unknown field", "/api/v1/api-keys", {"name": "x", "scope": ["read"]}, "scope"),
    ("wrong type name", "/api/v1/api-keys", {"name": {"a": 1}}, "name"),
    ("wrong type scopes", "/api/v1/api-keys", {"name": "x", "scopes": "read"}, "scopes"),
    ("unknown scope", "/api/v1/api-keys", {"name": "x", "scopes": ["root"]}, "scopes"),
    ("empty scopes", "/api/v1/api-keys", {"name": "x", "scopes": []}, "scopes"),
    ("negative expiry", "/api/v1/api-keys", {"name": "x", "expires_in_days": -5}, "expires_in_days"),
    ("absurd expiry", "/api/v1/api-keys", {"name": "x", "expires_in_days": 10**12}, "expires_in_days"),
    ("expiry not a number", "/api/v1/api-keys", {"name": "x", "expires_in_days": "soon"}, "expires_in_days"),
    ("expiry in the past", "/api/v1/api-keys", {"name": "x", "expires_at": "2001-01-01T00:00:00Z"}, "expires_at"),
    ("over-long name", "/api/v1/api-keys", {"name": "x" * 101}, "name"),
    ("blank name", "/api/v1/api-keys", {"name": ""}, "name"),
    ("bad email", "/api/v1/invitations", {"email": "not-an-email"}, "email"),
    ("over-long email", "/api/v1/invitations", {"email": "a" * 300 + "@x.test"}, "email"),
    ("unknown role", "/api/v1/invitations", {"email": "a@x.test", "role": "god"}, "role"),
    ("null role", "/api/v1/invitations", {"email": "a@x.test", "role": None}, "role"),
    ("unknown field on signup", "/api/v1/auth/signup",
     {"email": "n@x.test", "password": "long enough pass", "tenant_name": "T", "plan": "enterprise"}, "plan"),
]


@pytest.mark.parametrize("label,url,raw,code,_", RAW_CASES, ids=[c[0] for c in RAW_CASES])
def test_unparseable_bodies(label, url, raw, code, _, alice):
    before = counts()
    resp = alice.client().post(url, raw, content_type="application/json")
    assert_error_shape(resp, 400, code)
    assert counts() == before


@pytest.mark.parametrize("label,url,body,field", JSON_CASES, ids=[c[0] for c in JSON_CASES])
def test_invalid_fields_name_the_field(label, url, body, field, alice):
    before = counts()
    resp = alice.client().post(url, body, format="json")
    error = assert_error_shape(resp, 400, "validation_error")
    assert field in error["fields"], error
    assert counts() == before


def test_patch_with_wrong_type_changes_nothing(alice, bob):
    before = counts()
    resp = alice.client().patch(f"/api/v1/members/{bob.membership.pk}", {"role": 7}, format="json")
    assert_error_shape(resp, 400, "validation_error")
    resp = alice.client().patch("/api/v1/tenant", {"name": "x" * 101}, format="json")
    assert_error_shape(resp, 400, "validation_error")
    assert counts() == before
    bob.membership.refresh_from_db()
    assert bob.membership.role == "member"


def test_unsupported_media_type_and_method(alice):
    resp = alice.client().post("/api/v1/api-keys", "name=x", content_type="text/plain")
    assert_error_shape(resp, 415, "unsupported_media_type")
    resp = alice.client().put("/api/v1/tenant", {"name": "x"}, format="json")
    assert_error_shape(resp, 405, "method_not_allowed")


def test_malformed_ids_and_unknown_routes_are_404_in_shape(alice):
    assert_error_shape(alice.client().get("/api/v1/members/not-a-uuid"), 404, "not_found")
    assert_error_shape(alice.client().get("/api/v1/members/00000000-0000-0000-0000-000000000000"), 404)
    assert_error_shape(alice.client().get("/api/v1/no-such-thing"), 404, "not_found")


def test_bad_query_parameters(alice, catalog):
    assert_error_shape(alice.client().get("/api/v1/instance-types", {"min_gpus": "-3"}), 400)
    assert_error_shape(alice.client().get("/api/v1/instance-types", {"min_gpus": "lots"}), 400)
    assert_error_shape(alice.client().get("/api/v1/audit-events", {"since": "yesterday"}), 400)
    assert_error_shape(alice.client().get("/api/v1/instance-types", {"page": "999"}), 404)


def test_missing_and_malformed_auth(anon):
    assert_error_shape(anon.get("/api/v1/tenant"), 401, "not_authenticated")
    assert_error_shape(anon.get("/api/v1/tenant", HTTP_AUTHORIZATION="Bearer"), 401, "authentication_failed")
    assert_error_shape(anon.get("/api/v1/tenant", HTTP_AUTHORIZATION="Bearer a b"), 401)
    assert_error_shape(anon.get("/api/v1/tenant", HTTP_AUTHORIZATION="Bearer gpc_zz"), 401)


@pytest.mark.parametrize("header", ["\u00a0", "\u00a0\u00a0", "\u0085", "\u00a0Bearer\u00a0"])
def test_an_authorization_header_of_odd_whitespace_is_a_401(anon, header):
    anon.raise_request_exception = False
    # WSGI carries header values as latin-1 text: NBSP arrives as "\xa0"
    resp = anon.get("/api/v1/tenant", HTTP_AUTHORIZATION=header)
    assert_error_shape(resp, 401, "authentication_failed")


@pytest.mark.parametrize("method", ["post", "put", "patch", "delete"])
def test_unsafe_methods_on_unknown_api_paths_are_404_in_shape_not_a_csrf_page(method, alice):
    from django.test import Client

    signed_in = Client(enforce_csrf_checks=True)  # a browser session, which CSRF applies to
    signed_in.force_login(alice.user)
    for client in (Client(enforce_csrf_checks=True), signed_in):
        resp = getattr(client, method)("/api/v1/no-such-thing", "{}", content_type="application/json")
        assert_error_shape(resp, 404, "not_found")


def test_a_csrf_refusal_under_the_api_is_in_the_error_shape(alice):
    from django.test import Client

    client = Client(enforce_csrf_checks=True)
    client.force_login(alice.user)
    # DRF's views answer their own CSRF refusal; Django's answers for plain views under /api/
    for path in ("/api/v1/api-keys", "/api/auth/login/"):
        resp = client.post(path, {"name": "k", "scopes": ["read"]}, content_type="application/json")
        assert_error_shape(resp, 403, "permission_denied")
        assert "CSRF" in resp.json()["error"]["message"]
