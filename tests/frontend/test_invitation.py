"""An invitation link, end to end in a real browser: its token never travels in a URL.

Access logs, the sign-in page's `?next=` and Referer headers keep URLs; the link carries the
token after "#", which the browser never sends, and the page POSTs it from the form.
"""
from __future__ import annotations

import re
from urllib.parse import quote

from playwright.sync_api import expect

from gpucloud.tenancy.models import Membership
from tests.frontend.conftest import sign_in


def test_an_invitation_link_joins_a_tenant_without_the_token_in_any_url(page, browser, live_server, alice,
                                                                         charlie):
    seen: list[str] = []

    def record(request):
        seen.append(request.url)
        seen.append(request.headers.get("referer", ""))

    # alice invites charlie and copies the link the members page shows once
    sign_in(page, alice.user, live_server.url)
    page.on("request", record)
    page.goto("/console/settings/members/")
    page.get_by_label("Email").fill("charlie@globex.test")
    page.get_by_role("button", name="Invite").click()
    token = page.locator("code.secret").inner_text().strip()
    link = page.locator("#invitation-link").inner_text().strip()
    assert token.startswith("inv_") and link.endswith(f"#token={quote(token)}")

    # charlie, signed out in a browser of his own, opens it, signs in, and joins
    context = browser.new_context(base_url=live_server.url)
    context.set_default_timeout(15_000)
    tab = context.new_page()
    tab.on("request", record)
    tab.goto(link)
    expect(tab).to_have_url(re.compile(r"/console/invitations/accept/$"))  # the token is off the address bar
    tab.get_by_role("link", name="Sign in").click()
    tab.get_by_label("E-mail").fill("charlie@globex.test")
    tab.get_by_label("Password").fill("correct horse battery")
    tab.get_by_role("button", name="Sign in").click()
    expect(tab.get_by_label("Invitation token")).to_have_value(token)
    tab.get_by_role("button", name="Join").click()
    expect(tab.get_by_role("heading", name="Acme", level=1)).to_be_visible()
    context.close()

    assert Membership.objects.filter(tenant=alice.tenant, user=charlie.user, role="member").exists()
    assert len(seen) > 10
    assert [u for u in seen if token in u or quote(token) in u] == []
