"""The autoscaling decision: plain data in, a plain decision out. No Django, no database.

`decide(group, now)` is what one reconciliation of one group does, in this order:

1. **Scheduled actions** whose cron time (in their time zone) passed since they last ran set
   `min`, `max` and/or `desired`. When one fires, the dynamic policies wait for the next
   evaluation, so the scheduled value is what this one applies.
2. **Health**: a member whose instance ended (LOST with its host, FAILED, PREEMPTED, stopped
   by somebody) leaves the group; the group launches a replacement because it is now short
   of `desired`. A spot member ended by a spot interruption is replaced on demand.
3. **Dynamic policies** propose a new desired capacity:
   * target tracking: `ceil(current * metric / target)`, where `current` is the desired
     capacity and `metric` the average over the policy's window of the members whose data
     covers the whole window after their warm-up (`window_mean`: a 3-minute window with 41 s
     of data is not satisfied); the change is bounded by the policy's `max_step`; scale-out
     waits its `scale_out_cooldown_s` since the last scale-out, scale-in its
     `scale_in_cooldown_s` since the last scaling of either kind, and no policy scales in
     while a member is inside its warm-up (`warming`);
   * a batch pool: `ceil(GPUs of the queue's pending and running jobs / GPUs per instance)`,
     at once when growing, after the group's `cooldown_s` when shrinking.
   Any proposal above desired wins (the largest); desired shrinks only when every proposal
   with data is below it (then to the largest of them). All within `[min, max]`.
4. **Convergence**: launch members while fewer are alive than desired (billing by the
   on-demand base and percentage above it); terminate unprotected members while more are
   alive, those not yet running first, then the newest. Protected members are never chosen.

Step scaling (`step_decision`) is the same kind of function for an alarm's call.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from croniter import croniter

ALIVE = frozenset({"pending", "scheduled", "starting", "running"})
RUNNING = "running"
ENDED = frozenset({"stopped", "succeeded", "failed", "preempted", "lost"})
ON_DEMAND, SPOT = "on_demand", "spot"

METRIC_WORDS = {"gpu_util": "avg GPU util", "queue_backlog_per_instance": "queued jobs per instance"}
METRIC_UNITS = {"gpu_util": " %", "queue_backlog_per_instance": ""}


@dataclass(frozen=True)
class Member:
    id: str
    state: str  # the instance's state
    billing: str
    protected: bool
    launched_at: datetime
    reason: str = ""  # the instance's reason, for the health activity
    running_since: datetime | None = None  # when the instance last started running


@dataclass(frozen=True)
class TargetPolicy:
    id: str
    name: str
    metric: str  # gpu_util | queue_backlog_per_instance
    target: float
    value: float | None  # the metric now, as loaded (None: no data, e.g. every member warming up)
    window_s: int = 180
    scale_out_cooldown_s: int = 60
    scale_in_cooldown_s: int = 300
    max_step: int = 10
    disable_scale_in: bool = False


@dataclass(frozen=True)
class ScheduledAction:
    id: str
    name: str
    cron: str
    timezone: str
    after: datetime  # it fires for cron times after this (its last run, or its creation)
    min_size: int | None = None
    max_size: int | None = None
    desired: int | None = None


@dataclass(frozen=True)
class Pool:
    queue: str
    demand_gpus: float  # GPUs of the queue's pending and running jobs
    gpus_per_instance: float


@dataclass(frozen=True)
class Group:
    min_size: int
    max_size: int
    desired: int
    on_demand_base: int = 0
    on_demand_percent: int = 100  # of the capacity above the base
    cooldown_s: int = 300
    warmup_s: int = 0
    last_scale_out_at: datetime | None = None
    last_scale_in_at: datetime | None = None
    members: tuple[Member, ...] = ()
    policies: tuple[TargetPolicy, ...] = ()
    scheduled: tuple[ScheduledAction, ...] = ()
    pool: Pool | None = None


@dataclass(frozen=True)
class Activity:
    kind: str  # scheduled | scale_out | scale_in | replace | launch | terminate | note
    cause: str
    from_desired: int
    to_desired: int


@dataclass
class Decision:
    min_size: int
    max_size: int
    desired: int
    activities: list[Activity] = field(default_factory=list)
    fired: list[str] = field(default_factory=list)  # scheduled action ids that ran
    detach: list[tuple[str, str]] = field(default_factory=list)  # (member id, why) ended members
    launch: list[str] = field(default_factory=list)  # billing of each member to launch
    terminate: list[tuple[str, str]] = field(default_factory=list)  # (member id, why)
    scaled_out: bool = False
    scaled_in: bool = False


# ------------------------------------------------------------------ pieces


def cron_valid(expr: str) -> bool:
    return len(expr.split()) == 5 and bool(croniter.is_valid(expr))


def cron_last_fire(expr: str, tz: str, after: datetime, now: datetime) -> datetime | None:
    """The latest time of `expr` in zone `tz` within (after, now], or None."""
    zone = ZoneInfo(tz)
    prev = croniter(expr, now.astimezone(zone) + timedelta(microseconds=1)).get_prev(datetime)
    return prev if prev > after else None


def cron_next_fire(expr: str, tz: str, now: datetime) -> datetime:
    nxt: datetime = croniter(expr, now.astimezone(ZoneInfo(tz))).get_next(datetime)
    return nxt


def clamp(value: int, low: int, high: int) -> int:
    return max(low, min(high, value))


def billing_mix(*, on_demand: int, spot: int, base: int, percent: int) -> str:
    """The billing of the next member, given the alive members' mix: the first `base` on
    demand, then `percent` % of the capacity above the base on demand, the rest spot."""
    total = on_demand + spot + 1
    wanted_on_demand = min(total, base) + math.ceil(max(0, total - base) * percent / 100)
    return ON_DEMAND if on_demand < wanted_on_demand else SPOT


def target_proposal(p: TargetPolicy, *, current: int) -> int | None:
    """ceil(current * metric / target), the change bounded by max_step; None without data."""
    if p.value is None or p.target <= 0:
        return None
    if p.metric == "queue_backlog_per_instance":
        current = max(current, 1)  # from zero: one instance's worth of backlog per target
    raw = math.ceil(round(current * p.value / p.target, 9))
    change = clamp(raw - current, -p.max_step, p.max_step)
    return max(0, current + change)


def warming(m: Member, *, warmup_s: int, now: datetime) -> bool:
    """Inside its warm-up: alive, and started running (or, not running yet, launched) less than
    `warmup_s` ago. Counting a not-yet-running member from its launch bounds the hold: a member
    that waits for capacity for ever does not block scale-in for ever."""
    if m.state not in ALIVE:
        return False
    since = m.running_since if m.state == RUNNING and m.running_since is not None else m.launched_at
    return now - since < timedelta(seconds=warmup_s)


def window_mean(samples: list[tuple[datetime, float]], *, running_since: datetime | None, warmup_s: int,
                window_s: int, now: datetime, slack_s: float) -> float | None:
    """One member's mean over the window `(now - window_s, now]`, or None when its data does not
    cover the window: the window must start after the member's warm-up ended, and its samples
    must reach both ends of the window within `slack_s` (a missed report or two). "Avg < 50 %
    for 3 min" is a claim about 3 minutes; 41 s of data cannot make it."""
    if running_since is None:
        return None
    start = now - timedelta(seconds=window_s)
    if running_since + timedelta(seconds=warmup_s) > start:
        return None  # part of the window lies inside the warm-up (or before the member ran)
    inside = [(t, v) for t, v in samples if start < t <= now]
    if not inside:
        return None
    first, last = min(t for t, _ in inside), max(t for t, _ in inside)
    slack = timedelta(seconds=slack_s)
    if first - start > slack or now - last > slack:
        return None
    return sum(v for _, v in inside) / len(inside)


def members_mean(means: list[float | None]) -> float | None:
    """The group's metric: the mean of the members that have one; None when none has."""
    have = [m for m in means if m is not None]
    return sum(have) / len(have) if have else None


def pool_proposal(pool: Pool) -> int:
    if pool.gpus_per_instance <= 0:
        return 0
    return math.ceil(round(pool.demand_gpus / pool.gpus_per_instance, 9))


def _fmt(value: float) -> str:
    return f"{value:.0f}" if abs(value) >= 10 or value == int(value) else f"{value:.1f}"


def _target_cause(p: TargetPolicy) -> str:
    assert p.value is not None
    unit = METRIC_UNITS.get(p.metric, "")
    words = METRIC_WORDS.get(p.metric, p.metric)
    sign = ">" if p.value > p.target else "<" if p.value < p.target else "="
    return (f"{words} {_fmt(p.value)}{unit} {sign} target {_fmt(p.target)}{unit} "
            f"for {_fmt(p.window_s / 60)} min (policy {p.name})")


def _since(t: datetime | None, now: datetime) -> float:
    return math.inf if t is None else (now - t).total_seconds()


def _ended_cause(m: Member) -> str:
    why = f": {m.reason}" if m.reason else ""
    if m.state == "preempted" and m.billing == SPOT:
        return f"spot interruption of member {m.id}{why}; replaced on demand"
    return f"member {m.id} is {m.state}{why}; replaced"


# ------------------------------------------------------------------ the decision


def decide(g: Group, now: datetime) -> Decision:
    d = Decision(min_size=g.min_size, max_size=g.max_size, desired=clamp(g.desired, g.min_size, g.max_size))

    # 1. scheduled actions, oldest due first
    due = []
    for s in g.scheduled:
        at = cron_last_fire(s.cron, s.timezone, s.after, now)
        if at is not None:
            due.append((at, s))
    for at, s in sorted(due, key=lambda x: x[0]):
        before = (d.min_size, d.max_size, d.desired)
        d.min_size = s.min_size if s.min_size is not None else d.min_size
        d.max_size = s.max_size if s.max_size is not None else d.max_size
        d.max_size = max(d.max_size, d.min_size)
        d.desired = clamp(s.desired if s.desired is not None else d.desired, d.min_size, d.max_size)
        changes = [f"{name} {a} → {b}" for name, a, b in zip(("min", "max", "desired"), before,
                                                              (d.min_size, d.max_size, d.desired), strict=True)
                   if a != b]
        d.fired.append(s.id)
        d.activities.append(Activity(
            "scheduled", f"scheduled action {s.name} ({s.cron} {s.timezone}, due {at:%Y-%m-%d %H:%M %Z}): "
            + (", ".join(changes) or "no change"), before[2], d.desired))

    # 2. health: ended members leave; the shortfall below launches their replacements
    forced_on_demand = 0
    alive: list[Member] = []
    for m in g.members:
        if m.state in ALIVE:
            alive.append(m)
        elif m.state in ENDED:
            d.detach.append((m.id, _ended_cause(m)))
            d.activities.append(Activity("replace", _ended_cause(m), d.desired, d.desired))
            if m.state == "preempted" and m.billing == SPOT:
                forced_on_demand += 1
        # stopping: on its way out, neither alive nor replaced yet

    # 3. dynamic policies (not in the evaluation where a scheduled action fired)
    if not d.fired:
        _dynamic(g, d, now)

    # 4. convergence
    if len(alive) < d.desired:
        on_demand = sum(1 for m in alive if m.billing == ON_DEMAND)
        spot = len(alive) - on_demand
        for _ in range(d.desired - len(alive)):
            if forced_on_demand:
                billing, forced_on_demand = ON_DEMAND, forced_on_demand - 1
            else:
                billing = billing_mix(on_demand=on_demand, spot=spot, base=g.on_demand_base,
                                      percent=g.on_demand_percent)
            d.launch.append(billing)
            on_demand, spot = (on_demand + 1, spot) if billing == ON_DEMAND else (on_demand, spot + 1)
    elif len(alive) > d.desired:
        excess = len(alive) - d.desired
        # not running first; among the same, the newest first
        candidates = sorted((m for m in alive if not m.protected),
                            key=lambda m: (m.state == RUNNING, -m.launched_at.timestamp()))
        chosen = candidates[:excess]
        d.terminate = [(m.id, f"scale-in to desired {d.desired}") for m in chosen]
        kept = excess - len(chosen)
        if kept:
            d.activities.append(Activity(
                "note", f"{kept} protected member{'s' if kept != 1 else ''} kept above desired {d.desired} "
                        "(scale-in protection)", d.desired, d.desired))
    return d


def _dynamic(g: Group, d: Decision, now: datetime) -> None:
    current = d.desired
    ups: list[tuple[int, str]] = []
    downs: list[tuple[int, str]] = []
    holds = 0
    # A member inside its warm-up has no metric yet; shrinking meanwhile would judge the group by
    # the members that are not the ones just added (EC2 blocks policy scale-in the same way).
    warm_up = any(warming(m, warmup_s=g.warmup_s, now=now) for m in g.members)
    for p in g.policies:
        want = target_proposal(p, current=current)
        if want is None:
            continue
        want = clamp(want, d.min_size, d.max_size)
        if want > current:
            if _since(g.last_scale_out_at, now) >= p.scale_out_cooldown_s:
                ups.append((want, _target_cause(p)))
            else:
                holds += 1
        elif want < current and not p.disable_scale_in:
            if warm_up:
                holds += 1
                continue
            last = max((t for t in (g.last_scale_in_at, g.last_scale_out_at) if t), default=None)
            if _since(last, now) >= p.scale_in_cooldown_s:
                downs.append((want, _target_cause(p)))
            else:
                holds += 1
        else:
            holds += 1
    if g.pool is not None:
        want = clamp(pool_proposal(g.pool), d.min_size, d.max_size)
        cause = (f"batch pool {g.pool.queue}: {_fmt(g.pool.demand_gpus)} GPUs of pending and running jobs "
                 f"÷ {_fmt(g.pool.gpus_per_instance)} GPUs per instance")
        last = max((t for t in (g.last_scale_in_at, g.last_scale_out_at) if t), default=None)
        if want > current:
            ups.append((want, cause))
        elif want < current and _since(last, now) >= g.cooldown_s:
            downs.append((want, cause))
        else:
            holds += 1
    if ups:
        want, cause = max(ups, key=lambda x: x[0])
        d.activities.append(Activity("scale_out", f"scaled {current} → {want}: {cause}", current, want))
        d.desired, d.scaled_out = want, True
    elif downs and not holds:
        want, cause = max(downs, key=lambda x: x[0])
        d.activities.append(Activity("scale_in", f"scaled {current} → {want}: {cause}", current, want))
        d.desired, d.scaled_in = want, True


# ------------------------------------------------------------------ step scaling


@dataclass(frozen=True)
class Step:
    lower: float | None  # bounds on (metric - threshold); None: unbounded
    upper: float | None
    adjustment: int


@dataclass(frozen=True)
class StepPolicy:
    name: str
    adjustment_type: str  # change_in_capacity | exact_capacity | percent_change_in_capacity
    steps: tuple[Step, ...]
    cooldown_s: int = 300
    last_run_at: datetime | None = None


def step_for(steps: tuple[Step, ...], breach: float | None) -> Step | None:
    """The step whose [lower, upper) holds `breach`; without a breach size, the first step."""
    if not steps:
        return None
    if breach is None:
        return steps[0]
    for s in steps:
        if (s.lower is None or breach >= s.lower) and (s.upper is None or breach < s.upper):
            return s
    return None


def step_decision(p: StepPolicy, *, min_size: int, max_size: int, desired: int, alarm_state: str,
                  reason: str, breach: float | None, now: datetime) -> tuple[int, str] | None:
    """The new desired capacity for an alarm's call, and the cause; None: nothing to do."""
    if alarm_state != "ALARM":
        return None
    if _since(p.last_run_at, now) < p.cooldown_s:
        return None
    step = step_for(p.steps, breach)
    if step is None:
        return None
    if p.adjustment_type == "exact_capacity":
        want = step.adjustment
    elif p.adjustment_type == "percent_change_in_capacity":
        delta = desired * step.adjustment / 100
        # at least one instance of change, rounded away from zero as the clouds do
        want = desired + (math.ceil(delta) if delta > 0 else math.floor(delta))
        if step.adjustment and want == desired:
            want += 1 if step.adjustment > 0 else -1
    else:
        want = desired + step.adjustment
    want = clamp(want, min_size, max_size)
    if want == desired:
        return None
    return want, f"scaled {desired} → {want}: step policy {p.name} ({reason})"


__all__ = ["Activity", "Decision", "Group", "Member", "Pool", "ScheduledAction", "Step", "StepPolicy",
           "TargetPolicy", "billing_mix", "cron_last_fire", "cron_next_fire", "cron_valid", "decide",
           "members_mean", "pool_proposal", "step_decision", "step_for", "target_proposal", "warming",
           "window_mean"]
