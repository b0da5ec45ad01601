"""A changed heartbeat reads in its own host UPDATE what its answer needs: the host's work
(`selectors.host_holds`), and whether the host has volume work (`heartbeat.BeatRead`, registered
by volumes): a host without any answers with no volume query of its own; a host with some gets
the same removals and move orders as `agents.signals` reads. Work that a failing GPU moved in
the same heartbeat is read again.

Real PostgreSQL and Redis, heartbeats through the agent API (the fast path's claim).
"""
from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agents.models import Host
from agents.protocol import GpuSample, Heartbeat, ObservedContainer
from agents.selectors import holds_sql, host_attempts
from agents.services.heartbeat import host_heartbeat
from agents.signals import move_orders, removals
from scheduler.choices import State
from tests.agents.test_agent_api import place, state
from tests.agents.test_fastpath import beat, region, registered, sample, triggered  # noqa: F401 (fixtures)
from tests.agents.test_h1_heartbeat_holds import fresh_answer, running
from volumes.models import Volume, VolumeMove

pytestmark = pytest.mark.django_db(transaction=True)

WORK_QUERY = "UNION ALL SELECT 'p'"  # volumes.moves._host_volume_work's own query


def test_a_host_without_volume_work_answers_without_a_volume_query(client, registered, alice):
    host_id, token = registered
    place(Host.objects.get(), alice.tenant)
    with CaptureQueriesContext(connection) as q:
        answer = beat(client, host_id, token, 1)
    assert len(answer["desired"]) == 1
    assert answer["remove_volumes"] == [] and answer["volume_moves"] == []
    sqls = [c["sql"] for c in q.captured_queries]
    assert any("volumes_volumemove" in s for s in sqls if "UPDATE agents_host" in s)  # read with the host row
    assert not any(WORK_QUERY in s for s in sqls)


def test_a_host_with_volume_work_gets_it_in_the_answer(client, registered, alice):
    host_id, token = registered
    host = Host.objects.get()
    other = Host.objects.create(name="other", region=host.region, vcpus=8, memory_mib=1024)
    place(host, alice.tenant)
    now = timezone.now()
    purged = Volume.objects.create(tenant=alice.tenant, name="gone", size_gib=10, region=host.region, host=host,
                                   deleted_at=now, purged_at=now)
    moving = Volume.objects.create(tenant=alice.tenant, name="moving", size_gib=10, region=host.region, host=host)
    VolumeMove.objects.create(volume=moving, source=host, target=other, state=VolumeMove.COPYING)
    with CaptureQueriesContext(connection) as q:
        answer = beat(client, host_id, token, 1)
    assert sum(WORK_QUERY in c["sql"] for c in q.captured_queries) == 1  # read once for both lists
    assert answer["remove_volumes"] == removals(host=host) == [purged.docker_name]
    assert answer["volume_moves"] == [o.to_dict() for o in move_orders(host=host)]
    assert [(o["volume"], o["role"]) for o in answer["volume_moves"]] == [(moving.docker_name, "send")]


def test_a_changed_heartbeat_reads_its_hosts_work_with_the_host_row(client, registered, alice):
    host_id, token = registered
    place(Host.objects.get(), alice.tenant, kind="job")
    place(Host.objects.get(), alice.tenant)
    report = running(beat(client, host_id, token, 1)["desired"])
    with CaptureQueriesContext(connection) as q:
        answer = beat(client, host_id, token, 2, containers=report)["desired"]
    reads = [c["sql"] for c in q.captured_queries if holds_sql().split(" FROM ")[0] in c["sql"]]
    assert len(reads) == 1 and "UPDATE agents_host" in reads[0]
    assert answer == fresh_answer(host_id) and len(answer) == 2


def test_work_a_failing_gpu_moved_is_read_again(registered, alice):
    host_id, _token = registered
    host = Host.objects.get()
    w = place(host, alice.tenant, kind="job")
    (iid,) = host_attempts(host=host)
    hb = Heartbeat(host_id=host_id, seq=1, gpus=[GpuSample.from_dict(sample(0, xid_events=[79])),
                                                GpuSample.from_dict(sample(1))],
                   containers=[ObservedContainer(instance_id=iid, state="running")])
    outcome = host_heartbeat(host=Host(pk=host.pk), hb=hb, fresh=True)
    assert state(w) == State.FAILED
    assert outcome.holds == []  # read after the GPU's failure moved the job, as without the host row's read
