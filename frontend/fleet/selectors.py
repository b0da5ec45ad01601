"""Reads for the fleet page. Each figure is one query over the whole fleet (no N+1):
the heat map is one SELECT of every GPU joined to its host, the rest are GROUP BYs.

Allocation ratio over time is derived, not sampled: allocation rows keep `created_at`
and `released_at`, so the GPU-share booked at any moment is the sum of the rows open
then. The capacity at a moment is the GPUs of the hosts that had joined by then (a host
deleted since takes its allocations with it, so both sides of the ratio agree). Each
point is the time-weighted mean over its bucket, so short allocations are not missed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Final

from django.conf import settings
from django.db.models import Case, CharField, Count, F, Min, Q, Value, When
from django.db.models.functions import Left, StrIndex

from agents.choices import AdminState, HostState
from agents.models import Gpu, Host
from scheduler.choices import PriorityClass, State
from scheduler.models import Allocation, Workload

WINDOWS: Final = {
    "1h": timedelta(hours=1),
    "6h": timedelta(hours=6),
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
}
POINTS: Final = 120  # points per chart, whatever the window


# --- the heat map ------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuCell:
    uuid: str
    index: int
    model: str
    utilisation: float | None  # 0..1, None when there is no recent sample
    healthy: bool
    booked_milli: int
    unhealthy_reason: str

    @property
    def level(self) -> str:
        """The cell's CSS class: u0..u10 by utilisation, `stale` without a recent sample."""
        if self.utilisation is None:
            return "stale"
        return f"u{round(self.utilisation * 10)}"

    @property
    def title(self) -> str:
        util = (
            "no recent sample" if self.utilisation is None else f"{self.utilisation:.0%} utilised"
        )
        booked = (
            "free"
            if self.booked_milli == 0
            else "booked whole"
            if self.booked_milli == 1000
            else f"{self.booked_milli / 10:g} % booked"
        )
        health = (
            "" if self.healthy else f"; UNHEALTHY: {self.unhealthy_reason or 'no reason given'}"
        )
        return f"#{self.index} {self.model} {self.uuid}: {util}, {booked}{health}"


@dataclass
class HostTile:
    id: str
    name: str
    region: str
    state: str
    admin_state: str
    gpus: list[GpuCell] = field(default_factory=list)

    @property
    def mean_utilisation(self) -> float | None:
        known = [g.utilisation for g in self.gpus if g.utilisation is not None]
        return sum(known) / len(known) if known else None


@dataclass(frozen=True)
class Heatmap:
    hosts: list[HostTile]
    gpus: int
    booked_gpus: float  # GPU-equivalents (shares summed)
    unhealthy: int
    mean_utilisation: float | None  # over GPUs with a recent sample


def fleet_heatmap(*, now: datetime) -> Heatmap:
    """Every GPU with its latest utilisation, grouped by host (one query)."""
    stale_before = now - timedelta(seconds=settings.HOST_DOWN_AFTER_S)
    rows = Gpu.objects.order_by("host__name", "index").values_list(
        "uuid",
        "index",
        "gpu_model__code",
        "utilisation",
        "sampled_at",
        "healthy",
        "used_milli",
        "unhealthy_reason",
        "host_id",
        "host__name",
        "host__region__code",
        "host__state",
        "host__admin_state",
    )
    hosts: dict[str, HostTile] = {}
    booked = 0
    unhealthy = 0
    util_sum, util_n = 0.0, 0
    for (
        uuid,
        index,
        model,
        util,
        sampled_at,
        healthy,
        milli,
        why,
        host_id,
        host_name,
        region,
        state,
        admin_state,
    ) in rows:
        tile = hosts.get(host_id)
        if tile is None:
            tile = hosts[host_id] = HostTile(
                id=str(host_id), name=host_name, region=region, state=state, admin_state=admin_state
            )
        # A DOWN host's last numbers are history, not the present: shown as "no recent sample".
        fresh = sampled_at is not None and sampled_at >= stale_before and state != HostState.DOWN
        tile.gpus.append(
            GpuCell(
                uuid=uuid,
                index=index,
                model=model,
                utilisation=util if fresh else None,
                healthy=healthy,
                booked_milli=milli,
                unhealthy_reason=why,
            )
        )
        booked += milli
        unhealthy += not healthy
        if fresh:
            util_sum, util_n = util_sum + util, util_n + 1
    gpus = sum(len(t.gpus) for t in hosts.values())
    return Heatmap(
        hosts=list(hosts.values()),
        gpus=gpus,
        booked_gpus=booked / 1000,
        unhealthy=unhealthy,
        mean_utilisation=util_sum / util_n if util_n else None,
    )


# --- hosts by state ------------------------------------------------------------------------

# Rows of the hosts-by-state table: what the host does (liveness), then the operator's choice.
LIVENESS: Final = (
    ("up", "Up", "heartbeating"),
    ("down", "Down", "silent; its work is kept for the grace period"),
    ("lost", "Lost", "down past the grace period: its work was lost"),
)


@dataclass(frozen=True)
class HostStates:
    columns: list[tuple[str, str]]  # admin states: (value, label)
    rows: list[
        tuple[str, str, str, list[int], int]
    ]  # (liveness, label, meaning, per column, total)
    totals: list[int]
    total: int


def hosts_by_state(*, now: datetime) -> HostStates:
    """Hosts counted by liveness (up / down / lost) × admin state (one GROUP BY)."""
    lost_before = now - timedelta(seconds=settings.HOST_LOST_GRACE_S)
    liveness = Case(
        When(~Q(state=HostState.DOWN), then=Value("up")),
        When(down_since__lt=lost_before, then=Value("lost")),
        default=Value("down"),
        output_field=CharField(),
    )
    counts = {
        (r["liveness"], r["admin_state"]): r["n"]
        for r in Host.objects.order_by()
        .annotate(liveness=liveness)
        .values("liveness", "admin_state")
        .annotate(n=Count("id"))
    }
    columns = list(AdminState.choices)
    rows = []
    for key, label, meaning in LIVENESS:
        cells = [counts.get((key, col), 0) for col, _ in columns]
        rows.append((key, label, meaning, cells, sum(cells)))
    totals = [sum(r[3][i] for r in rows) for i in range(len(columns))]
    return HostStates(columns=columns, rows=rows, totals=totals, total=sum(totals))


# --- the queue -----------------------------------------------------------------------------


@dataclass(frozen=True)
class QueueRow:
    label: str
    count: int
    oldest: datetime | None = None


@dataclass(frozen=True)
class QueueDepth:
    by_class: list[QueueRow]
    by_reason: list[QueueRow]
    total: int


def _reason_head() -> Case:
    """The reason without its per-request tail ("; 3 requests ahead of you", "(starting in
    40 s)"), so that requests waiting for the same thing group together, in SQL."""
    cut = lambda sep: Left("reason", StrIndex("reason", Value(sep)) - 1)  # noqa: E731
    return Case(
        When(reason="", then=Value("(no reason recorded)")),
        When(reason__contains="; ", then=cut("; ")),
        When(reason__contains=" (starting in", then=cut(" (starting in")),
        default=F("reason"),
        output_field=CharField(),
    )


def queue_depth(*, reasons: int = 12) -> QueueDepth:
    """Pending workloads by priority class, and by why they wait (two GROUP BYs)."""
    pending = Workload.objects.filter(state=State.PENDING).order_by()
    per_class = {
        r["priority"]: r
        for r in pending.values("priority").annotate(n=Count("id"), oldest=Min("queued_at"))
    }
    by_class = [
        QueueRow(
            label,
            per_class[c]["n"] if c in per_class else 0,
            per_class[c]["oldest"] if c in per_class else None,
        )
        for c, label in PriorityClass.choices
    ]
    by_reason = [
        QueueRow(r["head"], r["n"], r["oldest"])
        for r in pending.annotate(head=_reason_head())
        .values("head")
        .annotate(n=Count("id"), oldest=Min("queued_at"))
        .order_by("-n", "head")[:reasons]
    ]
    return QueueDepth(by_class=by_class, by_reason=by_reason, total=sum(r.count for r in by_class))


# --- allocation ratio over time --------------------------------------------------------------


def step_means(
    changes: Iterable[tuple[datetime, float]], *, start: datetime, step: timedelta, points: int
) -> list[float]:
    """Time-weighted means of a step function over `points` buckets of `step` from `start` (pure).

    `changes` are (when, delta) pairs; the function is the running sum of the deltas, and a
    change before `start` counts from `start`. O(changes · log + points).
    """
    end = start + step * points
    events = sorted((max(t, start), d) for t, d in changes if t < end)
    width = step.total_seconds()
    area = [0.0] * points
    level, at, i = 0.0, start, 0

    def spread(until: datetime) -> None:
        # add level × time between `at` and `until` to the buckets it covers
        nonlocal at
        while at < until:
            k = min(int((at - start).total_seconds() // width), points - 1)
            edge = min(start + step * (k + 1), until)
            area[k] += level * (edge - at).total_seconds()
            at = edge

    while i < len(events):
        t = events[i][0]
        spread(t)
        while i < len(events) and events[i][0] == t:
            level += events[i][1]
            i += 1
    spread(end)
    return [a / width for a in area]


@dataclass(frozen=True)
class RatioSeries:
    times: list[int]  # each bucket's end, Unix seconds
    ratio: list[float | None]  # booked share of the GPUs there, 0..1; None without GPUs
    booked_gpus: list[float]
    capacity_gpus: list[float]


def allocation_ratio_series(
    *, now: datetime, window: timedelta, points: int = POINTS
) -> RatioSeries:
    """The booked share of all GPUs over the last `window` (two queries)."""
    step = window / points
    start = now - step * points
    # open rows, and those released within the window: two partial indexes, whatever the history
    booked = Allocation.objects.filter(
        Q(active=True) | Q(active=False, released_at__gt=start), created_at__lt=now
    ).values_list("created_at", "released_at", "milli")
    changes: list[tuple[datetime, float]] = []
    for created, released, milli in booked:
        changes.append((created, milli / 1000))
        if released is not None:
            changes.append((released, -milli / 1000))
    joined = Host.objects.order_by().values("created_at").annotate(n=Count("gpus"))
    capacity = step_means(
        ((r["created_at"], float(r["n"])) for r in joined), start=start, step=step, points=points
    )
    used = step_means(changes, start=start, step=step, points=points)
    return RatioSeries(
        times=[int((start + step * (k + 1)).timestamp()) for k in range(points)],
        ratio=[min(1.0, u / c) if c > 0 else None for u, c in zip(used, capacity, strict=True)],
        booked_gpus=[round(u, 3) for u in used],
        capacity_gpus=[round(c, 3) for c in capacity],
    )
