"""Errors that services raise. The API and the console turn them into responses.

Each carries a stable machine-readable `code`, a sentence for people and,
when one input field is to blame, `fields` = {field: [messages]}.
"""
from __future__ import annotations


class ServiceError(Exception):
    status = 400
    code = "invalid"

    def __init__(
        self, message: str, *, code: str | None = None, fields: dict[str, list[str]] | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        if code:
            self.code = code
        self.fields = fields or {}


class InvalidInput(ServiceError):
    status = 400
    code = "validation_error"


class Forbidden(ServiceError):
    status = 403
    code = "permission_denied"


class NotFoundError(ServiceError):
    status = 404
    code = "not_found"


class Conflict(ServiceError):
    status = 409
    code = "conflict"


class PaymentRequired(ServiceError):
    """No credit left, or a hard-stop budget is spent: nothing new may launch."""

    status = 402
    code = "payment_required"
