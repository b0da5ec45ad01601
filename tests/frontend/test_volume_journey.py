"""Issue 15's console journey in Chromium, on real parts: a user creates a volume, launches an
instance with it picked in the launch form, writes a file through the web terminal, stops the
instance, starts it again and reads the file back.

The containers really run: the instance is a locally built busybox image on a host agent with
the Docker runtime (simulated GPUs), tunnelled to a real gateway, whose named Docker volume
holds the file across the stop (the simulated runtime keeps no files, so it could not show
this). The fixture is the gateway's Docker test's (tests/gateway/test_gateway_docker.py
`connected`): the agent runs in this process and the test drives it (`agent.iterate()`) and
the scheduler (`run_cycle`) where a deployment's loops and Celery would, so every step is
bounded and nothing waits on a timer. Screenshots of the volume pages at 1280 px (and at
375 px, checked for nothing wider than a phone's screen) go to $GPUCLOUD_SCREENSHOTS (else
var/screenshots/).
"""
from __future__ import annotations

import docker
import pytest
from playwright.sync_api import expect

from agents.host.runtime import LABEL_TENANT
from gpucloud.catalogue.models import Region
from scheduler.choices import State
from scheduler.cycle import run_cycle
from scheduler.models import Workload
from tests.agents.test_agent_api import triggered  # noqa: F401 - a fixture, used by name
from tests.frontend.conftest import DESKTOP, horizontal_overflow, shot, sign_in
from tests.gateway.test_gateway_docker import IMAGE, connected, engine, tiny, wait_until  # noqa: F401
from volumes.models import Volume
from volumes.services import volume_create

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def docker_volumes(engine, alice):  # noqa: F811
    """Removes alice's Docker volumes at the end, once the containers using them are gone."""
    yield
    for v in engine.volumes.list(filters={"label": f"{LABEL_TENANT}={alice.tenant.pk}"}):
        for ctr in engine.containers.list(all=True, filters={"volume": v.name}):
            ctr.remove(force=True)
        try:
            v.remove(force=True)
        except docker.errors.NotFound:
            pass


def _until_state(agent, w: Workload, state: str, what: str) -> None:
    def reached() -> bool:
        agent.iterate()
        w.refresh_from_db()
        return w.state == state
    wait_until(reached, what, 20)


def _terminal(page, line: str) -> None:
    page.click("#open-terminal")
    expect(page.locator("#terminal-status")).to_have_text("connected")
    page.locator("#terminal").click()
    page.keyboard.type(line)
    page.keyboard.press("Enter")


def test_a_file_on_a_volume_outlives_a_stop_and_start_of_its_instance(
        docker_volumes, connected, alice, tiny, page, phone, live_server, settings):  # noqa: F811
    agent, gw = connected
    # Served at http://localhost:<port>: the gateway on the same host name gets the session cookie.
    settings.GATEWAY_PUBLIC_HTTP_URL = f"http://localhost:{gw.gw.http_port}"
    assert page.viewport_size == DESKTOP and DESKTOP["width"] == 1280
    sign_in(page, alice.user, live_server.url)

    # A volume, from the volumes page.
    page.goto("/console/volumes/")
    page.fill("#id_name", "work")
    page.select_option("#id_region", "us-east-1")
    page.fill("#id_size_gib", "5")
    page.click("button:text(\"Create volume\")")
    expect(page.locator("h1")).to_have_text("Volume work")
    vol = Volume.objects.get(tenant=alice.tenant, name="work")
    shot(page, "volume-detail-new-1280")

    # Launch with it: the volume detail's link opens the launch form with the volume picked,
    # and the picker offers only the chosen region's volumes.
    far = volume_create(tenant=alice.tenant, name="far", region=Region.objects.create(
        code="eu-central-1", name="EU Central", country="DE").code, size_gib=1)
    page.click("#launch-with-volume")
    expect(page.locator("#id_volume")).to_have_value(str(vol.pk))
    expect(page.locator("#id_mount_path")).to_have_value("/workspace")
    offered = "[...document.querySelectorAll('#id_volume option')].filter(o => !o.disabled).map(o => o.value)"
    assert page.evaluate(offered) == ["", str(vol.pk)]
    page.select_option("#id_volume", "")
    page.select_option("#id_region", "eu-central-1")
    assert page.evaluate(offered) == ["", str(far.pk)]
    page.select_option("#id_region", "us-east-1")
    page.select_option("#id_volume", str(vol.pk))
    page.fill("#id_name", "box")
    page.select_option("#id_instance_type", "l40s.1x-tiny")
    page.check("input[name=template][value=custom]")
    page.fill("#id_image", IMAGE)
    page.fill("#id_command", "sleep 3600")
    page.click("#launch-submit")
    expect(page.locator("h1")).to_contain_text("box")
    w = Workload.objects.get(tenant=alice.tenant, name="box")
    assert [(a.volume_id, a.mount_path) for a in w.volume_attachments.all()] == [(vol.pk, "/workspace")]
    assert run_cycle(region_id=tiny.pk).ran
    _until_state(agent, w, State.RUNNING, "the instance runs")
    wait_until(lambda: str(w.allocations.first().gpu.host_id) in gw.gw.tunnels, "the agent's tunnel")

    # Write a file on the volume through the web terminal.
    page.goto(f"/console/instances/{w.pk}/")
    _terminal(page, "echo kept-$((6*7)) > /workspace/note.txt && echo wrote-it")
    expect(page.locator("#terminal .xterm-rows")).to_contain_text("wrote-it")

    page.goto(f"/console/volumes/{vol.pk}/")
    expect(page.locator(".facts")).to_contain_text("box at /workspace (running)")
    shot(page, "volume-detail-attached-1280")

    # Stop: the container goes, the volume stays.
    page.goto(f"/console/instances/{w.pk}/")
    page.click(f"form[action='/console/instances/{w.pk}/stop'] button")
    _until_state(agent, w, State.STOPPED, "the instance stops")
    # Start: back through the queue, to the volume's host.
    start = page.locator("#start")
    expect(start).to_be_visible()  # the live part shows Start once it has stopped
    start.click()
    expect(page.locator(".messages, [role=status]").first).to_contain_text("queued again")
    assert run_cycle(region_id=tiny.pk).ran
    _until_state(agent, w, State.RUNNING, "the instance runs again")
    assert w.allocations.first().gpu.host_id == Volume.objects.get(pk=vol.pk).host_id

    # The file is there, in a new container.
    page.goto(f"/console/instances/{w.pk}/")
    _terminal(page, "cat /workspace/note.txt")
    expect(page.locator("#terminal .xterm-rows")).to_contain_text("kept-42")

    page.goto("/console/volumes/")
    expect(page.locator("main")).to_contain_text("work")
    shot(page, "volumes-list-1280")

    # The same pages on a phone: nothing wider than the screen.
    sign_in(phone, alice.user, live_server.url)
    for path, name in (("/console/volumes/", "volumes-list"), (f"/console/volumes/{vol.pk}/", "volume-detail"),
                       (f"/console/launch/?region=us-east-1&volume={vol.pk}", "launch-with-volume")):
        phone.goto(path)
        assert horizontal_overflow(phone) == [], (path, horizontal_overflow(phone))
        shot(phone, f"{name}-375")
