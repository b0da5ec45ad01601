"""Console truths in Chromium (Playwright, Debian's /usr/bin/chromium): a job's exit code
appears on its page when it ends, without a reload; the "queued" and "stopping" messages go
once the live part shows another state. The transitions are the real services the agents'
heartbeats call; the page learns of them only through its own polling."""
from __future__ import annotations

import time

import pytest
from django.test import Client
from playwright.sync_api import expect

from scheduler.choices import State
from scheduler.cycle import run_cycle
from scheduler.models import Workload
from scheduler.services import workload_stopped, workload_transition
from tests.agents.test_agent_api import triggered  # noqa: F401 - a fixture, used by name
from tests.frontend.conftest import sign_in
from tests.scheduler.test_instances_api import region_id

pytestmark = pytest.mark.django_db(transaction=True)


def launch_in_console(page, name: str) -> Workload:
    page.goto("/console/launch/")
    page.check("input[name=kind][value=job]")
    page.fill("input[name=name]", name)
    page.select_option("select[name=instance_type]", "h100.1x")
    page.select_option("select[name=region]", "us-east-1")
    page.locator("#launch-submit").click()
    page.wait_for_url("**/console/jobs/*/")
    return Workload.objects.get(name=name)


def place(job: Workload) -> None:
    """The scheduling cycle until it placed `job` (a cycle may find the region's lock taken)."""
    for _ in range(50):
        run_cycle(region_id=region_id())
        job.refresh_from_db()
        if job.state != State.PENDING:
            return
        time.sleep(0.1)
    pytest.fail(f"{job.name} was not placed: {job.reason}")


def test_the_exit_code_shows_without_a_reload_and_messages_do_not_outlive_their_state(
    page, live_server, alice, fleet, triggered, monkeypatch
):
    monkeypatch.setattr("frontend.views.POLL_S", 0.5)  # the live part polls faster; the test waits less
    sign_in(page, alice.user, live_server.url)
    job = launch_in_console(page, "short")
    queued = page.locator(".messages li", has_text="is queued")
    expect(queued).to_be_visible()
    expect(page.locator("#exit-code")).to_have_text("—")
    place(job)  # placed: no longer queued, so the message goes
    expect(page.locator("#state")).to_have_attribute("data-state", "scheduled")
    expect(queued).to_have_count(0)
    workload_transition(workload=job, to=State.RUNNING, reason="container running")
    expect(page.locator("#state")).to_have_attribute("data-state", "running")
    workload_transition(workload=job, to=State.FAILED, reason="container exited with code 3", exit_code=3)
    expect(page.locator("#exit-code")).to_have_text("3")  # the live part, no reload
    assert page.evaluate("performance.getEntriesByType('navigation').length") == 1

    other = launch_in_console(page, "long")
    place(other)
    workload_transition(workload=other, to=State.RUNNING, reason="container running")
    page.reload()
    page.get_by_role("button", name="Stop").click()
    stopping = page.locator(".messages li", has_text="Stopping long")
    expect(stopping).to_be_visible()  # true while it stops
    other.refresh_from_db()
    assert other.state == State.STOPPING
    workload_stopped(workload=other, reason="container stopped", exit_code=143)
    expect(page.locator("#state")).not_to_have_attribute("data-state", "stopping")
    expect(stopping).to_have_count(0)


def test_an_operator_without_a_tenant_is_sent_to_the_fleet_page(db, django_user_model):
    op = django_user_model.objects.create_user(username="op@example.test", email="op@example.test", password="x",
                                               is_staff=True)
    client = Client()
    client.force_login(op)
    r = client.get("/console/")
    assert (r.status_code, r["Location"]) == (302, "/admin/fleet/")


def test_the_landing_page_is_styled_at_both_widths_with_its_icon(page, phone, live_server, catalog):
    from tests.frontend.conftest import horizontal_overflow, shot
    from tests.scheduler.fleet import make_hosts

    make_hosts(n=1, model="L40S", region="eu-central-1")
    for p, name in ((page, "home"), (phone, "home-phone")):
        p.goto("/")
        expect(p.locator("#rentable tbody tr")).to_have_count(7)
        cta = p.locator("#cta-signup")
        expect(cta).to_be_visible()
        # the console's stylesheet, not the browser's defaults: a filled button, a sans-serif page
        assert p.evaluate("getComputedStyle(document.querySelector('#cta-signup')).backgroundColor") not in (
            "rgba(0, 0, 0, 0)", "transparent")
        assert "serif" not in p.evaluate("getComputedStyle(document.body).fontFamily").replace("sans-serif", "")
        assert p.evaluate("document.querySelector('.topbar') && getComputedStyle(document.querySelector('.topbar'))"
                          ".display") != "inline"
        assert horizontal_overflow(p) == [], name
        icon = p.evaluate("document.querySelector('link[rel=icon]').href")
        assert p.request.get(icon).status == 200
        shot(p, name)
