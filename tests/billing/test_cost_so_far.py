""""Cost so far" of an instance: what the ledger posted plus what metering has not posted yet,
read from the transition log by metering's own rules (issue 28: a start showed 0.00)."""
from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from billing import pricing, services
from billing.selectors import workload_costs
from gpucloud.catalogue.models import Price
from scheduler.choices import State
from scheduler.models import Workload
from tests.billing.helpers import make_run, set_price

pytestmark = pytest.mark.django_db


def _only_price(per_hour: str, since):
    Price.objects.filter(instance_type__code="h100.1x").delete()  # the seed's price starts now
    set_price("h100.1x", per_hour, since=since)


def _cost(actor, w) -> Decimal:
    return Decimal(actor.client().get(f"/api/v1/instances/{w.pk}").json()["cost_so_far"])


def test_an_instance_started_again_shows_its_earlier_runs_before_metering_posts_them(alice, catalog):
    now = timezone.now().replace(microsecond=0)
    _only_price("3.6000", since=now - timedelta(hours=2))  # 0.001 a second
    m = lambda minutes: now - timedelta(minutes=minutes)  # noqa: E731
    w = make_run(alice, transitions=[(m(40), State.PENDING), (m(30), State.RUNNING), (m(20), State.STOPPING),
                                     (m(20), State.STOPPED)])
    Workload.objects.filter(pk=w.pk).update(started_at=m(30))  # as the lifecycle stamps it
    ran = Decimal("0.60")  # 600 s at 3.60/h
    assert _cost(alice, w) == ran
    # started again: back in the queue (which clears started_at), then running for a while
    w = make_run(alice, name="again", transitions=[(m(40), State.PENDING), (m(30), State.RUNNING),
                                                    (m(20), State.STOPPING), (m(20), State.STOPPED),
                                                    (m(1), State.PENDING)])
    assert _cost(alice, w) == ran, "a start must not hide what the instance already cost"
    w2 = make_run(alice, name="running", transitions=[(m(40), State.PENDING), (m(30), State.RUNNING),
                                                      (m(20), State.STOPPING), (m(20), State.STOPPED),
                                                      (m(10), State.PENDING), (m(5), State.RUNNING)])
    Workload.objects.filter(pk=w2.pk).update(started_at=m(5))
    assert _cost(alice, w2) >= ran + Decimal("0.30")  # both runs, the second still running


def test_cost_so_far_counts_each_second_once_as_metering_catches_up(alice, catalog):
    now = timezone.now().replace(microsecond=0)
    _only_price("3.6000", since=now - timedelta(hours=2))
    m = lambda minutes: now - timedelta(minutes=minutes)  # noqa: E731
    w = make_run(alice, transitions=[(m(50), State.PENDING), (m(45), State.RUNNING), (m(30), State.STOPPING),
                                     (m(30), State.STOPPED), (m(20), State.PENDING), (m(19), State.RUNNING)])
    exact = pricing.cents(Decimal("0.001") * (15 * 60 + 19 * 60))
    seen = [workload_costs(workloads=[w], now=now)[w.pk].so_far]
    for minutes in (25, 10, 0):  # metering runs at several points in the past: posted + unposted stays the same
        services.metering_run(now=m(minutes))
        seen.append(workload_costs(workloads=[w], now=now)[w.pk].so_far)
    assert seen == [exact] * 4, seen
