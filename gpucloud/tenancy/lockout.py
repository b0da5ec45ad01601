"""django-axes, fitted to gpucloud: who is signing in, from where, what a locked-out client sees.

Axes counts failed sign-ins on every path that calls `authenticate(request=...)` (the console,
`/api/auth/login/`, `/admin/login/`) and refuses further ones once an account or an address
reaches `LOGIN_FAILURE_LIMIT` (settings: `AXES_*`). The callables here are named in settings;
`record_lockout` puts each lockout in the audit log (tenant-less, as `user.signup` is).
"""
from __future__ import annotations

import hashlib
from typing import Any

from axes.signals import user_locked_out
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.dispatch import receiver
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from gpucloud.api.errors import error_body
from gpucloud.lib.http import client_ip
from gpucloud.tenancy.audit import Actor, acting_as, audit_record


def client_address(request: HttpRequest) -> str | None:
    """The address axes counts failures against: the project's one client-address rule
    (`gpucloud.lib.http.client_ip`, which the audit log uses too), so a proxy in front is
    read the same way everywhere."""
    return client_ip(request)


def username_of(request: HttpRequest, credentials: dict[str, Any] | None) -> str | None:
    """The account a sign-in is for. Emails are usernames here, stored lower-case: " Alice@X"
    and "alice@x" are one account, so they are one count."""
    field = "username"
    raw = credentials.get(field) if credentials else request.POST.get(field)
    if not isinstance(raw, str) or not raw.strip():
        return None
    return raw.strip().lower()


def lockout_minutes() -> int:
    return max(1, int(settings.AXES_COOLOFF_TIME.total_seconds() // 60))


def lockout_message() -> str:
    return (f"Too many failed sign-ins for this account or from this address. Try again in "
            f"{lockout_minutes()} minutes, or reset your password.")


def lockout_response(request: HttpRequest, original_response: HttpResponse | None = None,
                     credentials: dict[str, Any] | None = None) -> HttpResponse:
    """429 while locked out: the API's error shape under /api/, a page for people elsewhere.
    The password is not checked at all while locked, right or wrong."""
    retry_after = str(int(settings.AXES_COOLOFF_TIME.total_seconds()))
    if request.path.startswith("/api/"):
        response: HttpResponse = JsonResponse(error_body("locked_out", lockout_message()), status=429)
    else:
        response = render(request, "frontend/locked_out.html",
                          {"minutes": lockout_minutes(), "message": lockout_message()}, status=429)
    response["Retry-After"] = retry_after
    return response


@receiver(user_locked_out)
def record_lockout(sender: Any, request: HttpRequest, username: str | None = None,
                   ip_address: str | None = None, **kwargs: Any) -> None:
    """One `auth.lockout` audit event per account and address per lockout: axes signals every
    refused attempt, and a client knocking 1,000 times must not write 1,000 events."""
    seen = hashlib.sha256(f"{username}\0{ip_address}".encode()).hexdigest()
    if not cache.add(f"axes-audited:{seen}", 1, timeout=int(settings.AXES_COOLOFF_TIME.total_seconds())):
        return
    user = get_user_model().objects.filter(username=username).first() if username else None
    with acting_as(Actor(ip=ip_address)):
        audit_record(
            tenant=None, action="auth.lockout", object_type="user",
            object_id=str(user.pk) if user else "", object_repr=(username or "")[:200],
            data={"path": request.path, "failure_limit": settings.AXES_FAILURE_LIMIT,
                  "minutes": lockout_minutes()},
        )
