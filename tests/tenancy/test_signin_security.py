"""Brute force and the second factor on every way in: the console's sign-in, the browsable
API's /api/auth/login/ and the admin's /admin/login/ (django-axes locks, django-otp asks
for a TOTP code). Codes are computed as an authenticator app would: django_otp's TOTP over
the device's key.
"""
from __future__ import annotations

import time

import pytest
from axes.models import AccessAttempt
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse
from django_otp.oath import TOTP
from django_otp.plugins.otp_totp.models import TOTPDevice

from gpucloud.tenancy.models import AuditEvent

pytestmark = pytest.mark.django_db
User = get_user_model()

PASSWORD = "correct horse battery"
# path -> (where a successful sign-in goes, whether the user must be staff)
PATHS = {
    "/console/signin/": "/console/",
    "/api/auth/login/": "/console/",
    "/admin/login/": "/admin/",
}


def make(email: str, *, staff: bool = False):
    user = User.objects.create_user(username=email, email=email, password=PASSWORD)
    if staff:
        User.objects.filter(pk=user.pk).update(is_staff=True, is_superuser=True)
    return user


def sign_in(client: Client, path: str, username: str, password: str, *, ip: str = "203.0.113.9", **extra):
    data = {"username": username, "password": password, **extra}
    if path == "/admin/login/":
        data["next"] = "/admin/"
    return client.post(path, data, REMOTE_ADDR=ip)


def code_for(device: TOTPDevice, *, offset_steps: int = 0) -> str:
    totp = TOTP(device.bin_key, device.step, device.t0, device.digits, device.drift)
    totp.time = time.time() + offset_steps * device.step
    return f"{totp.token():0{device.digits}d}"


def signed_in_user(client: Client):
    return client.session.get("_auth_user_id")


@pytest.mark.parametrize("path", list(PATHS))
def test_forty_wrong_passwords_then_the_right_one_is_refused(path):
    make("eve-target@example.test", staff=True)
    client = Client()
    statuses = [sign_in(client, path, "eve-target@example.test", f"guess-{i}").status_code for i in range(40)]
    assert statuses[:4] == [200] * 4  # the form again, "wrong password"
    assert set(statuses[5:]) == {429}  # from the limit on: locked out
    right = sign_in(client, path, "eve-target@example.test", PASSWORD)
    assert right.status_code == 429
    assert signed_in_user(client) is None
    assert right["Retry-After"] == str(15 * 60)
    if path.startswith("/api/"):
        # the API's one error shape
        assert right.json() == {"error": {"code": "locked_out", "message": right.json()["error"]["message"],
                                          "fields": {}}}
        assert "Too many failed sign-ins" in right.json()["error"]["message"]
    else:
        assert "Too many failed sign-ins" in right.content.decode()
        assert reverse("console:password_reset") in right.content.decode()
    # one audit event for the lockout, however many attempts followed it
    events = AuditEvent.objects.filter(action="auth.lockout")
    assert events.count() == 1
    assert events[0].object_repr == "eve-target@example.test" and events[0].source_ip == "203.0.113.9"
    assert events[0].tenant is None


def test_the_account_is_locked_from_any_address_and_an_address_for_any_account():
    make("target@example.test")
    make("other@example.test")
    for i in range(5):  # five wrong passwords, each from another address
        sign_in(Client(), "/console/signin/", "Target@Example.test ", f"guess-{i}", ip=f"198.51.100.{i}")
    # the account is locked, also from a fresh address, also with the right password
    assert sign_in(Client(), "/console/signin/", "target@example.test", PASSWORD, ip="192.0.2.77").status_code == 429
    # one address trying five accounts is locked for all of them, a real one included
    for i in range(5):
        sign_in(Client(), "/console/signin/", f"nobody{i}@example.test", "x", ip="192.0.2.1")
    assert sign_in(Client(), "/console/signin/", "other@example.test", PASSWORD, ip="192.0.2.1").status_code == 429
    # ...while that account from another address still signs in
    assert sign_in(Client(), "/console/signin/", "other@example.test", PASSWORD, ip="192.0.2.2").status_code == 302


def test_signing_in_to_ones_own_account_does_not_clear_the_count_against_another():
    make("victim@example.test")
    make("attacker@example.test")
    client = Client()
    for i in range(4):
        sign_in(client, "/console/signin/", "victim@example.test", f"guess-{i}", ip="192.0.2.50")
    assert sign_in(Client(), "/console/signin/", "attacker@example.test", PASSWORD, ip="192.0.2.50").status_code == 302
    sign_in(client, "/console/signin/", "victim@example.test", "guess-5", ip="192.0.2.60")
    assert sign_in(client, "/console/signin/", "victim@example.test", PASSWORD, ip="192.0.2.61").status_code == 429


def test_an_operator_lifts_a_lockout_in_the_admin_and_it_is_audited(admin_client):
    make("locked@example.test")
    for i in range(5):
        sign_in(Client(), "/console/signin/", "locked@example.test", f"guess-{i}")
    assert sign_in(Client(), "/console/signin/", "locked@example.test", PASSWORD, ip="192.0.2.9").status_code == 429
    changelist = reverse("admin:axes_accessattempt_changelist")
    page = admin_client.get(changelist)
    assert page.status_code == 200 and "locked@example.test" in page.content.decode()
    assert reverse("admin:axes_accessattempt_changelist") in admin_client.get("/admin/").content.decode()
    ids = [str(pk) for pk in AccessAttempt.objects.values_list("pk", flat=True)]
    done = admin_client.post(changelist, {"action": "delete_selected", "_selected_action": ids, "post": "yes"},
                             REMOTE_ADDR="198.51.100.200")
    assert done.status_code == 302
    assert not AccessAttempt.objects.exists()
    unlock = AuditEvent.objects.get(action="auth.unlock")
    assert unlock.actor_user.is_staff and unlock.source_ip == "198.51.100.200"
    assert unlock.data["username"] == "locked@example.test"
    assert sign_in(Client(), "/console/signin/", "locked@example.test", PASSWORD).status_code == 302


# --------------------------------------------------------------------------- two-factor


def enrol(client: Client) -> TOTPDevice:
    """Set up TOTP on the security page, as a user would."""
    assert client.post("/console/settings/security/", {"action": "start"}).status_code == 302
    page = client.get("/console/settings/security/")
    device = TOTPDevice.objects.get(confirmed=False)
    assert "otpauth://totp/" in page.content.decode() and "<svg" in page.content.decode()
    wrong = client.post("/console/settings/security/", {"action": "confirm", "code": "000000"})
    assert wrong.status_code == 400
    device.refresh_from_db()
    assert not device.confirmed
    device.throttle_reset()
    done = client.post("/console/settings/security/", {"action": "confirm", "code": code_for(device)})
    assert done.status_code == 302
    device.refresh_from_db()
    assert device.confirmed
    return device


def test_a_user_turns_two_factor_on_and_signing_in_then_asks_for_the_code(alice):
    client = Client()
    client.force_login(alice.user)
    device = enrol(client)
    assert AuditEvent.objects.filter(action="user.2fa_enable", actor_user=alice.user).exists()

    browser = Client()
    step_one = sign_in(browser, "/console/signin/", alice.user.email, PASSWORD)
    assert step_one.status_code == 302 and step_one["Location"] == "/console/signin/code/"
    assert signed_in_user(browser) is None  # the password alone signs nobody in
    assert browser.get("/console/").status_code == 302
    assert browser.get("/api/v1/tenant").status_code in (401, 403)
    assert browser.post("/console/signin/code/", {"code": "123456"}).status_code == 400
    assert signed_in_user(browser) is None
    device.refresh_from_db()
    device.throttle_reset()
    done = browser.post("/console/signin/code/", {"code": code_for(device, offset_steps=1)})
    assert done.status_code == 302 and done["Location"] == "/console/"
    assert signed_in_user(browser) == str(alice.user.pk)
    assert browser.get("/console/").status_code == 200

    # the same code is not taken twice (no replay)
    again = Client()
    sign_in(again, "/console/signin/", alice.user.email, PASSWORD)
    assert again.post("/console/signin/code/", {"code": code_for(device, offset_steps=1)}).status_code == 400


def test_turning_two_factor_off_takes_a_current_code(alice):
    client = Client()
    client.force_login(alice.user)
    device = enrol(client)
    device.throttle_reset()
    assert client.post("/console/settings/security/", {"action": "disable", "code": "000000"}).status_code == 400
    assert TOTPDevice.objects.filter(user=alice.user, confirmed=True).exists()
    device.refresh_from_db()
    device.throttle_reset()
    ok = client.post("/console/settings/security/", {"action": "disable", "code": code_for(device, offset_steps=1)})
    assert ok.status_code == 302
    assert not TOTPDevice.objects.filter(user=alice.user).exists()
    assert sign_in(Client(), "/console/signin/", alice.user.email, PASSWORD).status_code == 302


def test_the_admin_asks_staff_with_a_device_for_the_code():
    operator = make("op@example.test", staff=True)
    device = TOTPDevice.objects.create(user=operator, name="app", confirmed=True)
    client = Client()
    no_code = sign_in(client, "/admin/login/", "op@example.test", PASSWORD)
    assert no_code.status_code == 200 and "code from your authenticator app" in no_code.content.decode()
    assert client.get("/admin/").status_code == 302
    ok = sign_in(client, "/admin/login/", "op@example.test", PASSWORD, otp_token=code_for(device))
    assert ok.status_code == 302
    assert client.get("/admin/").status_code == 200
    # a session signed in without the code (force_login: as the password alone would) stays out
    half = Client()
    half.force_login(operator)
    assert half.get("/admin/").status_code == 302


def test_operators_can_require_two_factor_for_staff(settings):
    settings.REQUIRE_2FA_FOR_STAFF = True
    operator = make("op2@example.test", staff=True)
    client = Client()
    refused = sign_in(client, "/admin/login/", "op2@example.test", PASSWORD)
    assert refused.status_code == 200 and "Operators must use two-factor" in refused.content.decode()
    forced = Client()
    forced.force_login(operator)
    assert forced.get("/admin/").status_code == 302
    assert forced.get("/admin/fleet/").status_code == 302
    # they set it up in the console (operators need no tenant for that page), then get in
    device = enrol(forced)
    assert forced.get("/admin/").status_code == 200
    fresh = Client()
    ok = sign_in(fresh, "/admin/login/", "op2@example.test", PASSWORD, otp_token=code_for(device, offset_steps=1))
    assert ok.status_code == 302 and fresh.get("/admin/").status_code == 200
    settings.REQUIRE_2FA_FOR_STAFF = False
    plain = make("op3@example.test", staff=True)
    c = Client()
    c.force_login(plain)
    assert c.get("/admin/").status_code == 200  # optional by default
