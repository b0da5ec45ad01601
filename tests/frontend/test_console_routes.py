"""Every console route, by class: what it declares, and that it does what it declares.

Each console view carries `console_access` (frontend.console.Access), set by `console_view`,
`console_action` or `account_view`. `test_every_console_route_declares_its_methods` walks the
URL resolver: a new route under /console/ that declares nothing fails it, and so does a new
account page (which needs no tenant permission) not named in ACCOUNT_ROUTES.

The sweep then calls every route against one world (an owner, a viewer, a row for each
route's `pk`), each request in a savepoint rolled back after it:
  * a route that changes state without a page of its own (an action) answers GET and HEAD
    with 405, for the owner too, and changes nothing;
  * every route that accepts a POST refuses a viewer with 403 and changes nothing, unless the
    matrix lets a viewer do it (VIEWER_MAY says which and why);
  * every POST without the CSRF token, from another site with the owner's cookie, is refused
    with 403 and changes nothing;
  * a GET changes nothing on any route (a page only shows).
The issue 27 reproductions (a viewer's GET on each action that used to run, the owner's
cross-site link to terminate) are in test_console_probe_findings.py.
"""
from __future__ import annotations

import pytest
from django.urls import URLPattern

from frontend.console import Access
from gpucloud.tenancy import permissions as perms
from gpucloud.tenancy.choices import Role
from tests.api.test_scopes import _snapshot_sql
from tests.frontend.console_world import CROSS_SITE, _call, _signed_in, _url, console_routes, world  # noqa: F401

pytestmark = pytest.mark.django_db

# Pages for a user before (or beside) any tenant: guarded by what they ask for (a password, a
# mailed token, the session's own user), not by a role. A new one must be named here, so a
# tenant route cannot slip out of the permission checks by declaring itself an account page.
ACCOUNT_ROUTES = {
    "login", "signin_code", "signup", "verify_email", "verify_email_resend", "password_reset",
    "password_reset_done", "password_reset_confirm", "password_reset_complete", "security", "logout",
    "invitation_accept", "session",
}

# Routes that accept a viewer's POST, because the matrix gives every member that permission.
VIEWER_MAY = {
    "tenant_switch": "switching tenant changes only the viewer's own session",
    "ssh_keys": "SSH keys are personal: a viewer keeps their own (they may not connect with them)",
    "ssh_key_delete": "a viewer removes their own SSH keys (another's is not theirs to find: 404)",
    "inbox": "marking one's own notifications read changes nothing of the tenant's",
    "notification_settings": "what one is told of, and how, is one's own choice",
}


def access(pattern: URLPattern) -> Access | None:
    return getattr(pattern.callback, "console_access", None)


def test_every_console_route_declares_its_methods():
    routes = console_routes()
    assert len(routes) >= 50, "the walk found the console"
    undeclared = [name for name, p in routes if access(p) is None]
    assert undeclared == [], "wrap these in console_view / console_action / account_view"
    accounts = {name for name, p in routes if not access(p).tenant}
    assert accounts == ACCOUNT_ROUTES, "a tenant route must check its permissions (console_view/console_action)"
    exempt = [name for name, p in routes if getattr(p.callback, "csrf_exempt", False)]
    assert exempt == [], "no console route is exempt from the CSRF check"


def test_no_console_change_hides_behind_a_read_permission():
    """A POST needs a permission that is not a `.read` one (the API's rule in test_scopes), but
    for switching tenant, which changes only the session."""
    for name, p in console_routes():
        a = access(p)
        if a.tenant and a.write is not None and name != "tenant_switch":
            assert not a.write.endswith(".read"), (name, a.write)


def test_every_action_route_is_post_only():
    """The routes whose name says they change something have no GET at all."""
    verbs = ("_stop", "_start", "_terminate", "_delete", "_revoke", "_remove", "_role", "_scale", "_protect",
             "_schedule", "_switch", "_create", "logout", "_resend")
    actions = [(name, access(p)) for name, p in console_routes() if name.endswith(verbs)]
    assert len(actions) >= 20
    for name, a in actions:
        if name in ("group_create", "job_array_create"):  # form pages: GET shows the form
            continue
        assert a.read is None and a.write is not None, name


# ---------------------------------------------------------------- the sweep


def test_every_console_route_keeps_its_declaration(world):
    sql = _snapshot_sql()
    owner, viewer = _signed_in(world.alice), _signed_in(world.victor)
    owner_csrf = _signed_in(world.alice, csrf=True)
    viewer_perms = perms.ROLE_PERMISSIONS[Role.VIEWER]
    failures: list[tuple] = []
    checked = {"action_get": 0, "viewer_post": 0, "csrf": 0, "get": 0}
    for name, pattern in console_routes():
        a = access(pattern)
        url = _url(name, pattern, world.pks)
        if a.read is None:  # an action: no GET, for anybody
            for method in ("GET", "HEAD"):
                resp, changed = _call(owner, method, url, sql)
                if resp.status_code != 405 or changed:
                    failures.append((name, f"owner {method}", resp.status_code, changed))
            checked["action_get"] += 1
        elif a.tenant or name != "verify_email":  # the mailed link is the one GET that acts, by its token
            resp, changed = _call(owner, "GET", url, sql)
            if resp.status_code >= 500 or changed:
                failures.append((name, "owner GET", resp.status_code, changed))
            checked["get"] += 1
        if a.write is None:
            resp, changed = _call(owner, "POST", url, sql)
            if resp.status_code != 405 or changed:
                failures.append((name, "owner POST to a read-only route", resp.status_code, changed))
            continue
        resp, changed = _call(owner_csrf, "POST", url, sql, **CROSS_SITE)
        if resp.status_code != 403 or changed or b"CSRF" not in resp.content:
            failures.append((name, "cross-site POST without a CSRF token", resp.status_code, changed))
        checked["csrf"] += 1
        if a.tenant and name not in VIEWER_MAY:
            resp, changed = _call(viewer, "POST", url, sql)
            if resp.status_code != 403 or changed:
                failures.append((name, "viewer POST", resp.status_code, changed))
            checked["viewer_post"] += 1
        elif a.tenant:
            assert a.write in viewer_perms, (name, "VIEWER_MAY names a route a viewer may not use")
    assert failures == []
    # the walk reached them all (today: 21 actions, 24 viewer refusals, 36 POST routes, 38 GETs)
    assert checked["action_get"] >= 21 and checked["viewer_post"] >= 24, checked
    assert checked["csrf"] >= 36 and checked["get"] >= 38, checked
