"""The changed-heartbeat bulk path stores what the one-by-one path stored.

Two hosts get the same work in the same states; the same heartbeat (containers running, jobs
exited 0 with and without having been seen running, an exit 1, an instance that exited, one
still running) goes through `host_heartbeat(bulk=False)` on one and `bulk=True` on the other.
The workloads, their events, allocations and the hosts' and GPUs' books must come out equal,
and both must be what the one container rule (scheduler.container) says.
"""
from __future__ import annotations

from dataclasses import replace

import pytest

from agents.models import Gpu, Host
from agents.protocol import Heartbeat, ObservedContainer
from agents.selectors import host_attempts
from agents.services import containers
from agents.services.heartbeat import host_heartbeat
from scheduler.choices import State
from scheduler.container import container_next
from scheduler.models import Allocation, Workload
from scheduler.services import workload_transition
from tests.agents.test_agent_api import place, region, triggered  # noqa: F401
from tests.scheduler.fleet import make_hosts

pytestmark = pytest.mark.django_db(transaction=True)

# (name, kind, state before, what the container reports, exit code)
SCENARIO = [
    ("sched-running", "job", State.SCHEDULED, "running", None),
    ("starting-running", "job", State.STARTING, "running", None),
    ("sched-exit0", "job", State.SCHEDULED, "exited", 0),
    ("running-exit0", "job", State.RUNNING, "exited", 0),
    ("running-exit0-b", "job", State.RUNNING, "exited", 0),
    ("running-exit1", "job", State.RUNNING, "exited", 1),
    ("instance-exited", "instance", State.RUNNING, "exited", 0),
    ("still-running", "instance", State.RUNNING, "running", None),
]


def _setup(host: Host, tenant) -> Heartbeat:
    for name, kind, before, _, _ in SCENARIO:
        w = place(host, tenant, kind=kind)
        Workload.objects.filter(pk=w.pk).update(name=name)
        w.refresh_from_db()
        if before in (State.STARTING, State.RUNNING):
            assert workload_transition(workload=w, to=State.STARTING, reason="setup")
        if before == State.RUNNING:
            assert workload_transition(workload=w, to=State.RUNNING, reason="setup")
    attempts = host_attempts(host=host)
    by_name = {w.name: iid for iid, w in attempts.items()}
    containers = [ObservedContainer(instance_id=by_name[name], state=reported, exit_code=code)
                  for name, _, _, reported, code in SCENARIO]
    return Heartbeat(host_id=str(host.pk), seq=5, containers=containers)


def _stored(host: Host) -> dict:
    work = {}
    for w in Workload.objects.filter(allocations__host=host).distinct():
        work[w.name] = (w.state, w.exit_code, w.reason, w.started_at is not None, w.ended_at is not None,
                        [(e.from_state, e.to_state, e.reason) for e in w.events.order_by("created_at", "id")],
                        Allocation.objects.filter(workload=w, active=True).count())
    host.refresh_from_db()
    gpus = sorted((g.index, g.used_milli, g.whole) for g in Gpu.objects.filter(host=host))
    return {"work": work, "host": (host.used_vcpus, host.used_memory_mib), "gpus": gpus}


def test_the_bulk_path_stores_what_the_one_by_one_path_stored(region, alice, triggered):  # noqa: F811
    one, many = make_hosts(n=2)
    hb_one, hb_many = _setup(one, alice.tenant), _setup(many, alice.tenant)

    out_one = host_heartbeat(host=one, hb=hb_one, bulk=False)
    out_many = host_heartbeat(host=many, hb=hb_many, bulk=True)

    a, b = _stored(one), _stored(many)
    assert a == b
    assert sorted(s for _, s in out_one.transitions) == sorted(s for _, s in out_many.transitions)
    # and it did something: every case moved as the lifecycle says
    states = {name: row[0] for name, row in b["work"].items()}
    assert states == {"sched-running": State.RUNNING, "starting-running": State.RUNNING,
                      "sched-exit0": State.SUCCEEDED, "running-exit0": State.SUCCEEDED,
                      "running-exit0-b": State.SUCCEEDED, "running-exit1": State.FAILED,
                      "instance-exited": State.FAILED, "still-running": State.RUNNING}
    assert b["work"]["sched-exit0"][5][-2:] == [(State.SCHEDULED, State.RUNNING, "container running"),
                                               (State.RUNNING, State.SUCCEEDED, "exited with code 0")]


def test_both_paths_apply_the_one_container_rule(region, alice, triggered, monkeypatch):  # noqa: F811
    """Neither path has a rule of its own: a container rule that words its reasons differently
    is asked about every container, by both, and what it says is what both store."""
    asked = []

    def rule(current, report, **kw):
        asked.append((current, report))
        return [replace(s, reason=f"{s.reason} (the rule)") for s in container_next(current, report, **kw)]

    monkeypatch.setattr(containers, "container_next", rule)
    one, many = make_hosts(n=2)
    hb_one, hb_many = _setup(one, alice.tenant), _setup(many, alice.tenant)

    host_heartbeat(host=one, hb=hb_one, bulk=False)
    one_by_one = list(asked)
    host_heartbeat(host=many, hb=hb_many, bulk=True)

    assert one_by_one == asked[len(one_by_one):] and len(one_by_one) == len(SCENARIO)
    a, b = _stored(one), _stored(many)
    assert a == b
    moved = [(name, e) for name, row in b["work"].items() for e in row[5]
             if e[0] != State.PENDING and e[2] != "setup"]
    assert len(moved) == 8 and all(e[2].endswith("(the rule)") for _, e in moved), moved
