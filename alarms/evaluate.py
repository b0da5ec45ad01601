"""The alarm rule, pure: the last N datapoints and the alarm's settings in, the new state and why out.

CloudWatch's model. An alarm looks at its last `evaluation_periods` (N) periods, oldest first;
each period's datapoint is the statistic over the metric's samples in it, or missing (None).
A datapoint *breaches* when `value <comparison> threshold`. With M = `datapoints_to_alarm`:

    treat_missing_data | missing datapoints are ...   | all N missing       | fewer than M present, all breaching
    -------------------+-------------------------------+---------------------+------------------------------------
    missing (default)  | left out                      | INSUFFICIENT_DATA   | ALARM
    ignore             | left out                      | the state is kept   | the state is kept
    breaching          | breaching                     | ALARM (if M <= N)   | (never: none are missing)
    not_breaching      | within the threshold          | OK                  | (never)

Otherwise: ALARM when at least M datapoints breach, else OK. ("Fewer than M present, all
breaching" is CloudWatch's "- - X" row: with data missing it evaluates the datapoints it has.)
The table of cases, CloudWatch-docs style, is tests/alarms/test_evaluate.py.
"""
from __future__ import annotations

import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

ALARM: Final = "ALARM"
OK: Final = "OK"
INSUFFICIENT_DATA: Final = "INSUFFICIENT_DATA"

COMPARE: Final[dict[str, Callable[[float, float], bool]]] = {
    "gt": operator.gt, "ge": operator.ge, "lt": operator.lt, "le": operator.le,
}
WORDS: Final = {"gt": "greater than", "ge": "greater than or equal to", "lt": "less than",
                "le": "less than or equal to"}


@dataclass(frozen=True)
class Rule:
    threshold: float
    comparison: str  # gt | ge | lt | le
    evaluation_periods: int  # N
    datapoints_to_alarm: int  # M, 1..N
    treat_missing_data: str = "missing"  # missing | ignore | breaching | not_breaching


@dataclass(frozen=True)
class Decision:
    state: str  # OK | ALARM | INSUFFICIENT_DATA
    reason: str


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:g}"


def evaluate(datapoints: Sequence[float | None], rule: Rule, *, current: str) -> Decision:
    """The state after looking at `datapoints` (the last N periods, oldest first; None: missing)."""
    n, m = rule.evaluation_periods, rule.datapoints_to_alarm
    assert len(datapoints) == n and 1 <= m <= n, (len(datapoints), n, m)
    compare = COMPARE[rule.comparison]
    missing = rule.treat_missing_data
    shown = "[" + ", ".join(_fmt(v) for v in datapoints) + "]"
    crossing = f"{WORDS[rule.comparison]} the threshold ({rule.threshold:g})"
    present = [v for v in datapoints if v is not None]
    breaching = sum(1 for v in present if compare(v, rule.threshold))
    absent = n - len(present)
    if missing == "breaching":
        breaching += absent
    if absent == n and missing in ("missing", "ignore"):
        if missing == "ignore":
            return Decision(current, f"No datapoints in the last {n} period(s): the state is kept (ignore).")
        return Decision(INSUFFICIENT_DATA, f"No datapoints in the last {n} period(s).")
    if breaching >= m:
        return Decision(ALARM, f"Threshold crossed: {breaching} of the last {n} datapoints {shown} "
                               f"{'were' if breaching > 1 else 'was'} {crossing} "
                               f"(at least {m} needed for ALARM).")
    if missing in ("missing", "ignore") and 0 < len(present) < m and breaching == len(present):
        if missing == "ignore":
            return Decision(current, f"Only {len(present)} datapoint(s) of {n} {shown}, all {crossing}: "
                                     "the state is kept (ignore).")
        return Decision(ALARM, f"Threshold crossed: the only {len(present)} datapoint(s) of the last {n} "
                               f"{shown} {'were' if len(present) > 1 else 'was'} {crossing} "
                               "(missing datapoints are left out).")
    return Decision(OK, f"Threshold not crossed: {breaching} of the last {n} datapoints {shown} "
                        f"{'were' if breaching != 1 else 'was'} {crossing} (at least {m} needed for ALARM).")


def period_bounds(now_epoch: float, *, period: int, delay: int, n: int) -> tuple[int, int]:
    """[start, end) epoch seconds of the last `n` whole periods that ended at least `delay` s before now.

    Periods are aligned to multiples of `period` since 1970, as CloudWatch's and the metrics API's steps."""
    end = int(now_epoch - delay) // period * period
    return end - n * period, end


def next_evaluation(now_epoch: float, *, period: int, delay: int) -> int:
    """When the next period will have ended `delay` seconds ago (epoch seconds, > now)."""
    return (int(now_epoch - delay) // period + 1) * period + delay


_PERIOD = re.compile(r"^\s*(\d+)\s*(s|m|min|h)?\s*$", re.IGNORECASE)
_PERIOD_UNITS = {"s": 1, "m": 60, "min": 60, "h": 3600}


def period_parse(text: str) -> int | None:
    """A period as a person writes it: `5m`, `300s`, `1h` or bare seconds (`300`, as the API's
    `period`); None when it is none of those. Whole minutes are checked where it is stored."""
    m = _PERIOD.match(text or "")
    if not m:
        return None
    return int(m[1]) * _PERIOD_UNITS[(m[2] or "s").lower()]


def period_words(seconds: int) -> str:
    """A period in the one unit every page, e-mail and the CLI use: minutes (`5 min`); the
    seconds when it is not a whole number of minutes."""
    return f"{seconds // 60} min" if seconds % 60 == 0 else f"{seconds} s"
