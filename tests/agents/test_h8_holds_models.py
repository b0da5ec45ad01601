"""A heartbeat's hold read selects only the fields it uses; a step that needs a workload's
model gets the one the ORM would load, in the state its hold has, and the models of every
hold of the same read come in one query."""
from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agents.selectors import host_holds
from scheduler.choices import State
from scheduler.models import Workload
from scheduler.services import workload_transition
from tests.agents.test_agent_api import place, region, triggered  # noqa: F401
from tests.scheduler.fleet import make_hosts

pytestmark = pytest.mark.django_db


def test_the_models_of_a_reads_holds_come_in_one_query_as_the_orm_loads_them(region, alice, triggered):  # noqa: F811
    (host,) = make_hosts(n=1)
    work = [place(host, alice.tenant, kind=kind, env={"A": "1"}) for kind in ("job", "instance", "job")]
    assert workload_transition(workload=work[0], to=State.STARTING, reason="setup")
    holds = host_holds(host=host)
    assert [h.pk for h in holds] == [w.pk for w in work]
    holds[1].state = State.STARTING  # a move the heartbeat made after the read

    with CaptureQueriesContext(connection) as first:
        model = holds[0].workload
    with CaptureQueriesContext(connection) as rest:
        models = [h.workload for h in holds[1:]]
    assert len(first) == 1 and len(rest) == 0

    for h, m in zip(holds, [model, *models], strict=True):
        orm = Workload.objects.get(pk=h.pk)
        orm.state = h.state
        fields = [f.attname for f in Workload._meta.concrete_fields]
        assert [getattr(m, f) for f in fields] == [getattr(orm, f) for f in fields]
        assert (h.kind, h.env, h.tenant_id, h.name) == (orm.kind, orm.env, orm.tenant_id, orm.name)
    assert models[0].state == State.STARTING
    # once built, the hold's state is the model's
    holds[2].state = State.RUNNING
    assert models[1].state == State.RUNNING


def test_a_workload_deleted_since_the_read_gets_a_model_of_its_holds_fields(region, alice, triggered):  # noqa: F811
    (host,) = make_hosts(n=1)
    w = place(host, alice.tenant, kind="job")
    (hold,) = host_holds(host=host)
    Workload.objects.filter(pk=w.pk).delete()
    m = hold.workload
    assert (m.pk, m.state, m.kind, m.tenant_id, m.name) == (w.pk, w.state, w.kind, w.tenant_id, w.name)
    # no guarded update finds its row
    assert not workload_transition(workload=m, to=State.STARTING, reason="gone")
