"""Long polls of the agent API (`POST /agent/v1/wait`): answer as soon as a host's desired
state moves, so a placement reaches its host at once, without the gateway's tunnel.

The signal is the one the gateway forwards as a WAKE frame: `agents.fastpath.hosts_changed`
bumps the host's version in Redis and, after commit, publishes on `gateway:wake:<host>`. Each
web process runs one listener thread (a pattern subscription to every host's channel) that
sets the events of the requests waiting for that host. A wait registers its event before it
compares the host's version with the one its agent last saw, so a change is never missed:
either the version moved already (answered at once) or its publish comes later (it wakes).

A wait holds a web thread. `AGENT_LONGPOLL_SLOTS` bounds how many one process holds at once
(0, the default, turns long polls off: heartbeat answers then carry no `desired_version` and
agents wait out their interval, or a gateway WAKE). Set it below the process's thread count
(gunicorn `--threads`) so API requests always find a thread; a wait beyond the slots is
answered at once with `changed: false` (logged, at most once a minute) and the agent polls
again after a short backoff (agents/host/daemon.py). The slots are per process, and which
process accepts a connection is up to the kernel: size them for every host's wait in one.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable

import redis
from django.conf import settings

from agents import fastpath
from agents.protocol import WAKE_PREFIX

logger = logging.getLogger(__name__)


def enabled() -> bool:
    return settings.AGENT_LONGPOLL_SLOTS > 0 and fastpath.enabled()


class _Listener:
    """The process's subscription to every host's wake-up channel."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[str, set[threading.Event]] = defaultdict(set)
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._slots = threading.BoundedSemaphore(max(1, settings.AGENT_LONGPOLL_SLOTS))
        self._exhausted_logged = float("-inf")

    def _ensure_running(self) -> bool:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._ready.clear()
                self._thread = threading.Thread(target=self._run, name="agent-longpoll", daemon=True)
                self._thread.start()
        return self._ready.wait(timeout=5.0)

    def _run(self) -> None:
        pubsub = None
        try:
            pubsub = fastpath._redis().pubsub(ignore_subscribe_messages=False)
            pubsub.psubscribe(f"{WAKE_PREFIX}*")
            for msg in pubsub.listen():
                if msg["type"] == "psubscribe":
                    self._ready.set()
                elif msg["type"] == "pmessage":
                    host = msg["channel"].decode()[len(WAKE_PREFIX):]
                    with self._lock:
                        for ev in self._waiting.get(host, ()):
                            ev.set()
        except (redis.RedisError, OSError):
            logger.exception("long-poll listener stopped; waiting requests are answered")
        finally:
            self._ready.clear()
            with self._lock:  # whoever waits now would not hear a wake-up: let them go
                for events in self._waiting.values():
                    for ev in events:
                        ev.set()
            if pubsub is not None:
                try:
                    pubsub.close()
                except (redis.RedisError, OSError):
                    pass

    def _exhausted(self) -> None:
        """Say so (at most once a minute): waits beyond the slots cost the agents a retry."""
        now = time.monotonic()
        with self._lock:
            if now - self._exhausted_logged < 60.0:
                return
            self._exhausted_logged = now
        logger.warning("long poll slots exhausted; waits answered at once (AGENT_LONGPOLL_SLOTS=%d)",
                       settings.AGENT_LONGPOLL_SLOTS)

    def wait(self, *, host_id: str, since: str, timeout_s: float, on_park: Callable[[], None] | None = None) -> bool:
        """Whether the desired state of `host_id` moved past version `since` within `timeout_s`.
        `on_park` runs once it is known that the request waits (not when it is answered at once)."""
        if not self._slots.acquire(blocking=False):
            self._exhausted()
            return False  # every slot held: the agent polls again shortly
        ev = threading.Event()
        try:
            if not self._ensure_running():
                return False
            with self._lock:
                self._waiting[host_id].add(ev)
            try:
                if fastpath.version(host_id=host_id) != since:
                    return True
                if not self._ready.is_set():
                    # The listener stopped between its start and our registration (its sweep
                    # of the waiting ran before we were there): nobody would wake us.
                    return False
                if on_park is not None:
                    on_park()
                return ev.wait(timeout_s) and fastpath.version(host_id=host_id) != since
            finally:
                with self._lock:
                    events = self._waiting.get(host_id)
                    if events is not None:
                        events.discard(ev)
                        if not events:
                            del self._waiting[host_id]
        finally:
            self._slots.release()


_listener: _Listener | None = None
_listener_lock = threading.Lock()


def wait(*, host_id: str, since: str, timeout_s: float, on_park: Callable[[], None] | None = None) -> bool:
    global _listener
    with _listener_lock:
        if _listener is None:
            _listener = _Listener()
    return _listener.wait(host_id=host_id, since=since, timeout_s=timeout_s, on_park=on_park)
