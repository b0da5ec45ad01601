"""The bound on starting (issue 27, finding 3): a workload that cannot start does not hold its
GPUs for free. The agent's failed starts are bounded in number (tests/agents/test_agent_api.py
and the agent's own tests), the time in SCHEDULED/STARTING by the periodic check here, with the
simulated runtime: FAILED with the runtime's last message, GPUs released, nothing billed."""
from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from django.conf import settings
from django.utils import timezone
from test_agent_api import make_sim_host, place, region, state, triggered  # noqa: F401 - fixtures by name

from agents.choices import HostState
from agents.models import Gpu, Host
from billing.models import LedgerEntry
from billing.services import metering_run
from gpucloud.catalogue.models import InstanceType
from gpucloud.catalogue.services import price_set
from gpucloud.celery import app
from scheduler.choices import State
from scheduler.models import Allocation
from scheduler.services import workloads_start_overdue


def test_work_still_starting_past_the_bound_fails_with_the_runtimes_message_and_frees_its_gpus(
        make_sim_host, region, alice):
    sim = make_sim_host(fail_images=frozenset({"nope/slow:1"}))
    sim.agent.clock = sim.clock
    # in force before anything here exists (metering starts a meter at its workload's creation,
    # floored to the second: a price set in the same second would not cover its start)
    price_set(instance_type=InstanceType.objects.get(code="h100.1x"), region=region, kind="on_demand",
              per_hour=Decimal("2.50"), effective_from=timezone.now() - timedelta(minutes=1))
    sim.beat()
    w = place(sim.host, alice.tenant, image="nope/slow:1")
    fine = place(sim.host, alice.tenant)
    sim.beat(2)  # one failed start (of 3): it waits out its backoff, still SCHEDULED, holding GPUs
    assert state(w) == State.SCHEDULED and "pull access denied" in w.reason
    assert state(fine) == State.RUNNING
    bound = settings.WORKLOAD_START_TIMEOUT_S
    placed = w.events.get(to_state=State.SCHEDULED).created_at
    assert workloads_start_overdue(now=placed + timedelta(seconds=bound - 1)) == []  # within it: left alone
    assert workloads_start_overdue(now=placed + timedelta(seconds=bound + 1)) == [w.pk]
    assert state(w) == State.FAILED
    assert w.reason == f"did not start within {bound} s: pull access denied for nope/slow:1"
    assert not Allocation.objects.filter(workload=w, active=True).exists()
    assert state(fine) == State.RUNNING  # running work is not the bound's
    sim.beat()  # the agent no longer has it desired: nothing tried again
    assert [d.instance_id for d in sim.agent.desired] != [] and all(
        not d.instance_id.startswith(str(w.pk)) for d in sim.agent.desired)
    assert Gpu.objects.filter(host=sim.host, used_milli__gt=0).count() == 1  # the running one's only
    metering_run(now=timezone.now() + timedelta(hours=2))
    assert not LedgerEntry.objects.filter(workload=w).exists()  # never ran: nothing billed
    assert LedgerEntry.objects.filter(workload=fine).exists()  # (what ran is)


def test_work_on_a_down_host_is_left_to_the_liveness_rule(make_sim_host, alice):
    sim = make_sim_host()
    sim.beat()
    w = place(sim.host, alice.tenant)
    Host.objects.filter(pk=sim.host.pk).update(state=HostState.DOWN)
    later = timezone.now() + timedelta(seconds=settings.WORKLOAD_START_TIMEOUT_S + 1)
    assert workloads_start_overdue(now=later) == []
    assert state(w) == State.SCHEDULED  # LOST after the grace instead (no retry spent)


def test_the_check_is_in_the_beat_schedule():
    entry = app.conf.beat_schedule["start-overdue"]
    assert entry["task"] == "scheduler.tasks.workloads_start_overdue_task"
    assert entry["schedule"] <= 60
