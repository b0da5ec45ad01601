"""The web terminal and a port URL in Chromium, through a real gateway and agent tunnel.

The instance is the gateway tests' (tests/gateway/test_gateway_http.py `web`): a sim host
whose agent tunnels to a gateway; the shell is the simulated runtime's built-in fake shell.
"""
from __future__ import annotations

import json

import pytest
from playwright.sync_api import expect

from tests.agents.test_agent_api import make_sim_host, place, region, state, triggered  # noqa: F401
from tests.frontend.conftest import sign_in
from tests.gateway.test_gateway_http import web  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_web_terminal_runs_a_command_and_a_port_url_opens_with_the_console_session(
        web, alice, page, live_server, settings):  # noqa: F811
    sim, w, gw = web
    # The console is served at http://localhost:<port>; the gateway's HTTP side on the same
    # host name gets the console's session cookie (cookies ignore ports), as in a deployment.
    settings.GATEWAY_PUBLIC_HTTP_URL = f"http://localhost:{gw.gw.http_port}"
    sign_in(page, alice.user, live_server.url)
    page.goto(f"/console/instances/{w.pk}/")
    page.click("#open-terminal")
    expect(page.locator("#terminal-status")).to_have_text("connected")
    page.locator("#terminal").click()
    page.keyboard.type("echo term-$((1+1))")
    page.keyboard.press("Enter")
    rows = page.locator("#terminal .xterm-rows")
    expect(rows).to_contain_text("term-2")
    # the terminal's size reached the shell (xterm fitted it to the box, then resized)
    size = page.evaluate("[window.gpucloudTerminal.rows, window.gpucloudTerminal.cols]")
    assert size != [24, 80]
    page.keyboard.type("stty size")
    page.keyboard.press("Enter")
    expect(rows).to_contain_text(f"{size[0]} {size[1]}")
    page.keyboard.type("exit 5")
    page.keyboard.press("Enter")
    expect(page.locator("#terminal-status")).to_have_text("the shell exited (status 5)")

    # One click from the instance page: the port's URL, with the browser's console session.
    page.goto(f"/console/instances/{w.pk}/")
    with page.context.expect_page() as opened:
        page.click(".port-url[data-port='80']")
    tab = opened.value
    tab.wait_for_load_state()
    body = tab.locator("body").inner_text()
    seen = json.loads(body)
    assert "path" in seen, body
    assert seen["path"] == "/" and "sessionid" not in seen["headers"].get("cookie", "")


@pytest.mark.django_db  # no live server or thread here: the cheaper, rolled-back kind
def test_the_terminal_page_needs_connect_and_a_running_instance_of_ones_own_tenant(alice, region):  # noqa: F811
    from django.test import Client

    from gpucloud.catalogue.models import InstanceType
    from scheduler.models import Workload
    from tests.conftest import make_actor

    w = Workload.objects.create(tenant=alice.tenant, kind="instance", name="nb", image="img:1", region=region,
                                instance_type=InstanceType.objects.get(code="h100.1x"))
    victor = make_actor("victor@acme.test", tenant=alice.tenant, role="viewer")
    charlie = make_actor("charlie@globex.test", tenant_name="Globex")
    pages = {}
    for actor in (alice, victor, charlie):
        client = Client()
        client.force_login(actor.user)
        pages[actor.user.email] = client.get(f"/console/instances/{w.pk}/terminal/")
    assert pages["victor@acme.test"].status_code == 403  # a viewer may not connect
    assert pages["charlie@globex.test"].status_code == 404  # another tenant's: not there
    mine = pages["alice@acme.test"]
    assert mine.status_code == 200 and b"opens once the instance is running" in mine.content
    assert b"ticket=" not in mine.content  # no ticket for an instance that is not running
