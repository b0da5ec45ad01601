"""The preemption notice as data (scheduler/notice.py): every giver stores a cause and a deadline
through one service, the countdown is put into words from `stop_by` where it is shown, and
nothing parses the words back."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta
from datetime import timezone as tz

import pytest
from django.utils import timezone

from gpucloud.catalogue.models import InstanceType, Region
from scheduler.choices import State
from scheduler.cycle import run_cycle
from scheduler.models import Workload
from scheduler.notice import notice_served, notice_text
from scheduler.services import Notice, workload_transition, workloads_notice
from tests.scheduler.fleet import make_hosts

pytestmark = pytest.mark.django_db


def test_the_words_are_rendered_from_the_deadline():
    at = datetime(2026, 12, 3, 14, 3, 10, tzinfo=UTC)
    assert notice_text("host h1 is draining", at) == "host h1 is draining; stopping at 14:03:10 UTC"
    # the same instant seen from another zone: the same words
    assert notice_text("host h1 is draining", at.astimezone(tz(timedelta(hours=2)))).endswith("14:03:10 UTC")
    assert notice_text("", at) == "preempted; stopping at 14:03:10 UTC"
    assert (notice_served("host h1 is draining"), notice_served("")) == ("host h1 is draining", "preempted")


def _placed_job(tenant, **extra) -> Workload:
    make_hosts(n=1, gpus=8)
    w = Workload.objects.create(tenant=tenant, kind="job", name="train", image="busybox",
                                instance_type=InstanceType.objects.get(code="h100.1x"),
                                region=Region.objects.get(code="us-east-1"), **extra)
    run_cycle(region_id=w.region_id)
    w.refresh_from_db()
    assert w.state == State.SCHEDULED
    return w


def test_a_notice_outlives_the_transitions_it_meets(alice, catalog):
    """Regression: the notice lived in `reason`, which the next transition overwrote, so a victim
    that started under its notice showed "container running" and ended PREEMPTED with it."""
    w = _placed_job(alice.tenant)
    now = timezone.now()
    assert workloads_notice(notices=[Notice(workload_id=w.pk, notice_s=30, cause="host h1 is draining")],
                            now=now) == [str(w.pk)]
    w.refresh_from_db()
    assert workload_transition(workload=w, to=State.RUNNING, reason="container running")
    body = alice.client().get(f"/api/v1/jobs/{w.pk}").json()
    assert body["state"] == "running"
    assert body["reason"] == notice_text("host h1 is draining", now + timedelta(seconds=30))
    run_cycle(region_id=w.region_id, now=now + timedelta(seconds=31))
    events = [(e.to_state, e.reason) for e in w.events.all()]
    assert ("preempted", "host h1 is draining") in events
    assert ("pending", "requeued after: host h1 is draining") in events
    w.refresh_from_db()
    assert (w.stop_by, w.stop_cause, w.shown_reason) == (None, "", w.reason)  # requeued: the notice is gone


def test_any_notice_lasts_the_checkpoint_grace_and_a_second_one_changes_nothing(alice, catalog):
    w = _placed_job(alice.tenant, checkpoint_signal="SIGUSR1", checkpoint_grace_s=120)
    now = timezone.now()
    # the spot price's notice is the region's 30 s: a checkpointing job still gets its 120 s
    assert workloads_notice(notices=[Notice(workload_id=w.pk, notice_s=30, cause="spot")], now=now)
    assert workloads_notice(notices=[Notice(workload_id=w.pk, notice_s=5, cause="drain")],
                            now=now + timedelta(seconds=1)) == []
    w.refresh_from_db()
    assert (w.stop_by, w.stop_cause) == (now + timedelta(seconds=120), "spot")
