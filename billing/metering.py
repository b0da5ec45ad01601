"""Metering: billable seconds and their prices, from a workload's transitions. Pure.

No Django here: times are whole epoch seconds (UTC), money is `Decimal` (billing/pricing.py
has the rounding rules). The services feed it `WorkloadEvent` rows and `Price` rows, their
times turned into seconds by `epoch_floor` (transitions) and `epoch_ceil` (prices), below.

Rules (docs/billing.md repeats them):

1. Billable means RUNNING. A workload is billed from the transition into RUNNING until
   the transition out of it (STOPPING, PREEMPTED, LOST, SUCCEEDED, FAILED, …); a
   requeued job that runs again is billed again from its new RUNNING.
2. Per second, on whole seconds: a transition at 12:00:07.8 counts from second
   12:00:07 (times are floored), so a run is billed `floor(end) − floor(start)` seconds
   and a second is billed iff the workload was RUNNING at its start.
3. The price of a second is the price in force at its start. A price row counts from the
   first whole second at or after its `effective_from` (ceil), so a second never has two.
4. A window [start, end) is cut into slices at every price change and every UTC
   midnight (so a slice lies within one day, one month, one price); each slice with
   running seconds becomes one ledger entry. `price_seconds = seconds × nodes × per_hour`
   is exact; money is rounded only from the workload's cumulative price-seconds
   (`amounts`), so cutting windows differently never changes a total.
5. Fractional GPUs pay by their share through the instance type's own price
   (`l40s.quarter` is priced for a quarter of an L40S); GPU-hours count the share.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from billing.pricing import micro_of_price_seconds

RUNNING = "running"
DAY = 86400
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_SECOND = timedelta(seconds=1)


def epoch_floor(dt: datetime) -> int:
    """Whole seconds since 1970 (UTC), rounded down (rule 2): exact integer arithmetic, no float."""
    return (dt - EPOCH) // _SECOND


def epoch_ceil(dt: datetime) -> int:
    """Whole seconds since 1970 (UTC), rounded up: where a price starts to count (rule 3)."""
    return -((EPOCH - dt) // _SECOND)


def from_epoch(t: int) -> datetime:
    return EPOCH + timedelta(seconds=t)


class MeteringError(Exception):
    """Input that cannot be billed (a running second with no price in force)."""


@dataclass(frozen=True)
class Slice:
    """Running seconds inside [start, end), all at one price."""

    start: int
    end: int
    seconds: int
    per_hour: Decimal

    def price_seconds(self, nodes: int = 1) -> Decimal:
        return self.per_hour * self.seconds * nodes


def running_intervals(events: Iterable[tuple[int, str]], *, until: int) -> list[tuple[int, int]]:
    """[(start, end)] while RUNNING, from (second, to_state) transitions in order.

    A run still open at the last event lasts until `until`.
    """
    intervals: list[tuple[int, int]] = []
    open_at: int | None = None
    last = None
    for t, state in events:
        if last is not None and t < last:
            t = last  # never let clock jitter between two events reorder them
        last = t
        if state == RUNNING:
            if open_at is None:
                open_at = t
        elif open_at is not None:
            if t > open_at:
                intervals.append((open_at, t))
            open_at = None
    if open_at is not None and until > open_at:
        intervals.append((open_at, until))
    return intervals


def _overlap(intervals: Sequence[tuple[int, int]], a: int, b: int) -> int:
    return sum(max(0, min(e, b) - max(s, a)) for s, e in intervals)


def running_seconds(events: Iterable[tuple[int, str]], *, start: int, end: int) -> int:
    return _overlap(running_intervals(events, until=end), start, end)


def price_at(prices: Sequence[tuple[int, Decimal]], t: int) -> Decimal | None:
    """The price in force at second `t`: the last (effective_from, per_hour) with from ≤ t."""
    found = None
    for since, per_hour in prices:
        if since <= t:
            found = per_hour
        else:
            break
    return found


def slices(*, events: Iterable[tuple[int, str]], prices: Sequence[tuple[int, Decimal]],
           start: int, end: int) -> list[Slice]:
    """The billable slices of [start, end): cut at price changes and UTC midnights.

    `prices` are (effective_from second, per_hour) sorted by time; every running second
    must have one in force (launch refuses a type with no price).
    """
    if end <= start:
        return []
    runs = running_intervals(events, until=end)
    cuts = {start, end}
    cuts.update(since for since, _ in prices if start < since < end)
    first_midnight = (start // DAY + 1) * DAY
    cuts.update(range(first_midnight, end, DAY))
    points = sorted(cuts)
    out: list[Slice] = []
    for a, b in zip(points, points[1:], strict=False):
        seconds = _overlap(runs, a, b)
        if not seconds:
            continue
        per_hour = price_at(prices, a)
        if per_hour is None:
            raise MeteringError(f"no price in force at {a}")
        out.append(Slice(start=a, end=b, seconds=seconds, per_hour=per_hour))
    return out


def amounts(parts: Sequence[Slice], *, nodes: int, cumulative: Decimal) -> list[tuple[Decimal, Decimal]]:
    """[(price_seconds, amount)] per slice, continuing from the workload's `cumulative`
    price-seconds: amount = micro(cumulative after) − micro(cumulative before).

    The amounts of all slices ever posted for a workload telescope to
    micro(total price-seconds): rounded once, whatever the windows were.
    """
    out = []
    for part in parts:
        ps = part.price_seconds(nodes)
        after = cumulative + ps
        out.append((ps, micro_of_price_seconds(after) - micro_of_price_seconds(cumulative)))
        cumulative = after
    return out
