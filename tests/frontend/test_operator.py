"""The operators' panel in a real browser (Playwright driving Debian's Chromium).

Two simulated hosts (real agent processes) heartbeat to the live server; a real Celery
worker and beat run the scheduler. An operator signs into /admin/, cordons host A with
the admin action, and the instances a tenant then launches through the REST API land
only on host B; A stays cordoned; uncordoned, A takes the next one. The fleet page shows
one heat-map cell per GPU and the hosts by state, at desktop and phone width without
sideways scrolling, and says in words when a refresh fails. Screenshots go to
var/screenshots/ (git-ignored). The admin actions' effects one by one, and the fleet
page's refusal of non-staff, are tested without a browser in tests/test_admin.py.
"""

from __future__ import annotations

import time

import pytest
from playwright.sync_api import expect

from tests.conftest import make_actor
from tests.frontend.conftest import horizontal_overflow, shot

PASSWORD = "correct horse battery"
HOLDING = ("scheduled", "starting", "running")


def wait_for(what: str, probe, timeout_s: float = 45.0):
    """Poll `probe` until it returns something truthy (the scheduler and agents are other
    processes); fail saying what never happened."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.25)
    pytest.fail(f"within {timeout_s:g} s: {what}")


def sign_in(page, email: str) -> None:
    page.goto("/admin/")
    page.fill("#id_username", email)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    expect(page.locator("#site-name")).to_contain_text("gpucloud operators")


def host_action(page, host, action: str) -> str:
    """Select `host` on the host list, run `action` with the Go button; the messages' text."""
    page.goto("/admin/agents/host/")
    page.check(f'input[name="_selected_action"][value="{host.pk}"]')
    page.select_option("select[name=action]", action)
    page.click('button[name="index"]')
    messages = page.locator("ul.messagelist")
    expect(messages).to_be_visible()
    return messages.inner_text()


def launch(actor, name: str) -> str:
    resp = actor.client().post(
        "/api/v1/instances",
        {
            "name": name,
            "instance_type": "h100.1x",
            "region": "us-east-1",
            "image": "pytorch/pytorch:2.4.0",
        },
        format="json",
    )
    assert resp.status_code == 201, resp.content
    return resp.json()["id"]


def instance(actor, pk: str) -> dict:
    return actor.client().get(f"/api/v1/instances/{pk}").json()


def placed(actor, pk: str) -> str | None:
    """The host an instance holds GPUs on, once the scheduler placed it."""
    body = instance(actor, pk)
    return body["host"] if body["state"] in HOLDING else None


def test_an_operator_cordons_a_host_and_new_instances_stop_landing_on_it(page, phone, sim_host):
    from django.contrib.auth import get_user_model

    from agents.models import Host

    a = sim_host("sim-a", gpus=2)
    sim_host("sim-b", gpus=2)
    get_user_model().objects.create_superuser("ops@gpucloud.test", "ops@gpucloud.test", PASSWORD)
    alice = make_actor("alice@acme.test", tenant_name="Acme")

    sign_in(page, "ops@gpucloud.test")
    said = host_action(page, a, "cordon")
    assert "Cordoned sim-a: no new work lands there" in said
    expect(page.locator("#result_list")).to_contain_text("Cordoned")
    shot(page, "operator-hosts-cordoned")

    # Three one-GPU instances: sim-b takes two, the third waits (sim-a is cordoned).
    first = [launch(alice, f"train-{n}") for n in range(3)]
    hosts = wait_for(
        "two instances placed",
        lambda: (lambda got: got if len([h for h in got if h]) == 2 else None)(
            [placed(alice, pk) for pk in first]
        ),
    )
    assert sorted(h for h in hosts if h) == ["sim-b", "sim-b"]
    waiting = first[hosts.index(None)]
    body = instance(alice, waiting)
    assert body["state"] == "pending" and body["reason"], body
    assert (
        Host.objects.get(pk=a.pk).state == "cordoned"
    )  # heartbeats do not undo the operator's choice

    said = host_action(page, a, "uncordon")
    assert "Uncordoned sim-a: new work may land there again." in said
    assert (
        wait_for("the waiting instance placed on sim-a", lambda: placed(alice, waiting)) == "sim-a"
    )

    # The fleet page: one cell per GPU, the hosts by state, the allocation chart drawn.
    page.goto("/admin/fleet/")
    expect(page.locator("#fleet-heatmap [data-gpu]")).to_have_count(4)
    expect(page.locator('#fleet-hosts [data-total="up"]')).to_have_text("2")
    expect(page.locator('[data-figure="booked"]')).to_have_text("3")
    expect(page.locator("#fleet-allocation")).to_have_attribute("data-state", "ready")
    expect(page.locator("#fleet-allocation canvas")).to_have_count(1)
    shot(page, "operator-fleet")

    # At 375 px: nothing wider than the screen, on the fleet page and on the host list.
    phone.context.add_cookies(page.context.cookies())
    for path, name in (
        ("/admin/fleet/", "operator-fleet-phone"),
        ("/admin/agents/host/", "operator-hosts-phone"),
    ):
        phone.goto(path)
        if path == "/admin/fleet/":
            expect(phone.locator("#fleet-heatmap [data-gpu]")).to_have_count(4)
            expect(phone.locator("#fleet-allocation")).to_have_attribute("data-state", "ready")
        shot(phone, name)
        assert horizontal_overflow(phone) == [], path

    # A refresh that fails says why, in words: the network, then an ended session.
    status = page.locator("#fleet-status")
    expect(status).to_be_hidden()
    page.route("**/admin/fleet/live", lambda route: route.abort())
    page.evaluate("htmx.trigger('#fleet-poller', 'fleet-refresh')")
    expect(status).to_contain_text("Could not refresh the fleet: the server could not be reached.")
    page.unroute("**/admin/fleet/live")
    page.evaluate("htmx.trigger('#fleet-poller', 'fleet-refresh')")
    expect(status).to_be_hidden()
    page.context.clear_cookies()
    page.evaluate("htmx.trigger('#fleet-poller', 'fleet-refresh')")
    expect(status).to_contain_text("Your session has ended")
    shot(page, "operator-fleet-refresh-failed")
