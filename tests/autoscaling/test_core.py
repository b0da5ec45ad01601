"""The autoscaling decision as tables: plain data in, a decision out (autoscaling/core.py)."""
from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from autoscaling.core import (
    Group,
    Member,
    Pool,
    ScheduledAction,
    Step,
    StepPolicy,
    TargetPolicy,
    billing_mix,
    cron_last_fire,
    cron_valid,
    decide,
    members_mean,
    step_decision,
    target_proposal,
    window_mean,
)

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def members(n: int, state: str = "running", **kw) -> tuple[Member, ...]:
    return tuple(Member(id=f"m{i}", state=state, billing=kw.get("billing", "on_demand"),
                        protected=kw.get("protected", False), launched_at=NOW - timedelta(minutes=60 - i))
                 for i in range(n))


def util(value: float | None, **kw) -> TargetPolicy:
    return TargetPolicy(id="p", name="util", metric="gpu_util", target=kw.pop("target", 50.0), value=value, **kw)


@pytest.mark.parametrize(("current", "value", "target", "max_step", "want"), [
    (2, 90, 50, 10, 4),     # ceil(2 * 90 / 50) = ceil(3.6)
    (4, 90, 50, 10, 8),     # ceil(7.2)
    (4, 90, 50, 2, 6),      # bounded by max_step
    (5, 10, 50, 10, 1),     # ceil(1.0): scale in
    (5, 10, 50, 3, 2),      # scale-in bounded by max_step too
    (3, 50, 50, 10, 3),     # on target: no change
    (3, 51, 50, 10, 4),     # ceil(3.06): any excess adds one
    (0, 90, 50, 10, 0),     # no members, no utilisation to scale by
    (3, None, 50, 10, None),  # no data (everyone warming up): no proposal
])
def test_target_tracking_formula(current, value, target, max_step, want):
    assert target_proposal(util(value, target=target, max_step=max_step), current=current) == want


def test_queue_backlog_scales_from_zero():
    p = TargetPolicy(id="q", name="backlog", metric="queue_backlog_per_instance", target=2, value=6)
    assert target_proposal(p, current=0) == 3  # 6 queued jobs, 2 per instance


@pytest.mark.parametrize(("on_demand", "spot", "base", "percent", "want"), [
    (0, 0, 1, 0, "on_demand"),   # the base first
    (1, 0, 1, 0, "spot"),        # above the base: 0 % on demand
    (1, 0, 1, 50, "on_demand"),  # second member: ceil(1 * 50 %) = 1 on demand above the base
    (2, 0, 1, 50, "spot"),
    (2, 1, 1, 50, "on_demand"),  # fourth: ceil(3 * 50 %) = 2 above the base
    (0, 0, 0, 100, "on_demand"),
])
def test_billing_mix(on_demand, spot, base, percent, want):
    assert billing_mix(on_demand=on_demand, spot=spot, base=base, percent=percent) == want


def test_scale_out_launches_within_max_and_stops_there():
    g = Group(min_size=1, max_size=5, desired=2, members=members(2), policies=(util(90),))
    d = decide(g, NOW)
    assert (d.desired, len(d.launch), d.scaled_out) == (4, 2, True)
    assert d.activities[0].cause.startswith("scaled 2 → 4: avg GPU util 90 % > target 50 % for 3 min")
    g2 = replace(g, desired=4, members=members(4), last_scale_out_at=NOW)
    assert decide(g2, NOW + timedelta(seconds=30)).desired == 4  # scale-out cooldown
    d3 = decide(g2, NOW + timedelta(seconds=61))
    assert (d3.desired, len(d3.launch)) == (5, 1)  # ceil(7.2) bounded by max 5
    g4 = replace(g, desired=5, members=members(5), last_scale_out_at=NOW + timedelta(seconds=61))
    d4 = decide(g4, NOW + timedelta(minutes=10))
    assert (d4.desired, d4.launch, d4.activities) == (5, [], [])  # at max: nothing


def test_scale_in_waits_its_cooldown_then_goes_to_min_never_removing_protected():
    ms = members(5)
    ms = (replace(ms[4], protected=True), *ms[:4])  # the newest is protected
    g = Group(min_size=1, max_size=5, desired=5, members=ms, policies=(util(10),),
              last_scale_out_at=NOW - timedelta(seconds=100))
    assert decide(g, NOW).desired == 5  # 100 s since the last scaling < 300 s
    d = decide(g, NOW + timedelta(seconds=200))
    assert (d.desired, d.scaled_in) == (1, True)
    assert "m4" not in [mid for mid, _ in d.terminate] and len(d.terminate) == 4
    assert "avg GPU util 10 % < target 50 %" in d.activities[0].cause


def test_protected_members_are_kept_above_desired_with_a_note():
    g = Group(min_size=0, max_size=3, desired=0, members=members(2, protected=True))
    d = decide(g, NOW)
    assert d.terminate == [] and "2 protected members kept" in d.activities[0].cause


def test_scale_in_takes_members_not_yet_running_first_then_the_newest():
    old = NOW - timedelta(hours=2)
    ms = (*members(3), Member(id="p", state="pending", billing="spot", protected=False, launched_at=old))
    d = decide(Group(min_size=0, max_size=5, desired=2, members=ms), NOW)
    assert [mid for mid, _ in d.terminate] == ["p", "m2"]


def test_ended_members_are_replaced_and_spot_interruptions_on_demand():
    ms = (*members(1), replace(members(2)[1], state="lost"),
          Member(id="s", state="preempted", billing="spot", protected=False, launched_at=NOW))
    d = decide(Group(min_size=0, max_size=5, desired=3, on_demand_percent=0, members=ms), NOW)
    assert sorted(mid for mid, _ in d.detach) == ["m1", "s"]
    assert d.launch == ["on_demand", "spot"]  # the spot interruption's replacement on demand, then the mix
    assert any("spot interruption" in a.cause for a in d.activities)


def test_a_stopping_member_is_neither_counted_nor_replaced_yet():
    ms = (*members(1), replace(members(2)[1], state="stopping"))
    d = decide(Group(min_size=0, max_size=5, desired=2, members=ms), NOW)
    assert d.detach == [] and d.launch == ["on_demand"]


@pytest.mark.parametrize(("demand", "gpi", "desired", "min_", "max_", "last", "want"), [
    (6, 2, 0, 0, 10, None, 3),   # ceil(6 / 2)
    (7, 2, 0, 0, 10, None, 4),   # ceil(3.5)
    (40, 2, 0, 0, 10, None, 10),  # bounded by max
    (0, 2, 3, 0, 10, None, 0),   # drained: to zero
    (0, 2, 3, 1, 10, None, 1),   # ... or to min
    (0, 2, 3, 0, 10, 60, 3),     # shrinking waits the cooldown (300 s)
    (9, 2, 3, 0, 10, 10, 5),     # growing does not
])
def test_batch_pool_formula(demand, gpi, desired, min_, max_, last, want):
    g = Group(min_size=min_, max_size=max_, desired=desired, members=members(desired),
              pool=Pool(queue="render", demand_gpus=demand, gpus_per_instance=gpi),
              last_scale_out_at=None if last is None else NOW - timedelta(seconds=last))
    assert decide(g, NOW).desired == want


def test_several_policies_scale_out_by_the_largest_and_in_only_when_all_agree():
    a, b = util(90), replace(util(20), id="b", name="b")
    g = Group(min_size=0, max_size=10, desired=4, members=members(4), policies=(a, b))
    assert decide(g, NOW).desired == 8
    c = replace(util(40), id="c", name="c")
    g2 = replace(g, policies=(b, c))
    assert decide(g2, NOW).desired == 4  # c wants ceil(3.2)=4: no scale-in
    g3 = replace(g, policies=(b, replace(util(20), id="d", name="d", target=40)))
    assert decide(g3, NOW).desired == 2  # ceil(1.6) and ceil(2.0): the larger


def test_cron_in_a_time_zone():
    assert cron_valid("0 9 * * 1-5") and not cron_valid("0 9 * *") and not cron_valid("61 * * * *")
    after = datetime(2026, 12, 3, 7, 0, tzinfo=UTC)
    # 09:00 in Berlin is 08:00 UTC in December
    assert cron_last_fire("0 9 * * *", "Europe/Berlin", after, datetime(2026, 12, 3, 7, 59, tzinfo=UTC)) is None
    at = cron_last_fire("0 9 * * *", "Europe/Berlin", after, datetime(2026, 12, 3, 8, 0, tzinfo=UTC))
    assert at is not None and at.astimezone(UTC).hour == 8
    assert cron_last_fire("0 9 * * *", "Europe/Berlin", at, datetime(2026, 12, 3, 9, 0, tzinfo=UTC)) is None


def test_a_scheduled_action_fires_once_at_its_time_and_pauses_the_policies():
    s = ScheduledAction(id="s", name="morning", cron="0 9 * * *", timezone="UTC", after=NOW - timedelta(hours=4),
                        min_size=2, desired=4)
    g = Group(min_size=0, max_size=10, desired=1, members=members(1), scheduled=(s,), policies=(util(10),))
    assert decide(g, datetime(2026, 12, 3, 8, 59, tzinfo=UTC)).fired == []
    d = decide(g, datetime(2026, 12, 3, 9, 0, 30, tzinfo=UTC))
    assert (d.fired, d.min_size, d.desired, len(d.launch)) == (["s"], 2, 4, 3)
    assert "min 0 → 2, desired 1 → 4" in d.activities[0].cause


@pytest.mark.parametrize(("kind", "steps", "breach", "state", "want"), [
    ("change_in_capacity", [(0, 10, 1), (10, None, 3)], 5, "ALARM", 5),
    ("change_in_capacity", [(0, 10, 1), (10, None, 3)], 25, "ALARM", 7),
    ("change_in_capacity", [(0, 10, 1), (10, None, 3)], None, "ALARM", 5),  # no breach size: first step
    ("change_in_capacity", [(0, 10, 1)], 5, "OK", None),
    ("change_in_capacity", [(None, 0, -2)], -5, "ALARM", 2),
    ("exact_capacity", [(0, None, 8)], 1, "ALARM", 8),
    ("exact_capacity", [(0, None, 50)], 1, "ALARM", 10),  # bounded by max
    ("percent_change_in_capacity", [(0, None, 50)], 1, "ALARM", 6),
    ("percent_change_in_capacity", [(0, None, 10)], 1, "ALARM", 5),  # at least one
])
def test_step_scaling(kind, steps, breach, state, want):
    p = StepPolicy(name="up", adjustment_type=kind, steps=tuple(Step(*s) for s in steps))
    out = step_decision(p, min_size=1, max_size=10, desired=4, alarm_state=state, reason="util > 80",
                        breach=breach, now=NOW)
    assert (out[0] if out else None) == want


def test_step_scaling_waits_its_cooldown():
    p = StepPolicy(name="up", adjustment_type="change_in_capacity", steps=(Step(0, None, 1),), cooldown_s=300,
                   last_run_at=NOW - timedelta(seconds=100))
    kw = dict(min_size=0, max_size=10, desired=1, alarm_state="ALARM", reason="r", breach=1.0)
    assert step_decision(p, now=NOW, **kw) is None
    assert step_decision(p, now=NOW + timedelta(seconds=200), **kw)[0] == 2


# ------------------------------------------------------------------ warm-up and the window (issue 28)

def series(start_ago: int, end_ago: int = 0, every: int = 5, value: float = 10.0) -> list:
    """Samples every `every` s from `start_ago` s before NOW to `end_ago` s before it."""
    return [(NOW - timedelta(seconds=s), value) for s in range(end_ago, start_ago + 1, every)]


@pytest.mark.parametrize(("ran_s", "samples", "want"), [
    (41, series(11), None),            # the report: 30 s warm-up, 11 s of data for a 3-minute window
    (209, series(179), None),          # warm-up ended 179 s ago: one second of the window inside it
    (210, series(179), 10.0),          # warm-up ended exactly at the window's start: covered
    (3600, series(179), 10.0),
    (3600, series(60), None),          # running an hour, but samples only for the last minute
    (3600, series(179, end_ago=40), None),  # the reports stopped 40 s ago
    (3600, series(170, every=10), 10.0),    # within the slack (15 s) at either end
    (3600, [], None),
])
def test_a_window_counts_only_data_that_exists(ran_s, samples, want):
    got = window_mean(samples, running_since=NOW - timedelta(seconds=ran_s), warmup_s=30, window_s=180, now=NOW,
                      slack_s=15)
    assert got == want


def test_the_group_metric_averages_only_members_with_data():
    assert members_mean([None, None]) is None
    assert members_mean([None, 20.0, 40.0]) == 30.0


def test_no_scale_in_while_a_member_warms_up():
    fresh = tuple(replace(m, running_since=NOW - timedelta(seconds=41), launched_at=NOW - timedelta(seconds=45))
                  for m in members(2))
    g = Group(min_size=1, max_size=4, desired=2, warmup_s=120, members=fresh, policies=(util(10),))
    assert (decide(g, NOW).desired, decide(g, NOW).terminate) == (2, [])
    # past the warm-up the same metric scales in
    assert decide(g, NOW + timedelta(seconds=80)).desired == 1
    # scale-out is not held: new members may be needed precisely because others are warming
    assert decide(replace(g, policies=(util(90),)), NOW).desired == 4
    # a member that waits for capacity counts from its launch, so it cannot hold scale-in for ever
    waiting = Member(id="w", state="pending", billing="on_demand", protected=False,
                     launched_at=NOW - timedelta(hours=1))
    g2 = replace(g, desired=3, members=(*members(2), waiting))
    assert decide(g2, NOW).desired == 1
