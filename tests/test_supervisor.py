"""The demo's supervisor restarts a crashed child with a growing, capped delay, with real
child processes. Time is a fake clock the test advances, so no assertion depends on speed:
the only real waits are bounded waits for a child to exit or to be running."""
from __future__ import annotations

import sys
import time
from pathlib import Path

from gpucloud.lib.supervisor import Supervisor

# A child steered by a file: "crash" exits 3 at once, "run" runs until the file says "crash".
CHILD = """
import sys, time
from pathlib import Path
mode = Path(sys.argv[1])
while mode.read_text() != "crash":
    time.sleep(0.01)
sys.exit(3)
"""


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def wait_for(predicate, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_crashing_child_is_restarted_with_backoff_and_a_healthy_run_resets_it(tmp_path: Path):
    mode = tmp_path / "mode"
    mode.write_text("crash")
    clock, lines = Clock(), []
    sup = Supervisor(initial_s=1.0, max_s=8.0, healthy_after_s=60.0, log=lines.append, clock=clock)
    child = sup.start("flaky", [sys.executable, "-c", CHILD, str(mode)])
    pids = [child.proc.pid]
    try:
        for expected in (1.0, 2.0, 4.0, 8.0, 8.0):  # doubles, then capped
            wait_for(lambda: child.proc.poll() is not None)
            sup.poll()
            assert child.delays[-1] == expected
            assert child.restart_at == clock.now + expected
            clock.now += expected - 0.001
            sup.poll()  # not yet due: nothing starts
            assert child.proc.pid == pids[-1] and child.restarts == len(pids) - 1
            clock.now += 0.001
            sup.poll()
            assert child.proc.pid != pids[-1], "restarted as a new process"
            pids.append(child.proc.pid)
        assert child.restarts == 5
        assert f"flaky (pid {pids[-2]}) exited with 3; restarting in 8 s (crash 5 in a row)" in lines

        # The child restarted last crashes too; the next one runs 60 s (on the clock): healthy.
        wait_for(lambda: child.proc.poll() is not None)
        sup.poll()
        assert child.delays[-1] == 8.0 and child.crashes == 6
        mode.write_text("run")
        clock.now += 8.0
        sup.poll()
        assert child.restarts == 6
        clock.now += 60.0
        sup.poll()
        assert child.proc.poll() is None, "still running: nothing to restart"
        mode.write_text("crash")
        wait_for(lambda: child.proc.poll() is not None)
        sup.poll()
        assert child.delays[-1] == 1.0 and child.crashes == 1  # a healthy run resets the backoff
    finally:
        sup.stop(timeout_s=10)
    assert child.proc.poll() is not None


def test_stop_ends_every_child_and_restarts_nothing(tmp_path: Path):
    mode = tmp_path / "mode"
    mode.write_text("run")
    clock = Clock()
    sup = Supervisor(initial_s=1.0, max_s=8.0, healthy_after_s=60.0, log=lambda _: None, clock=clock)
    a = sup.start("a", [sys.executable, "-c", CHILD, str(mode)])
    b = sup.start("b", [sys.executable, "-c", "import time; time.sleep(600)"])
    sup.poll()
    assert a.pid and b.pid
    sup.stop(timeout_s=10)
    assert a.proc.returncode == -15 and b.proc.returncode == -15  # SIGTERM, cleanly
    clock.now += 3600
    assert a.restarts == b.restarts == 0
