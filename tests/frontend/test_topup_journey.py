"""Add credit in a browser (issue 28, deliverable 6): a renter files a top-up from the usage page
at 1280 and at 375 px, an operator approves each in the admin (twice: it still credits once),
and the renter's balance rises once per top-up. The same page shows what the renter's volume
costs (deliverable 5)."""
from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone
from playwright.sync_api import expect

from billing import services
from billing.choices import EntryKind
from billing.models import Account, LedgerEntry, TopUp
from tests.billing.helpers import make_volume, set_storage_price
from tests.frontend.conftest import DESKTOP, horizontal_overflow, shot, sign_in

PASSWORD = "correct horse battery"


def services_storage_amount(actor) -> Decimal:
    from billing.selectors import storage_usage

    return storage_usage(tenant=actor.tenant, start=services.month_began(timezone.now()),
                         end=timezone.now() + timedelta(seconds=1)).amount


def approve(ops, topup: TopUp) -> str:
    ops.goto("/admin/billing/topup/")
    ops.check(f'input[name="_selected_action"][value="{topup.pk}"]')
    ops.select_option("select[name=action]", "approve")
    ops.click('button[name="index"]')
    messages = ops.locator("ul.messagelist")
    expect(messages).to_be_visible()
    return messages.inner_text()


@pytest.mark.django_db(transaction=True)
def test_a_top_up_approved_by_an_operator_raises_the_balance_once(browser, page, phone, live_server, alice,
                                                                   catalog):
    get_user_model().objects.create_superuser("ops@gpucloud.test", "ops@gpucloud.test", PASSWORD)
    context = browser.new_context(viewport=DESKTOP, base_url=live_server.url)
    context.set_default_timeout(15_000)
    ops = context.new_page()
    ops.goto("/admin/")
    ops.fill("#id_username", "ops@gpucloud.test")
    ops.fill("#id_password", PASSWORD)
    ops.click("input[type=submit]")
    expect(ops.locator("#site-name")).to_contain_text("gpucloud operators")

    now = timezone.now().replace(microsecond=0)
    set_storage_price("0.0100", since=now - timedelta(days=1))
    make_volume(alice, sizes=[(now - timedelta(hours=2), 50)], name="datasets")
    services.metering_run(now=now)  # about two hours of 50 GiB at 0.01: 0.99 posted
    storage = services_storage_amount(alice)
    assert storage > 0
    start = Account.objects.get(tenant=alice.tenant).balance
    for n, (screen, name) in enumerate(((page, "desktop"), (phone, "phone")), start=1):
        sign_in(screen, alice.user, live_server.url)
        screen.goto("/console/usage/")
        expect(screen.locator("#storage-amount")).to_have_text(f"{storage:.2f}")
        expect(screen.locator("#storage-volumes")).to_contain_text("datasets")
        screen.click("#add-credit-link")
        screen.fill("#id_amount", "25")
        screen.click("#topup-submit")
        expect(screen.locator("body")).to_contain_text("Top-up of 25.00 USD requested")
        expect(screen.locator("#topups")).to_contain_text("an operator approves it")
        assert horizontal_overflow(screen) == [], name
        shot(screen, f"topup-requested-{name}")
        topup = TopUp.objects.filter(tenant=alice.tenant, status="requested").get()

        assert "Credited the top-ups of" in approve(ops, topup)
        assert "already paid: nothing changed" in approve(ops, topup)  # a second approval

        screen.reload()
        expected = start + 25 * n
        expect(screen.locator("#balance")).to_contain_text(f"{expected:.2f}")
        expect(screen.locator("#topups")).to_contain_text("Paid")
        shot(screen, f"topup-paid-{name}")
    assert Account.objects.get(tenant=alice.tenant).balance == start + Decimal(50)
    assert LedgerEntry.objects.filter(tenant=alice.tenant, kind=EntryKind.PAYMENT).count() == 2
    context.close()
