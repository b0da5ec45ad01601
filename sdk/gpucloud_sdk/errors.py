"""The API's one error shape, raised as typed exceptions.

Every 4xx/5xx of a gpucloud server answers

    {"error": {"code": "validation_error", "message": "...", "fields": {"name": ["..."]}}}

`ApiError.from_response` picks the class from the stable `code` first (a code the server
documents), then from the HTTP status (a code this SDK does not know yet still lands in the
right family), so `except NotFound:` keeps working as servers add codes.
"""
from __future__ import annotations

from typing import Any

import httpx


class GpucloudError(Exception):
    """Anything this SDK raises."""


class ApiError(GpucloudError):
    """The server answered with an error: `status`, `code`, `message`, `fields`."""

    status_code: int = 0

    def __init__(self, message: str, *, status: int = 0, code: str = "error",
                 fields: dict[str, Any] | None = None, retry_after: float | None = None,
                 response: httpx.Response | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status or self.status_code
        self.code = code
        self.fields: dict[str, Any] = fields or {}
        self.retry_after = retry_after
        self.response = response

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}(status={self.status}, code={self.code!r}, message={self.message!r})"

    @classmethod
    def from_response(cls, response: httpx.Response) -> ApiError:
        code, message, fields = "error", "", {}
        try:
            body = response.json()
        except ValueError:
            body = None
        if isinstance(body, dict) and isinstance(body.get("error"), dict):
            err = body["error"]
            code = str(err.get("code") or code)
            message = str(err.get("message") or "")
            fields = err.get("fields") or {}
        if not message:
            message = f"HTTP {response.status_code} from {response.request.method} {response.request.url.path}"
        klass = error_class(response.status_code, code)
        return klass(message, status=response.status_code, code=code, fields=fields,
                     retry_after=retry_after_seconds(response), response=response)


class BadRequest(ApiError):
    status_code = 400


class ValidationError(BadRequest):
    """Bad input; `fields` maps each input field to its problems."""


class ParseError(BadRequest):
    """The request body was not valid JSON."""


class AuthenticationError(ApiError):
    """No API key, or one that is unknown, revoked or expired."""

    status_code = 401


class PaymentRequired(ApiError):
    """No credit left, or a hard-stop budget is spent: nothing new may launch."""

    status_code = 402


class PermissionDenied(ApiError):
    """The role or the key's scopes do not allow it (or the tenant is suspended)."""

    status_code = 403


class NotFound(ApiError):
    status_code = 404


class ServerLacks(NotFound):
    """The server has no such route yet (an older gpucloud): `feature` names what is missing."""

    def __init__(self, message: str, *, feature: str = "", **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.feature = feature


class MethodNotAllowed(ApiError):
    status_code = 405


class NotAcceptable(ApiError):
    status_code = 406


class Conflict(ApiError):
    """The request clashes with the current state (an illegal transition, a taken name, ...)."""

    status_code = 409


class Unsatisfiable(Conflict):
    """No host of the region could ever run what was asked (no such GPU model there, more GPUs
    than any host or gang gives); nothing was created. `message` says why."""


class UnsupportedMediaType(ApiError):
    status_code = 415


class PayloadTooLarge(ApiError):
    """The request body is over the server's limit (MAX_REQUEST_BODY_BYTES)."""


class Throttled(ApiError):
    """Too many requests; `retry_after` says when to come back (the client retries by itself)."""

    status_code = 429


class ServerError(ApiError):
    """A 5xx: the server logged it."""

    status_code = 500


class ServiceUnavailable(ServerError):
    status_code = 503


class WaitTimeout(GpucloudError):
    """`wait_for` gave up: `last` is the object as last seen."""

    def __init__(self, message: str, *, last: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.last = last or {}


class UnexpectedState(GpucloudError):
    """`wait_for` saw the object end in a state that was not waited for: `last` is the object."""

    def __init__(self, message: str, *, last: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.last = last or {}


class AmbiguousName(GpucloudError):
    """A name matched several objects; `candidates` lists them."""

    def __init__(self, message: str, *, candidates: list[dict[str, Any]]) -> None:
        super().__init__(message)
        self.candidates = candidates


# The codes a gpucloud server documents (gpucloud/lib/errors.py, the services' own codes and
# DRF's), each to its class. tests/cli/test_sdk.py walks the server's exception classes and
# fails when one of its codes is missing here.
CODES: dict[str, type[ApiError]] = {
    "validation_error": ValidationError,
    "invalid": BadRequest,
    "bad_request": BadRequest,
    "parse_error": ParseError,
    "unknown_region": ValidationError,
    "unknown_instance_type": ValidationError,
    "not_offered": ValidationError,
    "max_price_below_spot": ValidationError,
    "quota_exceeded": ValidationError,
    "not_authenticated": AuthenticationError,
    "authentication_failed": AuthenticationError,
    "payment_required": PaymentRequired,
    "insufficient_credit": PaymentRequired,
    "email_unconfirmed": PaymentRequired,
    "budget_exceeded": PaymentRequired,
    "permission_denied": PermissionDenied,
    "insufficient_scope": PermissionDenied,
    "tenant_suspended": PermissionDenied,
    "no_tenant": PermissionDenied,
    "invitation_email_mismatch": PermissionDenied,
    "outbound_refused": ValidationError,
    "not_found": NotFound,
    "tenant_not_found": NotFound,
    "invitation_invalid": NotFound,
    "method_not_allowed": MethodNotAllowed,
    "not_acceptable": NotAcceptable,
    "conflict": Conflict,
    "volume_attached": Conflict,
    "volume_name_taken": Conflict,
    "volume_deleted": Conflict,
    "volume_moving": Conflict,
    "volume_shrink": ValidationError,
    "unknown_volume": ValidationError,
    "illegal_transition": Conflict,
    "last_owner": Conflict,
    "already_member": Conflict,
    "email_taken": Conflict,
    "gpu_in_use": Conflict,
    "gpu_owned_by_another_host": Conflict,
    "invalid_signature": BadRequest,  # a payment provider's webhook that does not verify
    "topup_mismatch": BadRequest,
    "host_shrunk": Conflict,
    "host_in_other_region": Conflict,
    "host_exists": Conflict,
    "not_stopped": Conflict,
    "unsatisfiable": Unsatisfiable,
    "otp_invalid": ValidationError,
    "verification_invalid": ValidationError,
    "overflow": ValidationError,
    "otp_required": PermissionDenied,
    "signup_closed": PermissionDenied,
    "unsupported_media_type": UnsupportedMediaType,
    "request_too_large": PayloadTooLarge,
    "throttled": Throttled,
    "locked_out": Throttled,
    "server_error": ServerError,
    "service_unavailable": ServiceUnavailable,
}

_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequest, 401: AuthenticationError, 402: PaymentRequired, 403: PermissionDenied, 404: NotFound,
    405: MethodNotAllowed, 406: NotAcceptable, 409: Conflict, 413: PayloadTooLarge, 415: UnsupportedMediaType,
    429: Throttled,
    503: ServiceUnavailable,
}


def error_class(status: int, code: str) -> type[ApiError]:
    """The class for an error answer: by its code when known and of the same family, else by status."""
    by_status = _BY_STATUS.get(status) or (ServerError if status >= 500 else BadRequest if status >= 400 else ApiError)
    by_code = CODES.get(code)
    if by_code is not None and (by_code.status_code == status or issubclass(by_code, by_status)):
        return by_code
    return by_status


def retry_after_seconds(response: httpx.Response) -> float | None:
    """`Retry-After` in seconds (delta-seconds or an HTTP date), or None."""
    value = response.headers.get("Retry-After")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    from email.utils import parsedate_to_datetime

    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    import datetime as dt

    return max(0.0, (when - dt.datetime.now(dt.UTC)).total_seconds())
