"""The acceptance journey, in a real browser against a real stack.

A new user signs up, creates an API key (sees the secret once; it works against the API),
browses the catalogue, launches an instance on a simulated host, watches it become RUNNING,
sees its utilisation chart draw and move, stops it, and finds its cost in usage. Celery
(worker + beat) schedules and meters; the host is a real agent process with the sim backend.
"""
from __future__ import annotations

import json
import re
import urllib.request

from django.core import mail
from playwright.sync_api import expect

from tests.frontend.conftest import shot

RUN_TIMEOUT = 60_000  # ms: placement, the agent's next heartbeat, the sim container start


def test_new_user_rents_a_gpu_from_sign_up_to_usage(fast_metering, page, live_server, sim_host):
    sim_host(name="sim-h100-1", model="H100", gpus=8)

    # sign up: a user and the tenant they own, signed in at once
    page.goto("/")
    page.get_by_role("link", name="Create an account").click()
    page.get_by_label("E-mail").fill("nia@newco.test")
    page.get_by_label("Your name").fill("Nia New")
    page.get_by_label("Organisation").fill("Newco")
    page.get_by_label("Password").fill("a long passphrase 42")
    page.get_by_role("button", name="Sign up").click()
    expect(page.get_by_role("heading", name="Newco", level=1)).to_be_visible()
    expect(page.get_by_text("Nothing is running.")).to_be_visible()
    # the sign-up credit waits for the emailed link (the live server's mail is Django's locmem outbox)
    expect(page.locator("#verify-email")).to_contain_text("nia@newco.test")
    link = re.search(r"https?://\S+/console/verify-email/\?token=\S+", mail.outbox[-1].body).group(0)
    page.goto(link)
    expect(page.get_by_text("Newco received its sign-up credit")).to_be_visible()
    expect(page.locator("#verify-email")).to_have_count(0)
    shot(page, "dashboard")

    # an API key: the secret is shown once, and it works against the API
    page.get_by_role("navigation", name="Console").get_by_role("link", name="Settings").click()
    page.get_by_label("Name").fill("ci")
    page.get_by_label("write").check()
    page.get_by_role("button", name="Create key").click()
    secret = page.locator("#new-secret").inner_text().strip()
    assert secret.startswith("gpc_")
    shot(page, "api-keys")
    request = urllib.request.Request(f"{live_server.url}/api/v1/quotas",
                                     headers={"Authorization": f"Bearer {secret}"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 200 and "max_gpus" in json.load(answer)[0]
    page.reload()
    expect(page.locator("#keys")).to_contain_text("ci")
    expect(page.get_by_text(secret)).to_have_count(0)

    # the catalogue: filter to H100 in us-east-1, sorted by price per TFLOPS
    page.get_by_role("link", name="Catalogue").click()
    page.get_by_label("GPU model").select_option("H100")
    page.get_by_label("Region").select_option("us-east-1")
    row = page.locator('tr[data-type="h100.8x"][data-region="us-east-1"]')
    expect(row).to_contain_text("19.92")  # on demand per hour
    expect(row.locator("td").nth(9)).to_have_text("1")  # one 8-GPU host free now
    expect(page.locator("#catalogue tbody tr")).to_have_count(4)  # h100.1x, .2x, .4x, .8x
    shot(page, "catalogue")

    # launch: the hourly cost is shown before launching, spot too
    row.get_by_role("link", name="Launch h100.8x in us-east-1").click()
    expect(page.locator("#hourly-cost")).to_contain_text("You pay 19.92 an hour")
    page.get_by_label("Spot (cheaper").check()
    expect(page.locator("#hourly-cost")).to_contain_text("You pay 8.96 an hour")
    page.get_by_label("Spot (cheaper").uncheck()
    expect(page.locator("#hourly-cost")).to_contain_text("You pay 19.92 an hour")
    page.get_by_label("Name", exact=True).fill("train-1")
    page.get_by_label("Jupyter").check()
    expect(page.get_by_label("Ports")).to_have_value("8888")
    shot(page, "launch")
    page.get_by_role("button", name="Launch").click()

    # the instance: RUNNING on the simulated host, the timeline, the GPU chart drawing and moving
    expect(page.locator("#state")).to_have_text("Running", timeout=RUN_TIMEOUT)
    expect(page.locator("#host")).to_have_text("sim-h100-1")
    expect(page.locator("#timeline")).to_contain_text("Running")
    chart = page.locator("#gpu-chart")
    expect(chart).to_have_attribute("data-drawn", "1", timeout=RUN_TIMEOUT)
    expect(chart.locator(".chart-util canvas")).to_have_count(1)
    expect(chart.locator(".chart-util .u-legend .u-series")).to_have_count(8)  # one series per GPU
    first = chart.get_attribute("data-last-t")
    expect(chart).not_to_have_attribute("data-last-t", first, timeout=20_000)  # new samples arrived
    shot(page, "instance-running")

    # stop: STOPPING, then STOPPED once the agent reports the container gone; then it may start again
    instance_url = page.url
    page.get_by_role("button", name="Stop", exact=True).click()
    expect(page.locator("#state")).to_have_text("Stopped", timeout=RUN_TIMEOUT)
    expect(page.get_by_role("button", name="Stop", exact=True)).to_have_count(0)
    expect(page.get_by_role("button", name="Start", exact=True)).to_be_visible()
    expect(page.get_by_role("button", name="Remove from list")).to_have_count(0)

    # usage: the metering task posts the seconds it ran; the table refreshes itself
    page.get_by_role("link", name="Usage & billing").click()
    usage = page.locator("#usage-by-type")
    expect(usage).to_contain_text("h100.8x", timeout=30_000)
    expect(page.locator("#usage-by-instance")).to_contain_text("train-1")
    amount = usage.locator("tbody tr td").last.inner_text()
    assert float(amount) > 0, amount
    shot(page, "usage")

    # start the stopped instance again: back through the queue, running on the host once more
    page.goto(instance_url)
    page.get_by_role("button", name="Start", exact=True).click()
    expect(page.locator("#state")).to_have_text("Running", timeout=RUN_TIMEOUT)
    expect(page.locator("#host")).to_have_text("sim-h100-1")
    expect(page.locator("#timeline")).to_contain_text("started again by its owner")
