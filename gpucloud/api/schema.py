"""drf-spectacular post-processing: every operation documents the error responses it can give.

One set of rules over the whole schema, not a decorator per view, so a new endpoint is
documented by what it is (secured or not, has a body, a path id, pages) and the schema
stays true without anyone remembering it. `tests/api/test_openapi_conformance.py` runs
schemathesis against a live server to check that it is.
"""
from __future__ import annotations

from typing import Any

_WRITES = {"post", "put", "patch", "delete"}

_TEXT = {
    "400": "Invalid input: malformed JSON, unknown fields, wrong types or values, a bad query parameter.",
    "401": "Missing, unknown, revoked or expired API key.",
    "403": "Your role or the key's scopes do not allow this, or the tenant is suspended.",
    "404": "No such object in your tenant, no such page, or (a browser session's `X-Tenant`) "
           "no such tenant among yours.",
    "409": "The request conflicts with the current state: a duplicate, the last owner, "
           "a state that does not allow it (`not_stopped`), or work no host of the region could "
           "ever run (`unsatisfiable`; nothing was created).",
    "413": "The request body is too large.",
    "415": "The body is not JSON: the API reads `application/json` only.",
    "429": "Rate limit reached; retry after the Retry-After header's seconds.",
}

# Operations that launch work answer 402 when the tenant has no credit or a spent hard-stop budget.
_PAYMENT_REQUIRED = {("/api/v1/instances", "post"), ("/api/v1/jobs", "post")}
_PAYMENT_TEXT = "No credit left, or a hard-stop budget is spent: nothing new may launch."


def _error_codes(path: str, method: str, op: dict[str, Any]) -> list[str]:
    """The error statuses an operation can answer, from what it is."""
    security = op.get("security") or []
    secured = bool(security)  # signup has no authentication at all: no 401, no 403
    anonymous_allowed = {} in security  # the public catalogue: a bad key is a 401, no role is needed
    has_body = "requestBody" in op
    paged = any(p.get("name") == "page" for p in op.get("parameters", []))
    codes = ["400"]  # every operation: a NUL in any query parameter is a 400 before the view
    if secured:
        codes.append("401")
    if secured and not anonymous_allowed:
        codes.append("403")
    if "{" in path or paged or (secured and not anonymous_allowed):
        codes.append("404")
    if method in _WRITES:
        codes.append("409")
    if has_body:
        codes += ["413", "415"]
    codes.append("429")
    if (path, method) in _PAYMENT_REQUIRED:
        codes.append("402")
    return codes


def add_error_responses(result, generator, request, public):
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    schemas["ErrorDetail"] = {
        "type": "object",
        "properties": {
            "code": {"type": "string", "description": "Stable machine-readable code"},
            "message": {"type": "string", "description": "What went wrong, for people"},
            "fields": {
                "type": "object",
                "additionalProperties": {"type": "array", "items": {"type": "string"}},
                "description": "Per input field, its problems. A problem inside a field (a list "
                               "item, a key) begins with its path: `ssh_keys[0]: ...`, `env.HOME: ...`.",
            },
        },
        "required": ["code", "message", "fields"],
    }
    schemas["Error"] = {
        "type": "object",
        "properties": {"error": {"$ref": "#/components/schemas/ErrorDetail"}},
        "required": ["error"],
    }
    ref = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    for path, item in result.get("paths", {}).items():
        for method, op in item.items():
            if method not in {"get", "post", "put", "patch", "delete"}:
                continue
            responses = op.setdefault("responses", {})
            for code in _error_codes(path, method, op):
                text = _PAYMENT_TEXT if code == "402" else _TEXT[code]
                responses.setdefault(code, {"description": text, "content": ref})
            op["responses"] = dict(sorted(responses.items()))
    return result
