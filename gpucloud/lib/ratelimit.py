"""One rate limiter for every throttle: a sliding log per key, counted in one atomic step.

`hit(key=..., limit=N, window_s=T)` lets a request through when fewer than N went through
under `key` in the last T seconds, and records it; otherwise it says how long to wait
until the oldest recorded request leaves the window. So at most N pass in any T seconds,
with no burst on top, however many web processes and threads count at once.

Why not Django's cache: a throttle that reads the history, appends and writes it back (as
rest_framework's SimpleRateThrottle does) loses updates when requests overlap; 16 threads
got 1,431 requests through a key limited to 600 a minute. Here the check and the append
are one Lua script in Redis (a sorted set of timestamps, as the agents' heartbeat script
in agents/fastpath.py keeps), so concurrent requests are serialised by Redis itself.

Without Redis (`REDIS_URL` unset: the laptop demo's in-process cache) the same log lives
in this process's memory under a lock: exact for the one process the demo runs, and as
per-process as the in-process cache was.
"""
from __future__ import annotations

import secrets
import threading
import time
from collections import deque
from dataclasses import dataclass
from functools import cache
from typing import Any, Final

import redis
from django.conf import settings

# KEYS[1] the log; ARGV: now (ms), window (ms), limit, a unique member for this request.
_HIT: Final = """
local key = KEYS[1]
local now = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
local n = redis.call('ZCARD', key)
if n >= limit then
  local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  local wait = window
  if oldest[2] then wait = tonumber(oldest[2]) + window - now end
  return {0, tostring(wait)}
end
redis.call('ZADD', key, now, ARGV[4])
redis.call('PEXPIRE', key, window)
return {1, '0'}
"""

# The in-process log forgets keys that have been quiet for a whole window once it holds
# this many, so a stream of new addresses cannot grow it without bound.
_LOCAL_SWEEP_AT: Final = 10_000


_PERIOD_S: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400}


@cache
def parse_rate(rate: str) -> tuple[int, int]:
    """ "N/period" (rest_framework's form: "120/min", "10/hour", "5/s") as (N, seconds), for every
    throttle: the API's, the agents' in the heartbeat script (agents/fastpath.py) alike."""
    num, period = rate.split("/")
    return int(num), _PERIOD_S[period[0]]


@dataclass(frozen=True)
class Decision:
    allowed: bool
    retry_after_s: float | None  # when refused: seconds until a request may pass again


def hit(*, key: str, limit: int, window_s: float, now: float | None = None) -> Decision:
    """Count one request under `key` if fewer than `limit` passed in the last `window_s`."""
    now_ms = int((time.time() if now is None else now) * 1000)
    window_ms = max(1, int(window_s * 1000))
    if settings.REDIS_URL:
        allowed, wait = _script(settings.REDIS_URL)(
            keys=[f"{_prefix()}{key}"], args=[now_ms, window_ms, limit, secrets.token_hex(8)]
        )
        wait_ms = float(wait)
    else:
        allowed, wait_ms = _local.hit(key, now_ms, window_ms, limit)
    if allowed:
        return Decision(True, None)
    return Decision(False, max(wait_ms, 0.0) / 1000)


def _prefix() -> str:
    base = settings.CACHES.get("default", {}).get("KEY_PREFIX") or "gpucloud"
    return f"{base}:rl:"


@cache
def _client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url)


@cache
def _script(url: str) -> Any:
    return _client(url).register_script(_HIT)


class _LocalLog:
    """The sliding log in this process's memory (no Redis): one lock around check-and-append."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._logs: dict[str, tuple[int, deque[int]]] = {}

    def hit(self, key: str, now_ms: int, window_ms: int, limit: int) -> tuple[bool, float]:
        with self._lock:
            if len(self._logs) >= _LOCAL_SWEEP_AT:
                self._sweep(now_ms)
            _, log = self._logs.setdefault(key, (window_ms, deque()))
            self._logs[key] = (window_ms, log)
            while log and log[0] <= now_ms - window_ms:
                log.popleft()
            if len(log) >= limit:
                return False, float(log[0] + window_ms - now_ms if log else window_ms)
            log.append(now_ms)
            return True, 0.0

    def _sweep(self, now_ms: int) -> None:
        quiet = [k for k, (w, log) in self._logs.items() if not log or log[-1] <= now_ms - w]
        for k in quiet:
            del self._logs[k]

    def clear(self) -> None:
        with self._lock:
            self._logs.clear()


_local = _LocalLog()


def reset_local() -> None:
    """Forget the in-process counters (tests; Redis counters go with the cache's FLUSHDB)."""
    _local.clear()
