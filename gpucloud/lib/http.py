from __future__ import annotations

from django.conf import settings


def client_ip(request) -> str | None:
    """The client's address; X-Forwarded-For only when the operator says a proxy sets it."""
    if settings.TRUST_X_FORWARDED_FOR:
        forwarded = request.META.get("HTTP_X_FORWARDED_FOR", "")
        if forwarded:
            return forwarded.split(",")[0].strip() or None
    return request.META.get("REMOTE_ADDR") or None
