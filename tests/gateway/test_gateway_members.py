"""One authorisation rule on every face: a deactivated user or a removed member gets in nowhere.

`gpucloud.tenancy.selectors.member_permissions` is the rule (an active member of the tenant,
the role narrowed by a key's scopes and the tenant's suspension). The console, the API's
authentication and permissions, the gateway's HTTP proxy and SSH `authorize`, and the
re-check of open sessions (`still_allowed`) all ask it. Issue 27 (6): a deactivated user
kept SSH, as `authorize` and `still_allowed` read the role alone.
"""
from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from agents.host.tunnel import SimConnector
from gateway import access
from gpucloud.tenancy.models import Membership
from gpucloud.tenancy.services import ssh_key_add
from tests.agents.test_agent_api import make_sim_host, place, region, state, triggered  # noqa: F401
from tests.conftest import make_actor
from tests.gateway.test_gateway_ssh import GatewayThread, keypair, running_instance, ssh, ssh_session, tunnel_up

pytestmark = pytest.mark.django_db(transaction=True)


def cut_off(actor, how: str) -> None:
    if how == "deactivated":  # what an operator does in the admin (is_active unticked)
        get_user_model().objects.filter(pk=actor.user.pk).update(is_active=False)
    else:  # removed from the tenant (its row gone: whatever else removal tidies up)
        Membership.objects.filter(pk=actor.membership.pk).delete()


@pytest.fixture
def bob_and_instance(make_sim_host, alice, tmp_path):  # noqa: F811
    """bob (a member of alice's tenant, with a saved SSH key) and the tenant's RUNNING instance."""
    bob = make_actor("bob@acme.test", tenant=alice.tenant, role="member")
    key, pub = keypair(tmp_path, "bob")
    ssh_key_add(membership=bob.membership, name="bob", public_key=pub)
    sim, w = running_instance(make_sim_host, alice.tenant)
    return bob, w, key, pub, sim


@pytest.mark.parametrize("how", ["deactivated", "removed"])
def test_a_cut_off_user_is_refused_on_every_face(bob_and_instance, how):
    bob, w, _, pub, _ = bob_and_instance
    browser = Client()
    browser.force_login(bob.user)
    session_key = browser.cookies["sessionid"].value
    # Before: every face lets bob in.
    grant = access.authorize(username=str(w.pk), public_key=pub)
    assert grant is not None and grant.user_id == bob.user.pk
    assert access.still_allowed([grant]) == [True]
    assert isinstance(access.authorize_http(instance=str(w.pk), api_key=bob.key), access.Grant)
    assert isinstance(access.authorize_http(instance=str(w.pk), session_key=session_key), access.Grant)
    assert browser.get(f"/console/instances/{w.pk}/").status_code == 200
    assert bob.client().get(f"/api/v1/instances/{w.pk}").status_code == 200

    cut_off(bob, how)

    assert access.authorize(username=str(w.pk), public_key=pub) is None  # SSH: a new login
    assert access.still_allowed([grant]) == [False]  # SSH and the terminal: the open session ends
    assert access.authorize_http(instance=str(w.pk), api_key=bob.key) in (access.UNAUTHENTICATED, None)
    assert access.authorize_http(instance=str(w.pk), session_key=session_key) in (access.UNAUTHENTICATED, None)
    page = browser.get(f"/console/instances/{w.pk}/")
    assert page.status_code in (302, 403) and str(w.pk) not in page.content.decode()
    assert bob.client().get(f"/api/v1/instances/{w.pk}").status_code in (401, 403)


def test_a_deactivated_user_s_open_ssh_session_ends_and_a_new_one_is_refused(bob_and_instance, tmp_path):
    """With the real gateway and OpenSSH: the re-check ends the session within seconds."""
    bob, w, key, _, sim = bob_and_instance
    gw = GatewayThread(tmp_path)
    tunnel = tunnel_up(sim, SimConnector(sim.runtime), gw)
    proc = ssh_session(gw.gw.ssh_port, key, str(w.pk))
    try:
        assert proc.stdout.read(2) == b"$ "  # the prompt: the session is open
        cut_off(bob, "deactivated")
        assert proc.wait(timeout=5) == 255
        assert b"access was withdrawn" in proc.stdout.read() + proc.stderr.read()
        out = ssh(gw.gw.ssh_port, key, str(w.pk), "echo in")
        assert out.returncode == 255 and "Permission denied" in out.stderr
        assert state(w) == "running"  # the instance itself runs on: only bob is out
    finally:
        proc.kill()
        proc.wait(5)
        tunnel.stop()
        gw.stop()
