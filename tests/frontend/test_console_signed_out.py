"""When the session ends under an open page (issue 28, deliverable 3), in Chromium at 1280 and
375 px: the page's polls get a 401 instead of the sign-in page, so nothing nests a whole page
inside a status card; one "signed out" banner shows, the top bar stops naming the user, the
polls stop; and a form submitted after expiry keeps what was typed across the sign-in."""
from __future__ import annotations

from urllib.parse import urlsplit

import pytest
from django.contrib.sessions.models import Session
from django.test import Client
from playwright.sync_api import expect

from scheduler.models import Workload
from tests.frontend.conftest import DESKTOP, PHONE, shot, sign_in

pytestmark = pytest.mark.django_db(transaction=True)


def expire_sessions() -> None:
    """What the session's expiry does on the server: the row is gone, the cookie names nothing."""
    Session.objects.all().delete()


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["1280", "375"])
def test_polls_after_the_session_expired_show_one_banner_and_stop(
    page, live_server, alice, fleet, monkeypatch, viewport
):
    monkeypatch.setattr("frontend.views.POLL_S", 0.3)  # the live parts poll faster; the test waits less
    page.set_viewport_size(viewport)
    sign_in(page, alice.user, live_server.url)
    page.goto("/console/launch/")
    page.fill("input[name=name]", "polled")
    page.select_option("select[name=instance_type]", "h100.1x")
    page.select_option("select[name=region]", "us-east-1")
    page.locator("#launch-submit").click()
    page.wait_for_url("**/console/instances/*/")
    live = page.locator("#workload-live")
    expect(live).to_be_visible()
    expect(page.locator(".topbar .who")).to_be_visible()
    polls: list[str] = []
    page.on("request", lambda r: polls.append(r.url) if r.resource_type in ("xhr", "fetch") else None)

    expire_sessions()
    banner = page.locator("#signed-out")
    expect(banner).to_be_visible()
    expect(banner).to_contain_text("Signed out")
    # no sign-in page inside the page: no password field, one <main>, the card still the card
    expect(page.locator("input[type=password]")).to_have_count(0)
    expect(page.locator("main")).to_have_count(1)
    expect(live).to_be_visible()
    expect(page.locator(".topbar .who")).to_be_hidden()
    # the polls stop: htmx's later triggers are cancelled before they are sent
    sent = len(polls)
    page.wait_for_function("Number(document.body.dataset.cancelledRequests || 0) >= 3")
    assert len(polls) == sent, polls[sent:]
    shot(page, f"signed-out-instance-{viewport['width']}")
    # "sign in again" comes back to this page
    href = banner.locator("a").get_attribute("href")
    assert href and "next=/console/instances/" in href


def test_a_form_submitted_after_expiry_keeps_what_was_typed_across_the_sign_in(page, live_server, alice, fleet):
    alice.user.set_password("correct horse battery")
    alice.user.save()
    sign_in(page, alice.user, live_server.url)
    page.goto("/console/launch/")
    page.fill("input[name=name]", "typed-before-expiry")
    page.select_option("select[name=instance_type]", "h100.1x")
    page.select_option("select[name=region]", "us-east-1")
    expect(page.locator("#hourly-cost")).to_contain_text("h100.1x in us-east-1")  # the cost box answered
    expect(page.locator("#launch-submit")).to_be_enabled()
    expire_sessions()
    page.locator("#launch-submit").click()
    expect(page.locator("#signed-out")).to_be_visible()  # said before anything was lost
    assert page.url.endswith("/console/launch/")
    assert not Workload.objects.exists()

    page.locator("#signed-out a").click()
    page.wait_for_url("**/console/signin/**")
    page.fill("input[name=username]", alice.user.email)
    page.fill("input[name=password]", "correct horse battery")
    page.locator("form button[type=submit]").click()
    # the path itself (the sign-in page's own URL ends with its ?next=/console/launch/ too)
    page.wait_for_url(lambda url: urlsplit(url).path == "/console/launch/")
    expect(page.locator(".kept-notice")).to_be_visible()
    expect(page.locator("input[name=name]")).to_have_value("typed-before-expiry")
    expect(page.locator("select[name=instance_type]")).to_have_value("h100.1x")
    # the cost box answered for the restored choice (htmx swaps it, and the button in it, on change)
    expect(page.locator("#hourly-cost")).to_contain_text("h100.1x in us-east-1")
    expect(page.locator("#launch-submit")).to_be_enabled()
    page.locator("#launch-submit").click()
    page.wait_for_url("**/console/instances/*/")
    assert Workload.objects.get().name == "typed-before-expiry"


def test_a_background_request_without_a_session_gets_401_not_the_sign_in_page(db, alice):
    client = Client()
    url = "/console/instances/"
    polled = client.get(url, HTTP_HX_REQUEST="true")
    assert polled.status_code == 401 and polled.content == b""
    assert client.get(url).status_code == 302  # a person's navigation still goes to sign in
    assert client.get("/console/session").status_code == 401
    client.force_login(alice.user)
    assert client.get("/console/session").status_code == 204


def test_a_post_after_expiry_returns_to_the_form_page_after_sign_in(db, alice):
    answer = Client().post("/console/instances/00000000-0000-0000-0000-000000000000/stop",
                           HTTP_REFERER="http://testserver/console/instances/?show=all")
    assert answer.status_code == 302
    assert answer["Location"] == "/console/signin/?next=/console/instances/%3Fshow%3Dall"
    foreign = Client().post("/console/launch/", HTTP_REFERER="http://evil.example/x")
    assert foreign["Location"] == "/console/signin/?next=/console/"
