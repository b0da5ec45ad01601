"""What the tenant is shown about connecting: `connect` on an instance's detail (API and
console), from the gateway settings and the host key the gateway persisted at start."""
from __future__ import annotations

import pytest
from django.test import Client

from gateway.server import load_host_key
from scheduler.models import Workload

pytestmark = pytest.mark.django_db

BODY = {"name": "box", "instance_type": "h100.1x", "region": "us-east-1", "image": "ubuntu:24.04"}
NULLS = {"ssh": None, "ssh_host": None, "ssh_port": None, "ssh_user": None, "host_key_fingerprint": None,
         "urls": {}}


@pytest.fixture
def gateway_key(settings, tmp_path):
    """The key file the gateway writes on its first start, and where it is published."""
    settings.GATEWAY_HOST_KEY_PATH = tmp_path / "gateway_host_key"
    settings.GATEWAY_PUBLIC_HOST = "gw.example.test"
    settings.GATEWAY_PUBLIC_SSH_PORT = 2200
    return load_host_key(settings.GATEWAY_HOST_KEY_PATH).get_fingerprint()


def set_state(pk, state):
    Workload.objects.filter(pk=pk).update(state=state)


def test_connect_is_null_until_running_filled_while_running_and_null_again_once_ended(alice, fleet,
                                                                                       gateway_key):
    r = alice.client().post("/api/v1/instances", BODY, format="json")
    assert r.status_code == 201
    pk = r.json()["id"]
    assert r.json()["connect"] == NULLS  # pending
    for state in ("scheduled", "starting"):
        set_state(pk, state)
        assert alice.client().get(f"/api/v1/instances/{pk}").json()["connect"] == NULLS, state
    set_state(pk, "running")
    assert alice.client().get(f"/api/v1/instances/{pk}").json()["connect"] == {
        "ssh": f"ssh -p 2200 {pk}@gw.example.test", "ssh_host": "gw.example.test", "ssh_port": 2200,
        "ssh_user": pk, "host_key_fingerprint": gateway_key, "urls": {}}
    assert gateway_key.startswith("SHA256:")
    for state in ("stopping", "stopped"):
        set_state(pk, state)
        assert alice.client().get(f"/api/v1/instances/{pk}").json()["connect"] == NULLS, state


def test_no_fingerprint_before_the_gateway_has_started_once(alice, fleet, settings, tmp_path):
    settings.GATEWAY_HOST_KEY_PATH = tmp_path / "never-written"
    pk = alice.client().post("/api/v1/instances", BODY, format="json").json()["id"]
    set_state(pk, "running")
    connect = alice.client().get(f"/api/v1/instances/{pk}").json()["connect"]
    assert connect["ssh"] and connect["host_key_fingerprint"] is None


def test_jobs_have_no_connect_field(alice, fleet):
    r = alice.client().post("/api/v1/jobs", BODY, format="json")
    assert r.status_code == 201 and "connect" not in r.json()
    assert "connect" not in alice.client().get(f"/api/v1/jobs/{r.json()['id']}").json()


def test_the_console_shows_the_ssh_command_with_copy_buttons_only_while_running(alice, fleet, gateway_key):
    pk = alice.client().post("/api/v1/instances", BODY, format="json").json()["id"]
    client = Client()
    client.force_login(alice.user)
    ssh = f"ssh -p 2200 {pk}@gw.example.test"
    page = client.get(f"/console/instances/{pk}/").content.decode()
    assert ssh not in page and "ssh -p 22 root@" not in page  # the old, wrong hint is gone
    assert "the ssh command shows here once it runs" in page
    set_state(pk, "running")
    for url in (f"/console/instances/{pk}/", f"/console/instances/{pk}/live"):
        page = client.get(url).content.decode()
        assert f'<code class="mono" id="connect-ssh">{ssh}</code>' in page, url
        assert f'data-copy="{ssh}"' in page and f'data-copy="{gateway_key}"' in page
    set_state(pk, "stopped")
    page = client.get(f"/console/instances/{pk}/").content.decode()
    assert ssh not in page and gateway_key not in page and 'id="connect"' not in page
