from __future__ import annotations

import io

import pytest
import yaml
from django.core.management import call_command

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def schema_text():
    out, err = io.StringIO(), io.StringIO()
    # --validate checks the document against the OpenAPI 3 meta-schema; --fail-on-warn
    # turns every generator warning (an undocumented field or view) into a failure.
    call_command("spectacular", "--validate", "--fail-on-warn", stdout=out, stderr=err)
    assert err.getvalue() == "", err.getvalue()
    return out.getvalue()


def test_schema_validates_without_warnings(schema_text):
    assert schema_text.startswith("openapi: 3")


def test_every_endpoint_is_documented_with_its_errors(schema_text):
    schema = yaml.safe_load(schema_text)
    paths = schema["paths"]
    for route in ("/api/v1/instance-types", "/api/v1/api-keys/{id}/revoke", "/api/v1/audit-events",
                  "/api/v1/quotas", "/api/v1/members/{id}", "/api/v1/auth/signup"):
        assert route in paths, route
    for path, item in paths.items():
        for method, op in item.items():
            responses = op["responses"]
            errors = [code for code in responses if code.startswith(("4", "5"))]
            assert errors, f"{method.upper()} {path} documents no error response"
            for code in errors:
                ref = responses[code]["content"]["application/json"]["schema"]["$ref"]
                assert ref == "#/components/schemas/Error"
            if "{" in path:
                assert "404" in responses, f"{method.upper()} {path}"
            if method in ("post", "patch", "put"):
                assert "400" in responses, f"{method.upper()} {path}"
    assert schema["components"]["schemas"]["ErrorDetail"]["required"] == ["code", "message", "fields"]


def test_schema_and_docs_are_served(client):
    assert client.get("/api/schema/").status_code == 200
    docs = client.get("/api/docs/")
    assert docs.status_code == 200
    assert b"cdn" not in docs.content.lower()  # Swagger UI is served by us, not a CDN


def _operations(schema):
    for path, item in schema["paths"].items():
        for method, op in item.items():
            yield path, method, op


def test_every_operation_documents_what_it_can_answer(schema_text):
    """The error statuses follow from what an operation is (gpucloud/api/schema.py)."""
    schema = yaml.safe_load(schema_text)
    for path, method, op in _operations(schema):
        codes = set(op["responses"])
        where = f"{method.upper()} {path}"
        assert {"400", "429"} <= codes, where
        if method in ("post", "put", "patch", "delete"):
            assert "409" in codes, where
        if "requestBody" in op:
            assert {"413", "415"} <= codes, where
            assert list(op["requestBody"]["content"]) == ["application/json"], where  # JSON only
        if any(p["name"] == "page" for p in op.get("parameters", [])):
            assert "404" in codes, where
    signup = schema["paths"]["/api/v1/auth/signup"]["post"]["responses"]
    assert not {"401", "403"} & set(signup)  # it has no authentication to fail
    assert {"401", "403", "404"} <= set(schema["paths"]["/api/v1/quotas"]["get"]["responses"])
    assert "403" not in schema["paths"]["/api/v1/regions"]["get"]["responses"]  # public: a bad key is a 401


def test_request_bodies_take_no_property_they_do_not_list(schema_text):
    schema = yaml.safe_load(schema_text)
    components = schema["components"]["schemas"]
    for path, method, op in _operations(schema):
        if "requestBody" in op:
            name = op["requestBody"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
            assert components[name].get("additionalProperties") is False, f"{method.upper()} {path}"


def test_page_parameters_start_at_one(schema_text):
    schema = yaml.safe_load(schema_text)
    params = {p["name"]: p for p in schema["paths"]["/api/v1/instances"]["get"]["parameters"]}
    assert params["page"]["schema"]["minimum"] == 1
    assert params["page_size"]["schema"]["minimum"] == 1


def test_values_the_api_gives_as_empty_strings_are_allowed_by_the_schema(schema_text):
    components = yaml.safe_load(schema_text)["components"]["schemas"]
    price_kind = components["LedgerEntry"]["properties"]["price_kind"]
    assert {"$ref": "#/components/schemas/BlankEnum"} in price_kind["oneOf"]
    for name in ("Budget", "BudgetCreated", "BudgetWriteRequest"):
        webhook = components[name]["properties"]["webhook_url"]
        assert {"type": "string", "maxLength": 0} in webhook["anyOf"], name
