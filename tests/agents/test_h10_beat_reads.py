"""A changed heartbeat asks whether its host has volume work in its own host UPDATE
(`heartbeat.BeatRead`, registered by volumes): a host without any answers with no volume query
of its own; a host with some gets the same removals and move orders as `agents.signals` reads.

Real PostgreSQL and Redis, heartbeats through the agent API (the fast path's claim).
"""
from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agents.models import Host
from agents.signals import move_orders, removals
from tests.agents.test_agent_api import place
from tests.agents.test_fastpath import beat, region, registered, triggered  # noqa: F401 (fixtures)
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
    assert any("volumes_volumemove" in s for s in sqls if s.startswith("UPDATE"))  # read with the host row
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
