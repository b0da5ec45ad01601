"""A changed heartbeat reads its host's work once (`selectors.host_holds`), and its answer is
still the desired set as the database has it after the heartbeat: its own moves applied to
what it read when the host's version says nobody else moved anything
(`fastpath.only_own`), otherwise confirmed by a narrow read (`host_holds_after`) or read again.

Real PostgreSQL and Redis; a change "during" a heartbeat is made by another thread while the
heartbeat waits, after it read the host's work and before it moves any.
"""

from __future__ import annotations

import hashlib
import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from agents import fastpath
from agents.models import Host
from agents.selectors import host_desired_containers, host_holds, host_holds_after
from agents.services import heartbeat
from agents.services.logs import workload_logs_request
from scheduler.choices import State
from scheduler.models import Workload
from scheduler.services import workload_stop, workload_transition
from tests.agents.test_agent_api import assert_error, beat_body, place, post, state
from tests.agents.test_fastpath import HB, beat, region, registered, triggered  # noqa: F401 (fixtures)

pytestmark = pytest.mark.django_db(transaction=True)


def fresh_answer(host_id: str) -> list[dict]:
    return [d.to_dict() for d in host_desired_containers(host=Host.objects.get(pk=host_id))]


def running(desired: list[dict]) -> list[dict]:
    return [{"instance_id": d["instance_id"], "container_id": f"c{i}", "state": "running"}
            for i, d in enumerate(desired)]


def token_version(token: str) -> str | None:
    """The version under which Redis knows `token` (None: it does not)."""
    raw = fastpath._redis().get(f"{fastpath._prefix()}tok:{hashlib.sha256(token.encode()).hexdigest()}")
    return None if raw is None else raw.decode().split("|")[1]


def during_heartbeat(monkeypatch, change) -> None:
    """Run `change()` once in the next heartbeat, after it read the host's work and before it
    moves any (as another request or the scheduler would: in a thread of its own, waited for)."""
    orig = heartbeat.containers_observe
    done = []

    def other() -> None:
        try:
            change()
        finally:
            connection.close()

    def wrapped(**kw):
        if not done:
            done.append(1)
            t = threading.Thread(target=other)
            t.start()
            t.join()
        return orig(**kw)

    monkeypatch.setattr(heartbeat, "containers_observe", wrapped)


def test_a_changed_heartbeats_answer_is_the_desired_set_read_again(client, registered, alice):
    host_id, token = registered
    host = Host.objects.get()
    for _ in range(2):
        place(host, alice.tenant)
    desired = beat(client, host_id, token, 1)["desired"]
    assert len(desired) == 2 and desired == fresh_answer(host_id)
    answer = beat(client, host_id, token, 2, containers=running(desired))["desired"]
    assert answer == fresh_answer(host_id) and len(answer) == 2


def test_after_its_own_moves_alone_the_next_heartbeat_is_known_by_its_token(client, registered, alice):
    host_id, token = registered
    place(Host.objects.get(), alice.tenant)
    desired = beat(client, host_id, token, 1)["desired"]
    beat(client, host_id, token, 2, containers=running(desired))
    assert token_version(token) == fastpath.version(host_id=host_id)


def test_work_placed_during_a_heartbeat_is_in_its_answer(client, registered, alice, monkeypatch):
    host_id, token = registered
    host = Host.objects.get()
    w = place(host, alice.tenant)
    desired = beat(client, host_id, token, 1)["desired"]
    placed = []
    during_heartbeat(monkeypatch, lambda: placed.append(place(host, alice.tenant)))
    answer = beat(client, host_id, token, 2, containers=running(desired))["desired"]
    assert state(w) == State.RUNNING
    assert sorted(d["instance_id"].split(".")[0] for d in answer) == sorted([str(w.pk), str(placed[0].pk)])
    assert answer == fresh_answer(host_id)
    # somebody else moved the host: the token stays known only under the version before
    assert token_version(token) != fastpath.version(host_id=host_id)


def test_work_stopped_during_a_heartbeat_leaves_its_answer(client, registered, alice, monkeypatch):
    host_id, token = registered
    host = Host.objects.get()
    w, other = place(host, alice.tenant), place(host, alice.tenant)
    desired = beat(client, host_id, token, 1)["desired"]
    mine = [d for d in desired if d["instance_id"].startswith(str(w.pk))]
    during_heartbeat(monkeypatch, lambda: workload_stop(workload=other))
    answer = beat(client, host_id, token, 2, containers=running(mine))["desired"]
    assert [d["instance_id"].split(".")[0] for d in answer] == [str(w.pk)]
    assert answer == fresh_answer(host_id)


def test_holds_after_confirm_or_read_again(registered, alice):
    host = Host.objects.get()
    w, other = place(host, alice.tenant), place(host, alice.tenant)
    before = host_holds(host=host)
    assert workload_transition(workload=w, to=State.STARTING)
    # our own move: confirmed, in its new state
    after = host_holds_after(host=host, holds=before, moved={str(w.pk)})
    assert {h.pk: h.state for h in after} == {w.pk: State.STARTING, other.pk: State.SCHEDULED}
    # somebody else's move of a hold we did not move: read again, whole
    before = host_holds(host=host)
    assert workload_transition(workload=other, to=State.STARTING)
    again = host_holds_after(host=host, holds=before, moved=set())
    assert {h.pk: h.state for h in again} == {w.pk: State.STARTING, other.pk: State.STARTING}
    assert [h.workload.state for h in again] == [h.state for h in again]


def test_a_host_deleted_while_its_token_is_known_is_refused(client, registered, alice):
    host_id, token = registered
    beat(client, host_id, token, 1)
    beat(client, host_id, token, 2)  # the token is in Redis now
    Host.objects.all().delete()  # as the admin's delete does: no service is called
    # a changed heartbeat (its containers differ) takes the slow path with the token known
    resp = post(client, HB, beat_body(host_id, 3, containers=[
        {"instance_id": "x.1", "container_id": "c", "state": "running"}]), token=token)
    assert_error(resp, 401, "authentication_failed")


def test_a_body_naming_another_host_is_refused_as_before(client, registered):
    host_id, token = registered
    beat(client, host_id, token, 1)
    beat(client, host_id, token, 2)
    other = "00000000-0000-0000-0000-000000000001"
    assert_error(post(client, HB, beat_body(other, 3), token=token), 401, "authentication_failed")


def test_run_time_is_the_containers_own_as_reported(client, registered, alice):
    host_id, token = registered
    w = place(Host.objects.get(), alice.tenant, kind="job")
    [desired] = beat(client, host_id, token, 1)["desired"]
    queued = timezone.now() - timedelta(seconds=60)
    Workload.objects.filter(pk=w.pk).update(queued_at=queued)  # queued a minute ago
    start, end = queued + timedelta(seconds=10), queued + timedelta(seconds=30)
    report = {"instance_id": desired["instance_id"], "container_id": "c1", "state": "running",
              "started_at": start.isoformat()}
    beat(client, host_id, token, 2, containers=[report])
    w.refresh_from_db()
    assert (w.state, w.started_at) == (State.RUNNING, start)
    beat(client, host_id, token, 3, containers=[{**report, "state": "exited", "exit_code": 0,
                                                 "finished_at": end.isoformat()}])
    w.refresh_from_db()
    assert (w.state, w.started_at, w.ended_at) == (State.SUCCEEDED, start, end)


def test_a_log_request_made_during_a_heartbeat_rides_on_its_answer(client, registered, alice, monkeypatch):
    host_id, token = registered
    w = place(Host.objects.get(), alice.tenant)
    [desired] = beat(client, host_id, token, 1)["desired"]
    assert beat(client, host_id, token, 2)["logs_requests"] == []
    during_heartbeat(monkeypatch, lambda: workload_logs_request(workload=w, tail=50))
    answer = beat(client, host_id, token, 3, containers=running([desired]))
    assert answer["logs_requests"] == [{"instance_id": desired["instance_id"], "tail": 50}]
