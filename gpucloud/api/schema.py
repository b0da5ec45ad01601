"""drf-spectacular post-processing: every operation documents the common error responses."""
from __future__ import annotations

_ERRORS = {
    "400": "Invalid input: malformed JSON, unknown fields, wrong types or values.",
    "401": "Missing, unknown, revoked or expired API key.",
    "403": "Your role or the key's scopes do not allow this, or the tenant is suspended.",
    "404": "No such object in your tenant.",
    "429": "Rate limit reached; retry after the Retry-After header's seconds.",
}


# Operations that launch work answer 402 when the tenant has no credit or a spent hard-stop budget.
_PAYMENT_REQUIRED = {("/api/v1/instances", "post"), ("/api/v1/jobs", "post")}
_PAYMENT_TEXT = "No credit left, or a hard-stop budget is spent: nothing new may launch."


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
                "description": "Per input field, its problems",
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
            secured = op.get("security", result.get("security")) not in ([], [{}])
            for code, text in _ERRORS.items():
                if code == "400" and method in {"get", "delete"} and not op.get("parameters"):
                    continue
                if code in {"401", "403"} and not secured:
                    continue
                if code == "404" and "{" not in path and method != "post":
                    continue
                responses.setdefault(code, {"description": text, "content": ref})
            if (path, method) in _PAYMENT_REQUIRED:
                responses.setdefault("402", {"description": _PAYMENT_TEXT, "content": ref})
    return result

