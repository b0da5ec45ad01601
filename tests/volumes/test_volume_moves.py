"""Volume moves without an engine: who may start one and when, the agents' endpoints (each
host only its own part, a tenant none), the checks before the host changes, the operator's
command and admin action. The data path on a real engine: tests/agents/test_volume_move_docker.py."""
from __future__ import annotations

import hashlib
import io

import pytest
from django.core.management import CommandError, call_command

from agents.choices import AdminState
from agents.selectors import hash_token
from agents.signals import move_orders, removals
from gpucloud.tenancy.models import AuditEvent
from scheduler.cycle import run_cycle
from tests.agents.test_agent_api import make_sim_host, region, triggered  # noqa: F401 - fixtures, used by name
from tests.scheduler.fleet import make_hosts
from tests.volumes.test_volumes_api import code, create, launch, region_id
from volumes import moves, selectors, services
from volumes.models import Volume, VolumeMove, VolumeMoveChunk

pytestmark = pytest.mark.django_db


def signed_in(actor):
    from django.test import Client

    c = Client()
    c.force_login(actor.user)
    return c


def placed_volume(alice, settings):
    settings.PLAN_QUOTAS = {plan: {"max_gpus": 64, "max_instances": 32} for plan in settings.PLAN_QUOTAS}
    a, b = make_hosts(n=2, gpus=8)
    for h, secret in ((a, "tok-a"), (b, "tok-b")):
        h.token_hash = hash_token(secret)
        h.save(update_fields=["token_hash"])
    vol = create(alice).json()["id"]
    first = launch(alice, "first", vol).json()["id"]
    run_cycle(region_id=region_id())
    volume = Volume.objects.get(pk=vol)
    src, dst = (a, b) if volume.host == a else (b, a)
    return volume, first, src, dst, {src.pk: "tok-a" if src == a else "tok-b", dst.pk: "tok-b" if src == a else "tok-a"}


def agent(client, method, path, token, data=b"", ctype="application/octet-stream"):
    return getattr(client, method)(f"/agent/v1/volume-moves/{path}", data=data, content_type=ctype,
                                   HTTP_AUTHORIZATION=f"Bearer {token}")


def test_a_move_needs_a_detached_placed_volume_and_another_ready_host(alice, catalog, settings):
    volume, first, src, dst, _ = placed_volume(alice, settings)
    with pytest.raises(Exception) as e:
        moves.move_start(volume=volume, target=dst)
    assert e.value.code == "volume_attached"
    alice.client().post(f"/api/v1/instances/{first}/stop")
    with pytest.raises(Exception) as e:
        moves.move_start(volume=volume, target=src)
    assert e.value.code == "same_host"
    dst.admin_state = AdminState.DRAINING
    dst.save(update_fields=["admin_state"])
    with pytest.raises(Exception) as e:
        moves.move_start(volume=volume, target=dst)
    assert e.value.code == "host_unavailable"
    dst.admin_state = AdminState.READY
    dst.save(update_fields=["admin_state"])
    fresh = Volume.objects.get(pk=create(alice, name="fresh").json()["id"])
    with pytest.raises(Exception) as e:
        moves.move_start(volume=fresh, target=dst)
    assert e.value.code == "volume_not_placed"
    moves.move_start(volume=volume, target=dst)
    with pytest.raises(Exception) as e:
        moves.move_start(volume=volume, target=dst)
    assert e.value.code == "volume_moving"
    assert AuditEvent.objects.filter(action="volume.move").count() == 1
    # the owner sees it moving (API and console); attaching (a launch, a start) waits for the move
    assert alice.client().get(f"/api/v1/volumes/{volume.pk}").json()["state"] == "moving"
    assert [v["state"] for v in alice.client().get("/api/v1/volumes").json()["results"]] == ["available", "moving"]
    page = signed_in(alice).get(f"/console/volumes/{volume.pk}/").content.decode()
    assert 'id="volume-moving"' in page
    assert code(launch(alice, "second", str(volume.pk))) == (409, "volume_moving")
    assert code(alice.client().post(f"/api/v1/instances/{first}/start")) == (409, "volume_moving")
    assert code(alice.client().delete(f"/api/v1/volumes/{volume.pk}")) == (409, "volume_moving")
    assert [(o.role, o.volume) for o in move_orders(host=src)] == [("send", volume.docker_name)]
    assert move_orders(host=dst) == []


def test_the_agents_endpoints_take_each_host_in_its_role_and_check_before_the_host_changes(
    alice, catalog, settings, client
):
    volume, first, src, dst, tok = placed_volume(alice, settings)
    alice.client().post(f"/api/v1/instances/{first}/stop")
    move = moves.move_start(volume=volume, target=dst)
    data = b"x" * 1500
    # a tenant's credentials, no credentials, the wrong host: refused, nothing stored
    assert alice.client().put(f"/agent/v1/volume-moves/{move.pk}/chunks/0", data=data,
                              content_type="application/octet-stream").status_code == 401
    assert agent(client, "put", f"{move.pk}/chunks/0", tok[dst.pk], data).status_code == 400
    assert not VolumeMoveChunk.objects.exists()
    assert agent(client, "put", f"{move.pk}/chunks/0", tok[src.pk], data[:1000]).status_code == 200
    assert agent(client, "put", f"{move.pk}/chunks/1", tok[src.pk], data[1000:]).status_code == 200
    assert agent(client, "get", f"{move.pk}/chunks/0", tok[dst.pk]).status_code == 409  # not all sent yet
    digest = hashlib.sha256(data).hexdigest()
    body = {"size_bytes": 1500, "sha256": digest, "chunks": 2}
    r = agent(client, "post", f"{move.pk}/sent", tok[src.pk], body, "application/json")
    assert r.json() == {"state": "sent"}
    assert move_orders(host=src) == []
    (order,) = move_orders(host=dst)
    assert (order.role, order.size_bytes, order.sha256) == ("receive", 1500, digest)
    assert agent(client, "get", f"{move.pk}/chunks/0", tok[src.pk]).status_code == 400  # the source reads nothing
    got = b"".join(agent(client, "get", f"{move.pk}/chunks/{i}", tok[dst.pk]).content for i in range(2))
    assert got == data
    assert code(agent(client, "get", f"{move.pk}/chunks/2", tok[dst.pk])) == (400, "unknown_chunk")
    # the target counted the same: the volume lives there now, its stopped instance is pinned there
    r = agent(client, "post", f"{move.pk}/received", tok[dst.pk], {"size_bytes": 1500, "sha256": digest},
              "application/json")
    assert r.json() == {"state": "done"}
    assert Volume.objects.get(pk=volume.pk).host == dst
    from scheduler.models import Workload

    assert Workload.objects.get(pk=first).pinned_host == dst
    assert not VolumeMoveChunk.objects.exists()
    assert removals(host=src) == [volume.docker_name] and removals(host=dst) == []
    assert Volume.objects.get(pk=volume.pk).size_gib == 100  # no size, quota or billing change


def test_a_mismatch_fails_the_move_and_the_volume_stays(alice, catalog, settings, client):
    volume, first, src, dst, tok = placed_volume(alice, settings)
    alice.client().post(f"/api/v1/instances/{first}/stop")
    move = moves.move_start(volume=volume, target=dst)
    agent(client, "put", f"{move.pk}/chunks/0", tok[src.pk], b"abc")
    digest = hashlib.sha256(b"abc").hexdigest()
    agent(client, "post", f"{move.pk}/sent", tok[src.pk], {"size_bytes": 3, "sha256": digest, "chunks": 1},
          "application/json")
    r = agent(client, "post", f"{move.pk}/received", tok[dst.pk], {"size_bytes": 3, "sha256": "0" * 64},
              "application/json")
    assert r.json() == {"state": "failed"}
    move.refresh_from_db()
    assert move.state == "failed" and "sha256" in move.error
    assert Volume.objects.get(pk=volume.pk).host == src
    assert volume.events.filter(kind="move_failed").exists()
    # usable: it starts again on its host
    assert alice.client().post(f"/api/v1/instances/{first}/start").status_code == 200


def test_the_operators_command_and_admin_action(alice, catalog, settings, admin_client):
    volume, first, src, dst, _ = placed_volume(alice, settings)
    alice.client().post(f"/api/v1/instances/{first}/stop")
    with pytest.raises(CommandError):
        call_command("volume_move", str(volume.pk), "--cancel")
    out = io.StringIO()
    call_command("volume_move", str(volume.pk), "--to", dst.name, stdout=out)
    assert f"to {dst.name}" in out.getvalue()
    call_command("volume_move", str(volume.pk), "--cancel", stdout=out)
    assert VolumeMove.objects.get().state == "failed"
    r = admin_client.post("/admin/volumes/volume/", {"action": "move_to_another_host",
                                                     "_selected_action": [str(volume.pk)]}, follow=True)
    assert r.status_code == 200
    assert VolumeMove.objects.filter(state="copying", target=dst).exists()


@pytest.mark.django_db(transaction=True)
def test_a_runtime_that_cannot_move_fails_the_move_and_the_volume_stays(make_sim_host, alice, triggered):
    """The simulated runtime keeps no files: its agent takes the send order, says why it
    cannot, and the volume stays where it is, attachable again."""
    from agents.models import Host

    a = make_sim_host(name="sim-a", model="H100")
    b = make_sim_host(name="sim-b", model="H100")
    a.beat()
    b.beat()
    vol = Volume.objects.get(pk=create(alice).json()["id"])
    Volume.objects.filter(pk=vol.pk).update(host=Host.objects.get(name="sim-a"))
    vol.refresh_from_db()
    move = moves.move_start(volume=vol, target=Host.objects.get(name="sim-b"))
    a.beat()  # the send order: the agent's thread reports the failure
    for t in a.agent.moves.values():
        t.join(timeout=10)
    move.refresh_from_db()
    assert move.state == "failed" and "cannot move volumes" in move.error, move.error
    assert Volume.objects.get(pk=vol.pk).host.name == "sim-a"
    assert selectors.open_move(vol.pk) is None
    services.refuse_if_moving(vol)  # attachable again at once


def test_one_query_gives_an_answer_its_removals_and_orders(alice, catalog, settings):
    """A heartbeat answer asks for the host's volume work once: purged volumes whose data it
    still holds, old copies of volumes moved away, and its open moves, in one query."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    volume, _first, src, dst, _tokens = placed_volume(alice, settings)
    purged = Volume.objects.create(tenant=alice.tenant, name="gone", size_gib=10, region=volume.region,
                                   host=src, deleted_at=timezone.now(), purged_at=timezone.now())
    elsewhere = Volume.objects.create(tenant=alice.tenant, name="other", size_gib=10, region=volume.region,
                                      host=dst, deleted_at=timezone.now(), purged_at=timezone.now())
    VolumeMove.objects.create(volume=volume, source=src, target=dst, state=VolumeMove.DONE)
    shared: dict = {}
    with CaptureQueriesContext(connection) as q:
        assert removals(host=src, shared=shared) == sorted([purged.docker_name, volume.docker_name])
        assert move_orders(host=src, shared=shared) == []
    assert len(q.captured_queries) == 1
    assert removals(host=dst) == [elsewhere.docker_name]
    VolumeMove.objects.filter(volume=volume).update(source_removed_at=timezone.now())
    Volume.objects.filter(pk=purged.pk).update(host=None)
    assert removals(host=src) == []
