"""Which key scope each API route needs, per method: the one table, enforced for every key.

An API key is narrowed twice (gpucloud/tenancy/permissions.py explains both): by
permission, inside a tenant-scoped view, and here, per route and method, before any
handler runs (`ApiView.check_permissions`, after the view's permission classes, so a
role's refusal is still told as one). This layer is what keeps a `read` key from
every change, also on the routes whose permission is decided per object (leaving a
tenant, revoking one's own key) or that are not tenant-scoped at all (accepting an
invitation): an unsafe method needs `write` at least, everywhere.

`tests/api/test_scopes.py` walks every route under /api/ and fails when one of its
methods has no row here, then calls each row with a `read`, a `write` and an `admin`
key of an owner and checks the table is what the API does. A route or method missing
from the table fails closed: reads need `read`, anything else `admin`.

Browser sessions are not narrowed by scopes: they act with their role's permissions.
"""
from __future__ import annotations

from rest_framework import exceptions
from rest_framework.request import Request

from gpucloud.tenancy.choices import Scope
from gpucloud.tenancy.permissions import SAFE_METHODS, scope_for_method, scopes_allow

READ, WRITE, ADMIN = Scope.READ, Scope.WRITE, Scope.ADMIN
# The route does not authenticate API keys (or answers 404 to everything): a key
# there acts as nobody, so there is no scope to need.
NO_KEY = None
ANY_METHOD = "*"

# (URL name, method) -> the least scope a key needs. Methods are upper case; HEAD
# follows GET and OPTIONS needs `read`.
ROUTE_SCOPES: dict[tuple[str, str], str | None] = {
    # --- the tenant, members, invitations
    ("tenant", "GET"): READ,
    ("tenant", "PATCH"): ADMIN,  # tenant.manage
    ("my-tenants", "GET"): READ,
    ("member-list", "GET"): READ,
    ("member-detail", "GET"): READ,
    ("member-detail", "PATCH"): ADMIN,  # members.manage
    # Leaving (removing oneself, members.leave); removing anybody else also needs
    # members.manage, an admin-scope permission.
    ("member-detail", "DELETE"): WRITE,
    ("invitation-list", "GET"): READ,
    ("invitation-list", "POST"): ADMIN,  # members.manage
    ("invitation-detail", "GET"): READ,
    ("invitation-detail", "DELETE"): ADMIN,  # members.manage
    ("invitation-accept", "POST"): WRITE,  # joins a tenant: not tenant-scoped, so only this row
    # --- API keys: one's own may be revoked with `write` (api_keys.revoke); anybody
    # else's also needs api_keys.manage, an admin-scope permission.
    ("api-key-list", "GET"): READ,
    ("api-key-list", "POST"): WRITE,  # api_keys.create
    ("api-key-detail", "GET"): READ,
    ("api-key-detail", "DELETE"): WRITE,
    ("api-key-revoke", "POST"): WRITE,
    ("audit-event-list", "GET"): READ,
    ("audit-event-detail", "GET"): READ,
    # --- workloads
    ("instance-list", "GET"): READ,
    ("instance-list", "POST"): WRITE,  # workloads.launch
    ("instance-detail", "GET"): READ,
    ("instance-detail", "DELETE"): WRITE,  # workloads.manage
    ("instance-stop", "POST"): WRITE,
    ("instance-start", "POST"): WRITE,  # workloads.manage
    ("instance-metrics", "GET"): READ,
    ("instance-logs", "GET"): READ,
    ("job-list", "GET"): READ,
    ("job-list", "POST"): WRITE,
    ("job-detail", "GET"): READ,
    ("job-detail", "DELETE"): WRITE,
    ("job-stop", "POST"): WRITE,
    ("job-metrics", "GET"): READ,
    ("job-logs", "GET"): READ,
    ("job-array-list", "GET"): READ,
    ("job-array-detail", "GET"): READ,
    ("job-array-stop", "POST"): WRITE,  # workloads.manage: stops every task
    ("metrics", "GET"): READ,  # one series of one of the tenant's workloads
    # --- autoscaling groups, their policies and scheduled actions (create/update: workloads.launch,
    # delete and member protection: workloads.manage)
    ("autoscaling-group-list", "GET"): READ,
    ("autoscaling-group-list", "POST"): WRITE,
    ("autoscaling-group-detail", "GET"): READ,
    ("autoscaling-group-detail", "PATCH"): WRITE,
    ("autoscaling-group-detail", "DELETE"): WRITE,
    ("autoscaling-group-activities", "GET"): READ,
    ("autoscaling-group-protection", "POST"): WRITE,
    ("scaling-policy-list", "GET"): READ,
    ("scaling-policy-list", "POST"): WRITE,
    ("scaling-policy-detail", "GET"): READ,
    ("scaling-policy-detail", "PATCH"): WRITE,
    ("scaling-policy-detail", "DELETE"): WRITE,
    ("scheduled-action-list", "GET"): READ,
    ("scheduled-action-list", "POST"): WRITE,
    ("scheduled-action-detail", "GET"): READ,
    ("scheduled-action-detail", "PATCH"): WRITE,
    ("scheduled-action-detail", "DELETE"): WRITE,
    # --- volumes (workloads.read / launch / manage)
    ("volume-list", "GET"): READ,
    ("volume-list", "POST"): WRITE,
    ("volume-detail", "GET"): READ,
    ("volume-detail", "PATCH"): WRITE,
    ("volume-detail", "DELETE"): WRITE,
    # --- one's own SSH public keys (ssh_keys.manage: write)
    ("ssh-key-list", "GET"): READ,
    ("ssh-key-list", "POST"): WRITE,
    ("ssh-key-detail", "GET"): READ,
    ("ssh-key-detail", "DELETE"): WRITE,
    # --- catalogue (public) and quotas
    ("region-list", "GET"): READ,
    ("region-detail", "GET"): READ,
    ("gpu-model-list", "GET"): READ,
    ("gpu-model-detail", "GET"): READ,
    ("instance-type-list", "GET"): READ,
    ("instance-type-detail", "GET"): READ,
    ("price-list", "GET"): READ,
    ("price-detail", "GET"): READ,
    ("quotas", "GET"): READ,
    ("availability", "GET"): READ,  # what the tenant could start now (workloads.read)
    # --- billing
    ("spot-price-list", "GET"): READ,
    ("balance", "GET"): READ,
    ("usage", "GET"): READ,
    ("ledger-entry-list", "GET"): READ,
    ("ledger-entry-detail", "GET"): READ,
    ("invoice-list", "GET"): READ,
    ("invoice-detail", "GET"): READ,
    ("budget-list", "GET"): READ,
    ("budget-list", "POST"): ADMIN,  # billing.manage
    ("budget-detail", "GET"): READ,
    ("budget-detail", "PUT"): ADMIN,
    ("budget-detail", "PATCH"): ADMIN,
    ("budget-detail", "DELETE"): ADMIN,
    # --- notifications: the caller's own inbox and choices (any member; changing them needs write)
    ("notification-list", "GET"): READ,
    ("notification-detail", "GET"): READ,
    ("notification-read", "POST"): WRITE,
    ("notification-settings", "GET"): READ,
    ("notification-settings", "PUT"): WRITE,
    # --- alarms (workloads.read / workloads.manage: an alarm may stop a workload)
    ("alarm-list", "GET"): READ,
    ("alarm-list", "POST"): WRITE,
    ("alarm-detail", "GET"): READ,
    ("alarm-detail", "PUT"): WRITE,
    ("alarm-detail", "PATCH"): WRITE,
    ("alarm-detail", "DELETE"): WRITE,
    ("alarm-history", "GET"): READ,
    # --- the schema and its browser
    ("schema", "GET"): READ,
    ("api-docs", "GET"): READ,
    # --- routes where a key is no authentication
    ("signup", "POST"): NO_KEY,  # authentication_classes = []: it creates a new account
    ("rest_framework:login", "GET"): NO_KEY,  # Django's session login forms (the
    ("rest_framework:login", "POST"): NO_KEY,  # browsable API's); Django views, which
    ("rest_framework:login", "PUT"): NO_KEY,  # never look at an Authorization header
    ("rest_framework:logout", "POST"): NO_KEY,
    ("payments-webhook", "POST"): NO_KEY,  # the payment provider's signed calls (billing)
    ("api-not-found", ANY_METHOD): NO_KEY,  # unknown paths: 404 for everybody
}


def required_scope(route: str | None, method: str) -> str | None:
    """The least scope a key needs for `method` on the route named `route`."""
    method = method.upper()
    lookup = "GET" if method == "HEAD" else method
    for key in ((route, lookup), (route, ANY_METHOD)):
        if key in ROUTE_SCOPES:
            return ROUTE_SCOPES[key]
    return READ if method in SAFE_METHODS else ADMIN  # not in the table: fail closed


def check_key_scope(request: Request) -> None:
    """Refuse (403 insufficient_scope) a request whose API key lacks the route's scope.

    Call after authentication. A browser session passes: it is not narrowed by scopes.
    """
    key = getattr(request, "api_key", None)
    if key is None:
        return
    match = request.resolver_match
    route = match.view_name if match is not None else None
    # A NO_KEY row that did authenticate a key (a view changed, the table did not)
    # still gets the rule of its method: unsafe methods need `write`.
    needed = required_scope(route, request.method) or scope_for_method(request.method)
    if not scopes_allow(scopes=key.scopes, needed=needed):
        raise exceptions.PermissionDenied(
            f"This API key's scopes ({', '.join(key.scopes)}) do not allow "
            f"{request.method} here; it needs the {needed} scope.",
            code="insufficient_scope",
        )
