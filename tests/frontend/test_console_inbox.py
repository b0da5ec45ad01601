"""The console's inbox and notification settings in Chromium, at 1280 and 375 px (issue 28,
deliverable 7): a failed instance shows in the inbox with the nav's unread badge, its e-mail
goes where the page says (the demo's console backend prints it in the server's terminal), and
a person changes what they are told of."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from notifications import services
from notifications.models import Notification
from scheduler.choices import State
from scheduler.services import workload_transition
from tests.agents.test_agent_api import place
from tests.frontend.conftest import DESKTOP, PHONE, horizontal_overflow, shot, sign_in
from tests.scheduler.fleet import make_hosts

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["1280", "375"])
def test_a_failure_reaches_the_inbox_and_the_demos_email_output(page, live_server, alice, catalog, settings,
                                                                capsys, viewport):
    settings.EMAIL_BACKEND = "django.core.mail.backends.console.EmailBackend"  # the demo's
    page.set_viewport_size(viewport)
    [host] = make_hosts(n=1)
    services.notifications_collect(now=timezone.now())
    w = place(host, alice.tenant)
    for to, why in ((State.STARTING, "container starting"), (State.RUNNING, "container running"),
                    (State.FAILED, "container exited with code 137")):
        workload_transition(workload=w, to=to, reason=why)
    services.notifications_collect(now=timezone.now() + timedelta(seconds=60))
    capsys.readouterr()
    assert services.notifications_deliver()["email"] == 1
    printed = capsys.readouterr().out
    assert f"Instance {w.name} failed" in printed and alice.user.email in printed

    sign_in(page, alice.user, live_server.url)
    page.goto("/console/")
    expect(page.locator("#unread-count")).to_have_text("2")
    page.locator("nav.main a", has_text="Inbox").click()
    page.wait_for_url("**/console/inbox/")
    failed = page.locator(".inbox-item[data-event='instance.failed']")
    expect(failed).to_contain_text(f"Instance {w.name} failed")
    expect(failed).to_contain_text("e-mailed")
    expect(page.locator("main")).to_contain_text("printed in the terminal")
    assert horizontal_overflow(page) == []
    shot(page, f"inbox-{viewport['width']}")
    failed.get_by_role("button", name="Mark read").click()
    expect(page.locator(".inbox-item.unread")).to_have_count(1)
    assert Notification.objects.filter(read_at__isnull=False).count() == 1
    expect(page.locator("#unread-count")).to_have_text("1")

    # what I am told of: e-mail me when instances start, too
    page.goto("/console/settings/notifications/")
    page.locator("input[name='ch:instance.running'][value=email]").check()
    page.get_by_role("button", name="Save").click()
    expect(page.locator(".messages")).to_contain_text("Saved")
    expect(page.locator("input[name='ch:instance.running'][value=email]")).to_be_checked()
    assert horizontal_overflow(page) == []
    shot(page, f"notification-settings-{viewport['width']}")
