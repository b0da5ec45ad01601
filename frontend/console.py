"""The console's one gate: who is signed in, which tenant they act for, what they may do.

Every console view is wrapped in `console_view(read=..., write=...)`. It resolves the
membership exactly as the API does for a browser session (`gpucloud.api.views.resolve_tenant`:
the tenant kept in the session, else the user's first), computes the effective
permissions from the one matrix (`gpucloud.tenancy.permissions`), refuses what the role
does not allow with a 403 that says why, and sets the audit actor (user and source IP)
for the services the view calls, the way the API base view does.

Templates never decide who may do what: they read `console.can_launch`, `console.can_manage`
and friends, computed here from the matrix.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property, wraps
from typing import Any
from urllib.parse import urlsplit

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_http_methods
from rest_framework.exceptions import NotFound

from gpucloud.api.views import resolve_tenant
from gpucloud.lib.errors import ServiceError
from gpucloud.lib.http import client_ip
from gpucloud.tenancy import permissions as perms
from gpucloud.tenancy.audit import Actor, reset_actor, set_actor
from gpucloud.tenancy.models import Membership, Tenant
from gpucloud.tenancy.selectors import member_permissions, membership_list_for_user
from notifications.selectors import notification_unread_count

SAFE_METHODS = ("GET", "HEAD")


@dataclass(frozen=True)
class Console:
    """What a console page knows about the actor: passed to every template as `console`."""

    membership: Membership
    granted: frozenset[str]
    memberships: list[Membership]

    @property
    def tenant(self) -> Tenant:
        return self.membership.tenant

    def can(self, permission: str) -> bool:
        return permission in self.granted

    # Flags for templates, straight from the matrix.
    @property
    def can_launch(self) -> bool:
        return self.can(perms.WORKLOADS_LAUNCH)

    @property
    def can_manage(self) -> bool:
        return self.can(perms.WORKLOADS_MANAGE)

    @property
    def can_connect(self) -> bool:
        return self.can(perms.WORKLOADS_CONNECT)

    @property
    def can_create_keys(self) -> bool:
        return self.can(perms.API_KEYS_CREATE)

    @property
    def can_manage_keys(self) -> bool:
        return self.can(perms.API_KEYS_MANAGE)

    @property
    def can_manage_members(self) -> bool:
        return self.can(perms.MEMBERS_MANAGE)

    @property
    def can_manage_billing(self) -> bool:
        return self.can(perms.BILLING_MANAGE)

    @cached_property
    def unread(self) -> int:
        """The actor's unread notifications in this tenant (the nav's badge): one COUNT, on pages
        that render the nav only."""
        return notification_unread_count(user=self.membership.user, tenant=self.tenant)


def refusal(console: Console, permission: str) -> str:
    """The sentence a refused action shows: the same reasons the API gives."""
    if console.tenant.is_suspended and permission in perms.SUSPENDED_DENIED:
        return "This tenant is suspended: it can read and stop work, but not launch."
    return f"Your role ({console.membership.role}) does not allow {permission}."


def is_background(request: HttpRequest) -> bool:
    """A request the page made on its own (an htmx poll or swap, a script's fetch), not a
    person's navigation: its answer lands inside the page, never as a page of its own."""
    return request.headers.get("HX-Request") == "true" or request.headers.get("Sec-Fetch-Mode") == "cors"


def signed_out(request: HttpRequest) -> HttpResponse:
    """The answer to a request whose session is gone (expired, signed out elsewhere).

    A background request gets a bare 401 that the page's script turns into one "signed out"
    banner (a redirect would be followed by htmx and drop the whole sign-in page into a status
    card). A form posted after expiry sends the person to sign in and then back to the page the
    form was on, not to the action's URL (a GET there is refused); console.js keeps what was typed.
    """
    if is_background(request):
        return HttpResponse(status=401, headers={"HX-Reswap": "none", "Cache-Control": "no-store"})
    back = request.get_full_path()
    if request.method not in SAFE_METHODS:
        referer = request.headers.get("Referer", "")
        ok = url_has_allowed_host_and_scheme(referer, allowed_hosts={request.get_host()},
                                             require_https=request.is_secure())
        back = urlsplit(referer)._replace(scheme="", netloc="").geturl() if ok and referer else reverse(
            "console:dashboard")
    return redirect_to_login(back, reverse("console:login"))


@dataclass(frozen=True)
class Access:
    """What a console route declares about itself, kept on the view as `console_access`.

    `read`: the permission a GET (or HEAD) needs; None: the route answers GET with 405, because
    a GET must never change anything (a link, an <img>, a prefetch or another site's top-level
    navigation can make one, and the session cookie is `SameSite=Lax`).
    `write`: the permission a POST needs; None: POST is a 405. A POST passes Django's CSRF check
    first (the middleware; no console view is exempt).
    `tenant`: False for the account pages (sign-in, sign-up, password reset, ...), which act for
    a user before any tenant and are guarded by what they ask for (a password, a mailed token);
    their `read`/`write` are NO_PERMISSION where they take that method.

    tests/frontend/test_console_routes.py walks every console route and fails on one that
    declares nothing, and checks each declaration against what the route does.
    """

    read: str | None
    write: str | None
    tenant: bool = True

    @property
    def methods(self) -> list[str]:
        return (["GET", "HEAD"] if self.read is not None else []) + (["POST"] if self.write is not None else [])


NO_PERMISSION = ""  # an account page's method: no tenant permission applies


def _declare(view: Callable, access: Access) -> Callable:
    view.console_access = access  # type: ignore[attr-defined]
    return view


def console_view(*, read: str | None = perms.TENANT_READ, write: str | None = None) -> Callable:
    """Wrap a console view: method, sign-in, tenant, permission (`read` for GET, `write` for POST), audit actor.

    A view without `write` answers 405 to a POST, one without `read` (a `console_action`) 405 to
    a GET: forgetting to declare a permission denies.
    """
    access = Access(read=read, write=write)

    def decorate(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            # The method first: an action answers a GET with 405 whoever asks, signed in or not.
            if request.method in SAFE_METHODS and read is not None:
                required = read
            elif request.method == "POST" and write is not None:
                required = write
            else:
                return HttpResponseNotAllowed(access.methods)
            if not request.user.is_authenticated:
                return signed_out(request)
            memberships = list(membership_list_for_user(user=request.user))
            try:
                membership = resolve_tenant(request)
            except NotFound:
                # An X-Tenant header naming a tenant that is not among the user's.
                raise Http404("No such tenant among yours.") from None
            if membership is None:
                if request.user.is_staff and request.method in SAFE_METHODS:
                    return redirect("admin-fleet")  # an operator without a tenant: the fleet page
                return render(request, "frontend/no_tenant.html", status=403)
            granted = member_permissions(membership=membership)  # the one rule of every face
            console = Console(membership=membership, granted=granted, memberships=memberships)
            request.console = console  # type: ignore[attr-defined]
            if required not in granted:
                raise PermissionDenied(refusal(console, required))
            token = set_actor(Actor(user=request.user, ip=client_ip(request)))
            try:
                return view(request, *args, **kwargs)
            finally:
                reset_actor(token)

        return _declare(wrapper, access)

    return decorate


def console_action(*, write: str) -> Callable:
    """A console route that changes something (stop, delete, revoke, ...): POST only, with the
    CSRF token, by a member holding `write`; a GET is a 405 and changes nothing."""
    return console_view(read=None, write=write)


def account_view(*, methods: tuple[str, ...]) -> Callable:
    """An account page (no tenant yet): only `methods`; a POST passes the CSRF check like any other."""
    access = Access(read=NO_PERMISSION if "GET" in methods else None,
                    write=NO_PERMISSION if "POST" in methods else None, tenant=False)

    def decorate(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        allowed = require_http_methods([*methods, *(["HEAD"] if "GET" in methods else [])])(view)
        return _declare(allowed, access)

    return decorate


@account_view(methods=("GET",))
def session_probe(request: HttpRequest) -> HttpResponse:
    """GET /console/session: 204 while signed in, 401 once not. console.js asks before it
    submits a form, so what was typed is kept instead of lost to an expired session."""
    return HttpResponse(status=204 if request.user.is_authenticated else 401, headers={"Cache-Control": "no-store"})


def flatten_errors(detail: Any) -> list[str]:
    """DRF/service error details (nested lists and dicts) -> plain sentences."""
    if isinstance(detail, dict):
        out: list[str] = []
        for key, value in detail.items():
            for msg in flatten_errors(value):
                out.append(f"item {int(key) + 1}: {msg}" if str(key).isdigit() else msg)
        return out
    if isinstance(detail, list | tuple):
        return [m for d in detail for m in flatten_errors(d)]
    return [str(detail)]


def apply_errors(form, fields: dict[str, Any], message: str = "", field_map: dict[str, str] | None = None) -> None:
    """Put an API-shaped error (`message`, `fields`) onto a Django form, field by field.

    The console shows the same messages the API returns; a field the form does not have
    (or `message` alone) becomes a form-wide error.
    """
    field_map = field_map or {}
    shown: set[str] = set()
    for name, msgs in (fields or {}).items():
        target = field_map.get(name, name)
        texts = flatten_errors(msgs)
        shown.update(texts)
        if target in form.fields:
            form.add_error(target, texts)
        else:
            form.add_error(None, [f"{name}: {t}" for t in texts])
    # "Invalid input in: a, b." only repeats the field errors; any other sentence says more.
    if message and message not in shown and not message.startswith("Invalid input in"):
        form.add_error(None, message)


def service_error_to_form(form, exc: ServiceError, field_map: dict[str, str] | None = None) -> None:
    apply_errors(form, exc.fields, exc.message, field_map)
