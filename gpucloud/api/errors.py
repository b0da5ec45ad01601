"""ONE error shape for every 4xx/5xx of the API:

    {"error": {"code": "validation_error", "message": "...", "fields": {"name": ["..."]}}}

`code` is stable and machine-readable; `message` is for people; `fields` maps
input fields to their problems (empty when no single field is to blame).
"""
from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import BadRequest
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404, JsonResponse
from django.views import csrf, defaults
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import set_rollback

from gpucloud.lib.errors import ServiceError

logger = logging.getLogger(__name__)


def error_body(code: str, message: str, fields: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "fields": fields or {}}}


def _messages(detail: Any, path: str, field: str) -> list[str]:
    """The messages under `detail`, each one below the field itself led by its path.

    `fields` keeps one shape, {input field: [strings]}, whatever the serializer: a nested
    problem stays under its top-level field and says where it is, as the agent protocol
    names places: `ssh_keys[0]: Ensure this field...`, `env.HOME: Not a valid string.`
    """
    if isinstance(detail, dict):
        out: list[str] = []
        for key, value in detail.items():
            # ListField errors are keyed by the item's index, a nested serializer's by field name
            out += _messages(value, f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}", field)
        return out
    if isinstance(detail, list) and any(isinstance(d, (dict, list)) for d in detail):
        # a list serializer's errors: one entry per item, empty for the items that are fine
        out = []
        for index, item in enumerate(detail):
            if item:
                out += _messages(item, f"{path}[{index}]", field)
        return out
    said = [str(d) for d in detail] if isinstance(detail, list) else [str(detail)]
    return said if path == field else [f"{path}: {m}" for m in said]


def _validation_response(exc: exceptions.ValidationError) -> tuple[str, dict[str, Any]]:
    detail = exc.detail
    if isinstance(detail, dict):
        fields = {str(name): _messages(value, str(name), str(name)) for name, value in detail.items()}
        general = fields.pop("non_field_errors", None)
        if general:
            return "; ".join(general), fields
        names = ", ".join(sorted(fields))
        return f"Invalid input in: {names}.", fields
    return "; ".join(_messages(detail, "", "")), {}


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, ServiceError):
        set_rollback()
        return Response(error_body(exc.code, exc.message, exc.fields), status=exc.status)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()

    if not isinstance(exc, exceptions.APIException):
        return None  # a bug: Django's 500 handler answers (see handler500 below)

    headers = {}
    if getattr(exc, "auth_header", None):
        headers["WWW-Authenticate"] = exc.auth_header
    if getattr(exc, "wait", None):
        headers["Retry-After"] = str(int(exc.wait))

    if isinstance(exc, exceptions.ValidationError):
        code = "validation_error"
        message, fields = _validation_response(exc)
    else:
        # DRF's codes are ours: not_authenticated, authentication_failed, permission_denied,
        # not_found, parse_error, method_not_allowed, unsupported_media_type, throttled, or
        # the specific code a view raised (tenant_suspended, insufficient_scope, ...).
        codes = exc.get_codes()
        code = codes if isinstance(codes, str) else exc.default_code
        message, fields = str(exc.detail), {}
    set_rollback()
    return Response(error_body(code, message, fields), status=exc.status_code, headers=headers)


def _is_api(request) -> bool:
    return request.path.startswith(("/api/", "/agent/"))


def handler404(request, exception=None):
    if _is_api(request):
        return JsonResponse(error_body("not_found", "Not found."), status=404)
    return defaults.page_not_found(request, exception)


@csrf_exempt  # it changes nothing; a POST to an unknown path is a 404, not a CSRF refusal
def not_found(request, *args, **kwargs):
    return JsonResponse(error_body("not_found", f"No API route {request.path}."), status=404)


def handler500(request):
    logger.exception("unhandled error on %s", request.path)
    if _is_api(request):
        return JsonResponse(
            error_body("server_error", "Something went wrong on our side; it has been logged."),
            status=status.HTTP_500_INTERNAL_SERVER_ERROR,
        )
    return defaults.server_error(request)


def handler400(request, exception=None):
    if _is_api(request):
        said = str(exception) if isinstance(exception, BadRequest) else ""
        return JsonResponse(error_body("bad_request", said or "Bad request."), status=400)
    return defaults.bad_request(request, exception)


def csrf_failure(request, reason=""):
    """CSRF_FAILURE_VIEW: the API's error shape under /api/ and /agent/, Django's page elsewhere."""
    if _is_api(request):
        message = f"CSRF check failed: {reason} Send an API key (Authorization: Bearer) or the CSRF token."
        return JsonResponse(error_body("permission_denied", message), status=403)
    return csrf.csrf_failure(request, reason)


def handler403(request, exception=None):
    if _is_api(request):
        return JsonResponse(error_body("permission_denied", "Permission denied."), status=403)
    return defaults.permission_denied(request, exception)
