"""A small process supervisor for `make demo`: a child that dies is started again.

Each child is restarted after a delay that doubles with every consecutive crash
(`initial_s`, 2x, 4x ... capped at `max_s`); a run that lasted `healthy_after_s` or longer
counts as healthy and resets the delay to `initial_s`. Every exit is logged with its exit
code. Only `stop()` (the demo calls it on Ctrl-C / SIGTERM) ends the children, cleanly:
SIGTERM to all, then SIGKILL to whatever is still running after the grace period.

Pure Python (no Django): the clock is injectable so the restart policy is tested
deterministically with real child processes (tests/test_supervisor.py).
"""
from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Child:
    name: str
    argv: list[str]
    env: dict[str, str] | None = None
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    crashes: int = 0  # consecutive crashes (runs shorter than healthy_after_s)
    restarts: int = 0
    restart_at: float | None = None  # when a crashed child is due to start again
    delays: list[float] = field(default_factory=list)  # every backoff chosen, for the log and the tests

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with {code}"


class Supervisor:
    def __init__(self, *, initial_s: float = 1.0, max_s: float = 60.0, healthy_after_s: float = 60.0,
                 log: Callable[[str], None] = print, clock: Callable[[], float] = time.monotonic) -> None:
        self.initial_s = initial_s
        self.max_s = max_s
        self.healthy_after_s = healthy_after_s
        self.log = log
        self.clock = clock
        self.children: dict[str, Child] = {}

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Child:
        child = Child(name=name, argv=argv, env=env)
        self.children[name] = child
        self._spawn(child)
        return child

    def _spawn(self, child: Child) -> None:
        child.proc = subprocess.Popen(child.argv, env=child.env)
        child.started_at = self.clock()
        child.restart_at = None

    def backoff(self, crashes: int) -> float:
        """The delay before restarting a child after its `crashes`-th consecutive crash (1-based)."""
        return min(self.initial_s * 2 ** (crashes - 1), self.max_s)

    def poll(self) -> None:
        """Notice exited children, schedule their restart, start those that are due."""
        now = self.clock()
        for child in self.children.values():
            if child.proc is not None and child.restart_at is None:
                code = child.proc.poll()
                if code is None:
                    continue
                healthy = now - child.started_at >= self.healthy_after_s
                child.crashes = 1 if healthy else child.crashes + 1
                delay = self.backoff(child.crashes)
                child.delays.append(delay)
                child.restart_at = now + delay
                self.log(f"{child.name} (pid {child.proc.pid}) {describe_exit(code)}; "
                         f"restarting in {delay:g} s (crash {child.crashes} in a row)")
            if child.restart_at is not None and now >= child.restart_at:
                child.restarts += 1
                self._spawn(child)
                self.log(f"{child.name} restarted (pid {child.proc.pid if child.proc else '?'}, "
                         f"restart {child.restarts})")

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM every running child, wait up to timeout_s in all, SIGKILL the rest."""
        running = [c.proc for c in self.children.values()
                   if c.proc is not None and c.restart_at is None and c.proc.poll() is None]
        for proc in running:
            proc.terminate()
        deadline = time.monotonic() + timeout_s
        for proc in running:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
