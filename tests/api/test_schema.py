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
