"""Platform counters and histograms kept in Redis, so every web process exports the same numbers.

A scheduling cycle runs in a Celery worker, a heartbeat in any web process, a webhook in
another worker: per-process prometheus_client counters would each see a slice and reset
on restart. Instead each event is one pipelined round trip to Redis (`HINCRBY` into one
hash per metric) and `/metrics` reads every hash back in one more (`FAMILIES`, below).

Hash `<prefix>:metrics:<name>`, field `<label values joined by \\x1f>|<part>`: part `c` of a
counter; `s` (sum), `n` (count) and `b<i>` (observations in bucket i, not cumulative) of a
histogram. Label values come from code (region ids, phase names), never from tenants.

Heartbeats, the most frequent event, are counted per process and sent in one round trip at
most every `COALESCE_S` (`Batch.send(coalesce=True)`): a flusher thread sends what is pending,
and a scrape of the same process sends it first; a process killed loses at most that window.

Without Redis (the SQLite laptop demo) nothing is recorded and nothing is exported.
Recording never raises: a Redis outage loses counts, never a heartbeat or a cycle.
"""
from __future__ import annotations

import atexit
import bisect
import logging
import os
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

import redis
from django.conf import settings
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

from gpucloud.lib.db import redis_client

logger = logging.getLogger(__name__)

_SEP: Final = "\x1f"


@dataclass(frozen=True)
class Family:
    name: str  # without the _total of a counter
    help: str
    labels: tuple[str, ...]
    buckets: tuple[float, ...] = ()  # empty: a counter

    @property
    def is_histogram(self) -> bool:
        return bool(self.buckets)


_FAST: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_CYCLE: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_WAIT: Final = (1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0, 24 * 3600.0)

FAMILIES: Final = {
    f.name: f
    for f in (
        Family("gpucloud_scheduler_cycle_phase_seconds",
               "Scheduling cycle duration by region and phase (load, plan, apply)",
               ("region", "phase"), _CYCLE),
        Family("gpucloud_scheduler_queue_wait_seconds",
               "How long placed work waited in the queue, by region and priority class",
               ("region", "priority"), _WAIT),
        Family("gpucloud_scheduler_placements", "Workloads placed by the scheduler, by region", ("region",)),
        Family("gpucloud_scheduler_preemptions", "Preemption notices given by the scheduler, by region",
               ("region",)),
        Family("gpucloud_heartbeats", "Agent heartbeats answered, by path (fast: from Redis; slow: the database)",
               ("path",)),
        Family("gpucloud_heartbeat_seconds", "Time to answer an agent heartbeat, by path", ("path",), _FAST),
        Family("gpucloud_webhook_deliveries", "Outgoing webhook deliveries by outcome (ok, failed, refused)",
               ("outcome",)),
    )
}


def _prefix() -> str:
    base = settings.CACHES.get("default", {}).get("KEY_PREFIX") or "gpucloud"
    return f"{base}:metrics:"


def _redis() -> redis.Redis | None:
    if not settings.REDIS_URL:
        return None
    return redis_client(settings.REDIS_URL)


class Batch:
    """Events to record in one round trip: `inc` and `observe`, then `send`."""

    def __init__(self) -> None:
        self._ops: list[tuple[str, str, float]] = []

    def inc(self, name: str, labels: tuple[str, ...], n: float = 1) -> Batch:
        fam = FAMILIES[name]
        assert not fam.is_histogram and len(labels) == len(fam.labels), name
        if n:
            self._ops.append((name, f"{_SEP.join(labels)}|c", n))
        return self

    def observe(self, name: str, labels: tuple[str, ...], value: float) -> Batch:
        fam = FAMILIES[name]
        assert fam.is_histogram and len(labels) == len(fam.labels), name
        key = _SEP.join(labels)
        i = bisect.bisect_left(fam.buckets, value)  # first bucket with le >= value; len: +Inf only
        self._ops += [(name, f"{key}|b{i}", 1), (name, f"{key}|n", 1), (name, f"{key}|s", value)]
        return self

    def send(self, *, coalesce: bool = False) -> None:
        """Record the events: now, or with `coalesce` added to this process's pending counts,
        which go to Redis in one round trip at most `COALESCE_S` later."""
        if not self._ops:
            return
        if coalesce and settings.REDIS_URL:
            _pending.add(self._ops)
        else:
            _write(self._ops)
        self._ops.clear()


def _write(ops: list[tuple[str, str, float]]) -> None:
    r = _redis()
    if r is None or not ops:
        return
    p = _prefix()
    try:
        pipe = r.pipeline(transaction=False)
        for name, field, n in ops:
            if field.endswith("|s"):
                pipe.hincrbyfloat(p + name, field, n)
            else:
                pipe.hincrby(p + name, field, int(n))
        pipe.execute()
    except redis.RedisError:
        logger.warning("platform metrics not recorded (Redis unavailable)", exc_info=True)


COALESCE_S: Final = 0.5


class _Pending:
    """This process's coalesced counts, summed per (metric, field), and the thread that sends
    them; a forked child starts with none (the parent sends its own)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sums: dict[tuple[str, str], float] = defaultdict(float)
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, ops: list[tuple[str, str, float]]) -> None:
        with self._lock:
            for name, field, n in ops:
                self._sums[(name, field)] += n
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="promstore-flush", daemon=True)
                self._thread.start()
        self._wake.set()

    def flush(self) -> None:
        with self._lock:
            sums, self._sums = self._sums, defaultdict(float)
        _write([(name, field, n) for (name, field), n in sums.items()])

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            time.sleep(COALESCE_S)  # gather what comes meanwhile
            self.flush()

    def reset_in_child(self) -> None:
        self._lock = threading.Lock()
        self._sums = defaultdict(float)
        self._wake = threading.Event()
        self._thread = None


_pending = _Pending()
os.register_at_fork(after_in_child=_pending.reset_in_child)
atexit.register(_pending.flush)


def flush() -> None:
    """Send this process's coalesced counts now."""
    _pending.flush()


def collect() -> Iterator[CounterMetricFamily | HistogramMetricFamily]:
    """Every family, read back in one round trip (empty families without Redis)."""
    _pending.flush()  # this process's own coalesced counts are in what it exports
    r = _redis()
    raw: list[dict] = [{} for _ in FAMILIES]
    if r is not None:
        pipe = r.pipeline(transaction=False)
        for name in FAMILIES:
            pipe.hgetall(_prefix() + name)
        try:
            raw = pipe.execute()
        except redis.RedisError:
            logger.warning("platform metrics unavailable (Redis unavailable)", exc_info=True)
    for fam, fields in zip(FAMILIES.values(), raw, strict=True):
        series: dict[str, dict[str, float]] = {}
        for f, v in fields.items():
            key, _, part = f.decode().rpartition("|")
            series.setdefault(key, {})[part] = float(v)
        if fam.is_histogram:
            h = HistogramMetricFamily(fam.name, fam.help, labels=fam.labels)
            for key, parts in sorted(series.items()):
                acc, buckets = 0.0, []
                for i, le in enumerate((*fam.buckets, float("inf"))):
                    acc += parts.get(f"b{i}", 0.0)
                    buckets.append((_le(le), acc))
                h.add_metric(_values(key, fam), buckets, parts.get("s", 0.0))
            yield h
        else:
            c = CounterMetricFamily(fam.name, fam.help, labels=fam.labels)
            for key, parts in sorted(series.items()):
                c.add_metric(_values(key, fam), parts.get("c", 0.0))
            yield c


def _le(le: float) -> str:
    return "+Inf" if le == float("inf") else repr(le)


def _values(key: str, fam: Family) -> list[str]:
    return key.split(_SEP) if fam.labels else []


def reset() -> None:
    """Forget every recorded value (tests)."""
    r = _redis()
    if r is not None:
        r.delete(*(_prefix() + n for n in FAMILIES))
