"""Durations learned from history (issue 33): no user declares how long work runs.

Helios (SC'21) showed that a GPU job's run time is predictable from the earlier jobs
of the same user with the same name and size (its QSSF order). ``DurationEstimator``
keeps, per key, a window of the latest finished run times and answers with their
median, from the most specific key that has enough history to the most general:

    (tenant, member, name-or-command hash, GPUs) -> (tenant, member, GPUs)
    -> (tenant, GPUs) -> (tenant,)

Every key starts with the tenant, so one tenant's history never shapes another's
estimate (estimates never leak across tenants). Pure: no clock, no Django. The
caller decides what "finished" means; the simulator feeds a job only once it has
ended, before the decision that reads the estimate (no peeking at the future).

Why the median of a window, not the mean of everything: run times are heavy-tailed
(one week-long job would drag a mean for months) and a team's work drifts, so a
recent, robust middle ranks the next job better than the whole past's average.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from .model import WHOLE, PlacementRequest

#: finished runs kept per key (the latest ones)
WINDOW = 64
#: a key answers only with at least this many finished runs; else a more general one
MIN_HISTORY = 3

_Key = tuple[object, ...]


@dataclass(frozen=True, slots=True)
class Estimate:
    """An estimated run time (seconds, on the requested GPUs), how many finished runs
    it rests on, and the level of the key that gave it (0 = the most specific)."""

    seconds: float
    history: int
    level: int


class _Window:
    __slots__ = ("runs", "median")

    def __init__(self) -> None:
        self.runs: deque[float] = deque(maxlen=WINDOW)
        self.median: float | None = None  # cached until the next run is added


def estimate_keys(tenant: str, member: str, name: str, gpus: float) -> tuple[_Key, ...]:
    """The keys asked in turn, the most specific first (all inside one tenant).
    Empty member or name skip the levels they would name."""
    keys: list[_Key] = []
    if member and name:
        keys.append((tenant, member, name, gpus))
    if member:
        keys.append((tenant, member, "", gpus))
    keys.append((tenant, "", "", gpus))
    keys.append((tenant,))
    return tuple(keys)


class DurationEstimator:
    """Learned incrementally: ``observe`` a finished run, ``estimate`` the next."""

    def __init__(self, *, window: int = WINDOW, min_history: int = MIN_HISTORY) -> None:
        self.window = window
        self.min_history = min_history
        self._runs: dict[_Key, _Window] = {}

    def observe(self, *, tenant: str, member: str = "", name: str = "", gpus: float, seconds: float) -> None:
        """A run of ``seconds`` on ``gpus`` GPUs finished. Runs that never end
        (inf) or took no time teach nothing and are left out."""
        if not (seconds > 0.0) or math.isinf(seconds):
            return
        for key in estimate_keys(tenant, member, name, gpus):
            w = self._runs.get(key)
            if w is None:
                w = self._runs[key] = _Window()
                if self.window != WINDOW:
                    w.runs = deque(maxlen=self.window)
            w.runs.append(seconds)
            w.median = None

    def history(self, *, tenant: str, member: str = "", name: str = "", gpus: float) -> int:
        """Finished runs behind the most specific key that has any."""
        for key in estimate_keys(tenant, member, name, gpus):
            w = self._runs.get(key)
            if w is not None:
                return len(w.runs)
        return 0

    def estimate(self, *, tenant: str, member: str = "", name: str = "", gpus: float) -> Estimate | None:
        """The median of the most specific key with ``min_history`` runs, or None
        when even the tenant's whole history is thinner (the caller falls back to
        least attained service)."""
        for level, key in enumerate(estimate_keys(tenant, member, name, gpus)):
            w = self._runs.get(key)
            if w is None or len(w.runs) < self.min_history:
                continue
            if w.median is None:
                s = sorted(w.runs)
                n = len(s)
                w.median = s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])
            return Estimate(w.median, len(w.runs), level)
        return None


def learned_service(req: PlacementRequest) -> float:
    """The learned order's key inside one class and attained-service queue (QSSF):
    the GPU-seconds the request is expected still to need. 0.0 without an estimate,
    so requests without history keep their age order (least attained service); inf
    once the request has outrun its estimate: it is likely a long one (heavy tail),
    and waits behind work still inside its estimate."""
    e = req.estimated_duration
    if e is None:
        return 0.0
    gpus = max(req.total_milli / WHOLE, 1e-9)
    left = e - req.attained_service / gpus
    if left <= 0.0:
        return math.inf
    return left * gpus
