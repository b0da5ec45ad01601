"""The pure metering module: billed seconds are exactly the RUNNING seconds, and the amount
is exactly the sum over price segments, however the metering windows are cut."""
from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from billing import metering, pricing
from scheduler.choices import State
from scheduler.lifecycle import TRANSITIONS

T0 = 1_740_000_000  # an epoch second in February 2025


@st.composite
def lifecycles(draw):
    """Legal random lifecycles: start, stop, preempt, lost, requeue and run again, with
    transitions at microsecond times, several in one second sometimes."""
    state, t = State.PENDING, T0 * 1_000_000 + draw(st.integers(0, 999_999))
    events = [(t, State.PENDING)]
    for _ in range(draw(st.integers(0, 14))):
        options = sorted(TRANSITIONS[state])
        if not options:
            break
        state = draw(st.sampled_from(options))
        t += draw(st.one_of(st.integers(0, 1_500_000), st.integers(0, 4_000 * 1_000_000)))
        events.append((t, state))
    return events


@st.composite
def price_books(draw, end_us):
    # n - 1 distinct change times fit in the window: it may be a single microsecond
    n = draw(st.integers(1, min(4, end_us - T0 * 1_000_000 + 2)))
    first = T0 * 1_000_000 - 10**6  # in force before the workload was created
    times = sorted(draw(st.lists(st.integers(T0 * 1_000_000, end_us), min_size=n - 1, max_size=n - 1,
                                 unique=True)))
    prices = draw(st.lists(st.decimals(Decimal("0.0001"), Decimal("99.9999"), places=4), min_size=n, max_size=n))
    return [(-(-t // 1_000_000), p) for t, p in zip([first, *times], prices, strict=True)]  # ceil to seconds


def reference(events_us, prices, start, end):
    """Second by second: the state at each second's start, and the price in force then."""
    seconds, price_seconds = 0, Decimal(0)
    for s in range(start, end):
        state = None
        for t, to in events_us:
            if t // 1_000_000 <= s:
                state = to
        if state == State.RUNNING:
            seconds += 1
            price_seconds += metering.price_at(prices, s)
    return seconds, price_seconds


@settings(max_examples=60, derandomize=True, deadline=None)
@given(data=st.data())
def test_billed_seconds_are_running_seconds_and_amount_the_sum_over_price_segments(data):
    events_us = data.draw(lifecycles())
    end = events_us[-1][0] // 1_000_000 + data.draw(st.integers(0, 3_000))
    prices = data.draw(price_books(end * 1_000_000))
    nodes = data.draw(st.integers(1, 4))
    events = [(t // 1_000_000, to) for t, to in events_us]
    start = T0

    # the whole range at once
    parts = metering.slices(events=events, prices=prices, start=start, end=end)
    ref_seconds, ref_ps = reference(events_us, prices, start, end)
    assert sum(p.seconds for p in parts) == ref_seconds
    assert sum((p.price_seconds(nodes) for p in parts), Decimal(0)) == ref_ps * nodes
    # no slice straddles a price change or a UTC midnight
    for p in parts:
        assert metering.price_at(prices, p.start) == metering.price_at(prices, p.end - 1) == p.per_hour
        assert p.start // metering.DAY == (p.end - 1) // metering.DAY

    # ...and cut into random windows, as the metering task does minute by minute
    cuts = sorted(set(data.draw(st.lists(st.integers(start, end), max_size=8))) | {start, end})
    cumulative, seconds, money = Decimal(0), 0, Decimal(0)
    for a, b in zip(cuts, cuts[1:], strict=False):
        window = metering.slices(events=events, prices=prices, start=a, end=b)
        for (ps, amount), part in zip(metering.amounts(window, nodes=nodes, cumulative=cumulative), window,
                                      strict=True):
            cumulative += ps
            seconds += part.seconds
            money += amount
    assert seconds == ref_seconds
    assert cumulative == ref_ps * nodes
    # rounded once: the entries add up to the exact total rounded half up to micro-units
    assert money == pricing.micro_of_price_seconds(ref_ps * nodes)
    assert abs(money - ref_ps * nodes / 3600) <= Decimal("0.0000005")


def test_a_run_is_billed_from_running_until_it_leaves_running():
    events = [(100, State.PENDING), (110, State.SCHEDULED), (115, State.STARTING), (120, State.RUNNING),
              (180, State.STOPPING), (200, State.STOPPED)]
    assert metering.running_seconds(events, start=0, end=1000) == 60
    # preempted, requeued and run again: both runs count, the wait between does not
    events = [(0, State.RUNNING), (30, State.PREEMPTED), (31, State.PENDING), (40, State.SCHEDULED),
              (50, State.RUNNING), (55, State.LOST)]
    assert metering.running_seconds(events, start=0, end=1000) == 35
    # still running: until the window's end
    assert metering.running_seconds([(10, State.RUNNING)], start=0, end=70) == 60


def test_no_price_in_force_is_an_error_not_a_free_second():
    with pytest.raises(metering.MeteringError):
        metering.slices(events=[(10, State.RUNNING)], prices=[(50, Decimal("1"))], start=0, end=100)


@pytest.mark.parametrize(("ps", "micro", "cents"), [
    (Decimal("2.4900") * 60, Decimal("0.041500"), Decimal("0.04")),
    (Decimal("1"), Decimal("0.000278"), Decimal("0.00")),  # 1/3600 = 0.000277…
    (Decimal("0.0018"), Decimal("0.000001"), Decimal("0.00")),  # 0.0000005 exactly: half up
    (Decimal("18"), Decimal("0.005000"), Decimal("0.01")),  # half a cent: up
    (Decimal("3600") * Decimal("2.49"), Decimal("2.490000"), Decimal("2.49")),
])
def test_rounding_is_half_up_once(ps, micro, cents):
    assert pricing.micro_of_price_seconds(ps) == micro
    assert pricing.cents_of_price_seconds(ps) == cents


@pytest.mark.parametrize(("allocated", "total", "expected"), [
    (0, 8000, Decimal("3.0000")),  # idle: the floor (30 % of 10)
    (8000, 8000, Decimal("10.0000")),  # full: on demand
    (4000, 8000, Decimal("4.7500")),  # 3 + 7 × 0.5²
    (4300, 8000, Decimal("4.7500")),  # 53.75 % rounds down to the 50 % step
    (0, 0, Decimal("3.0000")),  # no GPUs of the model: the floor
])
def test_spot_price_follows_allocation_between_floor_and_on_demand(allocated, total, expected):
    assert pricing.spot_price(on_demand=Decimal("10"), floor_fraction=Decimal("0.3"),
                              allocated_milli=allocated, total_milli=total) == expected
