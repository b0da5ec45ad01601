"""Open sign-up hands out nothing unchecked: the sign-up credit waits for the emailed link,
comes once, the operator can close sign-up, and one address signs up only so often.
Password reset by email. Mail goes through Django's locmem backend in tests (mail.outbox).
"""
from __future__ import annotations

import re
import threading
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.core import mail, signing
from django.db import connection
from django.test import Client
from rest_framework.test import APIClient

from billing.choices import EntryKind
from billing.models import Account, LedgerEntry
from gpucloud.tenancy import services
from gpucloud.tenancy.models import AuditEvent, EmailVerification, Tenant

pytestmark = pytest.mark.django_db
User = get_user_model()

LINK = re.compile(r"https?://\S+/console/verify-email/\?token=\S+")


def api_signup(email: str, *, ip: str = "203.0.113.20", tenant_name: str = "Lab"):
    return APIClient().post("/api/v1/auth/signup", {
        "email": email, "password": "a long enough passphrase", "tenant_name": tenant_name,
        "create_api_key": True}, format="json", REMOTE_ADDR=ip)


def console_signup(client: Client, email: str, *, ip: str = "203.0.113.30"):
    return client.post("/console/signup/", {"email": email, "password": "a long passphrase 42",
                                            "tenant_name": "Newco"}, REMOTE_ADDR=ip)


def balance(tenant_id) -> Decimal:
    return Account.objects.get(tenant_id=tenant_id).balance


def link_in_last_mail(to: str) -> str:
    message = mail.outbox[-1]
    assert message.to == [to]
    return LINK.search(message.body).group(0)


def test_signup_credit_comes_only_after_the_emailed_link_and_only_once(settings, fleet):
    settings.BILLING_SIGNUP_CREDIT = Decimal("250.00")
    resp = api_signup("Dana@Example.test")
    assert resp.status_code == 201, resp.json()
    body = resp.json()
    assert body["email_verified"] is False
    tenant_id = body["tenant"]["id"]
    # no credit yet: the balance is zero, so nothing paid launches
    assert balance(tenant_id) == 0
    assert not LedgerEntry.objects.filter(tenant_id=tenant_id, kind=EntryKind.SIGNUP_CREDIT).exists()
    key_client = APIClient()
    key_client.credentials(HTTP_AUTHORIZATION=f"Bearer {body['api_key']}")
    launch = key_client.post("/api/v1/instances", {
        "name": "free-ride", "instance_type": "h100.1x", "region": "us-east-1", "image": "busybox:latest",
        "command": "sleep 1", "billing": "on_demand", "priority": "standard"}, format="json")
    assert launch.status_code == 402 and launch.json()["error"]["code"] == "insufficient_credit"

    link = link_in_last_mail("dana@example.test")
    path = link.split("://", 1)[1].split("/", 1)[1]
    browser = Client()
    first = browser.get("/" + path, REMOTE_ADDR="203.0.113.21")
    assert first.status_code == 302 and "token" not in first["Location"]  # away from the token
    assert balance(tenant_id) == Decimal("250.00")
    assert EmailVerification.objects.get(email="dana@example.test").verified_at is not None
    event = AuditEvent.objects.get(action="user.verify_email")
    assert str(event.tenant_id) == tenant_id and event.source_ip == "203.0.113.21"
    # the second click grants nothing
    again = browser.get("/" + path)
    assert again.status_code == 302
    assert balance(tenant_id) == Decimal("250.00")
    assert LedgerEntry.objects.filter(tenant_id=tenant_id, kind=EntryKind.SIGNUP_CREDIT).count() == 1
    assert key_client.post("/api/v1/instances", {
        "name": "paid", "instance_type": "h100.1x", "region": "us-east-1", "image": "busybox:latest",
        "command": "sleep 1", "billing": "on_demand", "priority": "standard"}, format="json").status_code == 201


@pytest.mark.django_db(transaction=True)
def test_two_clicks_at_once_grant_the_credit_once(settings):
    settings.BILLING_SIGNUP_CREDIT = Decimal("100.00")
    user, tenant = services.user_signup(email="twice@example.test", password="a long enough passphrase",
                                        tenant_name="Twice")
    token = services.email_verification_token(user=user)
    gate = threading.Barrier(2, timeout=10)
    results: list[object] = []

    def click():
        try:
            gate.wait()
            results.append(services.email_verify(token=token)[1])
        except Exception as exc:  # shown by the assertion below
            results.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=click) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert sorted(results) == [False, True]
    assert balance(tenant.pk) == Decimal("100.00")


def test_a_tampered_or_expired_link_grants_nothing(settings):
    user, tenant = services.user_signup(email="t@example.test", password="a long enough passphrase",
                                        tenant_name="T")
    token = services.email_verification_token(user=user)
    bad = Client().get("/console/verify-email/", {"token": token[:-2] + "xx"})
    assert bad.status_code == 400 and "not valid" in bad.content.decode()
    forged = signing.dumps({"u": user.pk, "e": "t@example.test"}, salt="something else", compress=True)
    assert Client().get("/console/verify-email/", {"token": forged}).status_code == 400
    settings.EMAIL_VERIFICATION_TTL_HOURS = 0
    expired = Client().get("/console/verify-email/", {"token": token})
    assert expired.status_code == 400 and "expired" in expired.content.decode()
    assert balance(tenant.pk) == 0


def test_the_console_signup_mails_the_link_and_the_dashboard_says_what_waits(catalog):
    client = Client()
    assert console_signup(client, "new@example.test").status_code == 302
    page = client.get("/console/").content.decode()
    assert "Confirm your email address" in page and "new@example.test" in page
    tenant = Tenant.objects.get(name="Newco")
    assert balance(tenant.pk) == 0
    assert client.post("/console/verify-email/resend").status_code == 302
    assert len(mail.outbox) == 2
    link = link_in_last_mail("new@example.test")
    assert client.get(link.split("testserver", 1)[1]).status_code == 302
    assert balance(tenant.pk) > 0
    assert "Confirm your email address" not in client.get("/console/").content.decode()


def test_demo_and_operator_made_accounts_have_nothing_to_confirm(db):
    from io import StringIO

    from django.core.management import call_command

    call_command("demo_setup", stdout=StringIO())
    demo = User.objects.get(username="demo@gpucloud.local")
    assert not EmailVerification.objects.filter(user=demo).exists()
    tenant = Tenant.objects.get(memberships__user=demo)
    assert balance(tenant.pk) > 0


def test_an_operator_can_close_signup(settings):
    settings.OPEN_SIGNUP = False
    resp = api_signup("closed@example.test")
    assert resp.status_code == 403
    assert resp.json()["error"]["code"] == "signup_closed"
    page = Client().get("/console/signup/")
    assert page.status_code == 200 and "Sign-up is closed" in page.content.decode()
    assert "<form" not in page.content.decode().split("<main", 1)[1].split("Sign-up is closed")[0]
    assert console_signup(Client(), "closed2@example.test").status_code == 403
    assert "Create an account" not in Client().get("/console/signin/").content.decode()
    assert not User.objects.exists()
    assert not mail.outbox


def test_signups_are_limited_per_address_on_the_api_and_the_console_together():
    # SIGNUP_RATE_LIMIT is 10/hour: five through the API and five through the console...
    for i in range(5):
        assert api_signup(f"a{i}@example.test", ip="192.0.2.44", tenant_name=f"A{i}").status_code == 201
    for i in range(5):
        assert console_signup(Client(), f"c{i}@example.test", ip="192.0.2.44").status_code == 302
    # ...and the address has had its share, on either face
    refused = api_signup("a-late@example.test", ip="192.0.2.44")
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "throttled"
    page = console_signup(Client(), "c-late@example.test", ip="192.0.2.44")
    assert page.status_code == 429 and "Too many sign-ups from your address" in page.content.decode()
    assert not User.objects.filter(email__in=["a-late@example.test", "c-late@example.test"]).exists()
    # another address is not affected
    assert api_signup("elsewhere@example.test", ip="192.0.2.45").status_code == 201


def test_password_reset_by_email(alice):
    client = Client()
    page = client.post("/console/password-reset/", {"email": "Alice@Acme.test"})
    assert page.status_code == 302 and page["Location"] == "/console/password-reset/sent/"
    body = mail.outbox[-1].body
    assert mail.outbox[-1].to == ["alice@acme.test"]
    link = re.search(r"http://testserver(/console/password-reset/\S+/)", body).group(1)
    # Django's view puts the token in the session and sends the browser to a URL without it
    step = client.get(link)
    assert step.status_code == 302 and step["Location"].endswith("/set-password/")
    form = client.get(step["Location"])
    assert form.status_code == 200 and "Choose a new password" in form.content.decode()
    done = client.post(step["Location"], {"new_password1": "a brand new passphrase 7",
                                          "new_password2": "a brand new passphrase 7"})
    assert done.status_code == 302 and done["Location"] == "/console/password-reset/done/"
    assert Client().post("/console/signin/", {"username": "alice@acme.test",
                                              "password": "correct horse battery"}).status_code == 200
    fresh = Client()
    assert fresh.post("/console/signin/", {"username": "alice@acme.test",
                                           "password": "a brand new passphrase 7"}).status_code == 302
    assert fresh.get("/console/").status_code == 200
    # the link works once
    assert "not valid any more" in Client().get(link, follow=True).content.decode()
    # an unknown address gets the same answer, and no mail
    count = len(mail.outbox)
    assert client.post("/console/password-reset/", {"email": "nobody@acme.test"}).status_code == 302
    assert len(mail.outbox) == count
