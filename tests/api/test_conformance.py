"""What schemathesis found the API doing against its own schema, each pinned by a case.

The whole-schema run is tests/api/test_openapi_conformance.py; these name the mismatches it
found so a regression reads as a sentence and fails in a second.
"""
from __future__ import annotations

import pytest
from django.test import Client

from gpucloud.tenancy.models import ApiKey, Tenant
from scheduler.models import Workload

pytestmark = pytest.mark.django_db

WORKLOAD = {"name": "nb", "instance_type": "h100.1x", "region": "us-east-1", "image": "busybox"}


def error_of(resp, status):
    assert resp.status_code == status, (resp.status_code, resp.content[:500])
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "fields"}, body
    return body["error"]


@pytest.mark.parametrize("query", ["page=0", "page=-1", "page=abc", "page=last", "page=%D9%A1",
                                   "page_size=0", "page_size=-3", "page_size=abc"])
def test_a_malformed_page_parameter_is_a_400_naming_it(query, alice, catalog):
    error = error_of(alice.client().get(f"/api/v1/instance-types?{query}"), 400)
    assert error["code"] == "validation_error"
    assert list(error["fields"]) == [query.split("=")[0]]


def test_pages_past_the_end_are_404_and_big_page_sizes_are_cut(alice, catalog):
    assert error_of(alice.client().get("/api/v1/instance-types?page=999"), 404)["code"] == "not_found"
    assert alice.client().get("/api/v1/instance-types?page_size=100000").status_code == 200


def test_a_form_or_multipart_body_is_a_415_and_creates_nothing(alice):
    client = alice.client()
    for fmt in ("multipart", None):
        if fmt:
            resp = client.post("/api/v1/api-keys", {"name": "x", "expires_at": ""}, format=fmt)
        else:
            resp = client.post("/api/v1/api-keys", "name=x", content_type="application/x-www-form-urlencoded")
        assert error_of(resp, 415)["code"] == "unsupported_media_type"
    assert ApiKey.objects.count() == 1  # alice's own


def test_an_unknown_api_route_is_a_json_404_for_every_method_even_with_csrf_checks(alice):
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice.user)  # a session cookie, as a browser (or schemathesis after signup) has
    for method in ("post", "delete", "put", "patch"):
        resp = getattr(client, method)("/api/v1/api-keys/%C2%84/revoke", HTTP_AUTHORIZATION=f"Bearer {alice.key}")
        assert error_of(resp, 404)["code"] == "not_found"


def test_nested_field_errors_stay_under_their_field_as_strings_with_their_path(alice, catalog):
    body = {**WORKLOAD, "ssh_keys": ["ssh-ed25519 AAAA ok", "x" * 5000]}
    error = error_of(alice.client().post("/api/v1/instances", body, format="json"), 400)
    assert error["fields"] == {"ssh_keys": ["ssh_keys[1]: Ensure this field has no more than 4096 characters."]}
    error = error_of(alice.client().post("/api/v1/instances", {**WORKLOAD, "env": {"HOME": 7}}, format="json"), 400)
    assert error["fields"] == {"env": ["env.HOME: Not a valid string."]}
    assert not Workload.objects.exists()


def test_a_budget_threshold_error_names_the_item(alice):
    body = {"name": "cap", "monthly_amount": "100", "thresholds": [50, 0]}
    error = error_of(alice.client().post("/api/v1/budgets", body, format="json"), 400)
    assert error["fields"] == {"thresholds": ["thresholds[1]: Ensure this value is greater than or equal to 1."]}


@pytest.mark.parametrize(("url", "body", "field"), [
    ("/api/v1/instances", {**WORKLOAD, "image": 0}, "image"),
    ("/api/v1/instances", {**WORKLOAD, "ports": ["8888"]}, "ports"),
    ("/api/v1/instances", {**WORKLOAD, "billing": "spot", "max_price": 1.5}, "max_price"),
    ("/api/v1/jobs", {**WORKLOAD, "nodes": "1"}, "nodes"),
    ("/api/v1/jobs", {**WORKLOAD, "queue": 0}, "queue"),
    ("/api/v1/jobs", {**WORKLOAD, "max_retries": True}, "max_retries"),
    ("/api/v1/budgets", {"name": "cap", "monthly_amount": "100", "hard_stop": "yes"}, "hard_stop"),
    ("/api/v1/budgets", {"name": "cap", "monthly_amount": 100}, "monthly_amount"),
    ("/api/v1/api-keys", {"name": "ci", "expires_in_days": "5"}, "expires_in_days"),
])
def test_a_value_of_another_json_type_than_documented_is_refused(url, body, field, alice, catalog):
    error = error_of(alice.client().post(url, body, format="json"), 400)
    assert list(error["fields"]) == [field], error
    assert not Workload.objects.exists()


def test_a_tenant_name_that_is_a_number_is_refused_and_changes_nothing(alice):
    error = error_of(alice.client().patch("/api/v1/tenant", {"name": 0}, format="json"), 400)
    assert error["fields"] == {"name": ["Not a valid string."]}
    assert Tenant.objects.get(pk=alice.tenant.pk).name == "Acme"


@pytest.mark.parametrize("query", ["since=", "until=", "action=x&since="])
def test_an_empty_non_text_filter_is_a_400(query, alice):
    assert list(error_of(alice.client().get(f"/api/v1/audit-events?{query}"), 400)["fields"]) in (
        ["since"], ["until"])


@pytest.mark.parametrize("value", ["null", "1", "yes", ""])
def test_a_boolean_filter_takes_true_or_false_only(value, anon, catalog):
    error = error_of(anon.get(f"/api/v1/instance-types?fractional={value}"), 400)
    assert list(error["fields"]) == ["fractional"]
    assert anon.get("/api/v1/instance-types?fractional=true").status_code == 200


def test_an_empty_text_filter_still_means_no_filter(alice):
    assert alice.client().get("/api/v1/api-keys?name=").status_code == 200


@pytest.mark.parametrize("url", ["/api/v1/spot-prices?since=", "/api/v1/prices?at=",
                                 "/api/v1/audit-events?since="])
def test_times_with_offsets_postgresql_refuses_are_read_in_utc(url, alice, catalog):
    # ISO 8601 allows -16:01; PostgreSQL's range ends at ±15:59 ("time zone displacement out of range")
    client = alice.client()
    client.raise_request_exception = False
    assert client.get(url + "5130-04-05T07%3A59%3A29-16%3A01").status_code == 200
    assert client.get(url + "2030-01-01T00%3A00%3A00%2B17%3A30").status_code == 200
    error = error_of(client.get(url + "9999-12-31T23%3A59%3A59-15%3A00"), 400)  # past year 9999 in UTC
    assert error["code"] == "validation_error"
