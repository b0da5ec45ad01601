"""The alarm rule (alarms/evaluate.py) as a table, in the manner of CloudWatch's "how alarms treat
missing data" table: `0` a datapoint within the threshold, `X` one breaching it, `-` missing."""
from __future__ import annotations

import pytest

from alarms.evaluate import ALARM, INSUFFICIENT_DATA, OK, Rule, evaluate, next_evaluation, period_bounds

THRESHOLD = 80.0


def points(pattern: str) -> list[float | None]:
    return [{"0": 10.0, "X": 95.0, "-": None}[c] for c in pattern.split()]


# pattern, M, then the new state under missing | ignore | breaching | not_breaching (the alarm was OK;
# "keep" shows where ignore keeps the state it had)
TABLE = [
    # 3 of 3
    ("0 0 0", 3, OK, OK, OK, OK),
    ("X X X", 3, ALARM, ALARM, ALARM, ALARM),
    ("0 X X", 3, OK, OK, OK, OK),
    ("0 - -", 3, OK, OK, OK, OK),
    ("- - -", 3, INSUFFICIENT_DATA, "keep", ALARM, OK),
    ("- X X", 3, ALARM, "keep", ALARM, OK),
    ("- - X", 3, ALARM, "keep", ALARM, OK),
    ("0 - X", 3, OK, OK, OK, OK),
    # 2 of 3 (M of N)
    ("X 0 X", 2, ALARM, ALARM, ALARM, ALARM),
    ("X 0 0", 2, OK, OK, OK, OK),
    ("0 - X", 2, OK, OK, ALARM, OK),
    ("- - X", 2, ALARM, "keep", ALARM, OK),
    ("- X X", 2, ALARM, ALARM, ALARM, ALARM),
    # 1 of 1
    ("X", 1, ALARM, ALARM, ALARM, ALARM),
    ("0", 1, OK, OK, OK, OK),
    ("-", 1, INSUFFICIENT_DATA, "keep", ALARM, OK),
]
TREATMENTS = ("missing", "ignore", "breaching", "not_breaching")


@pytest.mark.parametrize("current", [OK, ALARM])
@pytest.mark.parametrize(("pattern", "m", "missing", "ignore", "breaching", "not_breaching"), TABLE)
def test_the_table(pattern, m, missing, ignore, breaching, not_breaching, current):
    data = points(pattern)
    for treatment, expected in zip(TREATMENTS, (missing, ignore, breaching, not_breaching), strict=True):
        rule = Rule(threshold=THRESHOLD, comparison="gt", evaluation_periods=len(data), datapoints_to_alarm=m,
                    treat_missing_data=treatment)
        got = evaluate(data, rule, current=current)
        assert got.state == (current if expected == "keep" else expected), (pattern, m, treatment)
        assert got.reason


@pytest.mark.parametrize(("comparison", "value", "breaches"), [
    ("gt", 80.0, False), ("gt", 80.1, True), ("ge", 80.0, True), ("ge", 79.9, False),
    ("lt", 80.0, False), ("lt", 79.9, True), ("le", 80.0, True), ("le", 80.1, False),
])
def test_comparisons_at_the_threshold(comparison, value, breaches):
    rule = Rule(threshold=80.0, comparison=comparison, evaluation_periods=1, datapoints_to_alarm=1)
    assert evaluate([value], rule, current=OK).state == (ALARM if breaches else OK)


def test_the_reason_names_the_datapoints_and_the_threshold():
    rule = Rule(threshold=80.0, comparison="gt", evaluation_periods=2, datapoints_to_alarm=2)
    reason = evaluate([91.5, 95.0], rule, current=OK).reason
    assert "2 of the last 2" in reason and "[91.5, 95]" in reason and "greater than the threshold (80)" in reason


def test_periods_are_aligned_and_wait_for_the_delay():
    # at 12:02:10 with a 15 s delay the 12:01 minute has not settled: the last whole periods are 11:59, 12:00
    now = 1_700_000_000 // 60 * 60 + 120 + 10
    start, end = period_bounds(now, period=60, delay=15, n=2)
    assert end == now - 10 - 60 and start == end - 120
    nxt = next_evaluation(now, period=60, delay=15)
    assert nxt == now - 10 + 15 and nxt > now
    assert period_bounds(nxt, period=60, delay=15, n=2)[1] == end + 60  # one period later, exactly
