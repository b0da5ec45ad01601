"""A placement never waits for the next regular heartbeat: the agent keeps a long poll
outstanding whatever its last one came back with (timed out, answered at once because the
server had no slot free, failed), and the server never parks a wait nobody can wake.

Before, the agent polled once per heartbeat answer: a poll that timed out before the next
heartbeat, or that a web process answered at once because its slots were taken, left the
host with no poll until that heartbeat, and a placement in between waited for it (5 s
outliers in `bench_e2e --idle-samples` with 64 hosts). Each test orders the events with
queues and events; none sleeps, none asserts a duration.
"""
from __future__ import annotations

import queue
import random
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from agents import fastpath, longpoll
from agents.host import daemon
from agents.host.client import Unreachable
from agents.host.config import AgentConfig
from agents.host.daemon import Agent
from agents.host.sim import SimGpuBackend, SimRuntime
from agents.host.state import HostState
from agents.protocol import WaitRequest, WaitResponse

TIMEOUT_S = 30.0  # how long a test waits for an event that must come (never reached when it works)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


class PollServer:
    """A control plane whose long polls the test answers one at a time. Each answer is
    (changed, seconds the server held the poll): the agent's clock moves by that much, as if
    the server had parked it that long. An exception is raised to the agent instead."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.polled: queue.Queue[WaitRequest] = queue.Queue()
        self.answers: queue.Queue[tuple[bool, float] | Exception] = queue.Queue()

    def wait(self, token: str, req: WaitRequest) -> WaitResponse:
        self.polled.put(req)
        answer = self.answers.get(timeout=TIMEOUT_S)
        if isinstance(answer, Exception):
            raise answer
        changed, held_s = answer
        self.clock.now += held_s
        return WaitResponse(changed=changed)

    def next_poll(self) -> WaitRequest:
        return self.polled.get(timeout=TIMEOUT_S)


@pytest.fixture
def polling(tmp_path: Path) -> Iterator[tuple[Agent, PollServer]]:
    clock = Clock()
    config = AgentConfig(server="http://127.0.0.1:9", bootstrap_token="b", gpu_backend="sim",
                         runtime="sim", state_dir=tmp_path, hostname="lp")
    runtime = SimRuntime(seed=1)
    agent = Agent(config, backend=SimGpuBackend(model="H100", count=1, hostname="lp", runtime=runtime),
                  runtime=runtime, rng=random.Random(0), clock=clock, resources=(8, 32768))
    server = PollServer(clock)
    agent.client = server  # type: ignore[assignment]
    agent.state = HostState(config.server, "h-1", "tok")
    agent.interval_s = 10.0
    thread = threading.Thread(target=agent._poll_loop, daemon=True)
    thread.start()
    yield agent, server
    agent.request_stop()
    server.answers.put((False, 0.0))  # a poll in flight returns; the loop sees the stop
    thread.join(timeout=TIMEOUT_S)
    assert not thread.is_alive()


def test_a_poll_that_timed_out_is_renewed_at_once_and_a_change_after_it_wakes_the_agent(polling):
    """The poll's timeout and the next heartbeat are not in step (the heartbeat is jittered
    ±10 %): the renewed poll covers the gap, and a placement in it wakes the agent, with no
    heartbeat answer in between."""
    agent, server = polling
    agent._answered("7")
    assert server.next_poll().version == "7"
    server.answers.put((False, 10.0))  # parked its whole timeout: nothing changed
    renewed = server.next_poll()
    assert renewed.version == "7" and agent._answers == 1  # no heartbeat was needed for it
    assert not agent._wake.is_set()
    server.answers.put((True, 0.4))  # the placement lands
    assert agent._wake.wait(TIMEOUT_S)


def test_a_renewed_poll_is_for_the_newest_answer(polling):
    agent, server = polling
    agent._answered("7")
    assert server.next_poll().version == "7"
    agent._answered("9")  # a heartbeat answered meanwhile (nothing for this host)
    server.answers.put((False, 10.0))
    assert server.next_poll().version == "9"


def test_a_poll_the_server_answered_without_parking_is_tried_again_soon(polling):
    """A web process with every long-poll slot taken answers `changed: false` at once: the
    agent polls again after a short pause, not after its next heartbeat."""
    agent, server = polling
    agent._answered("7")
    assert server.next_poll().version == "7"
    server.answers.put((False, 0.0))
    assert server.next_poll().version == "7" and agent._answers == 1
    server.answers.put((True, 1.0))
    assert agent._wake.wait(TIMEOUT_S)


def test_a_failed_poll_is_tried_again_without_a_heartbeat(polling):
    agent, server = polling
    agent._answered("7")
    assert server.next_poll().version == "7"
    server.answers.put(Unreachable("/agent/v1/wait: HTTP 502"))
    assert server.next_poll().version == "7" and agent._answers == 1


def test_a_new_answer_ends_the_pause_after_an_early_answer(polling, monkeypatch):
    """The pause after an unparked poll ends as soon as a heartbeat answers: the next poll is
    for that answer (a pause of an hour here, so only the answer can end it)."""
    agent, server = polling
    monkeypatch.setattr(daemon, "POLL_RETRY_BASE_S", 7200.0)
    monkeypatch.setattr(daemon, "POLL_RETRY_CAP_S", 7200.0)
    agent._answered("7")
    assert server.next_poll().version == "7"
    server.answers.put((False, 0.0))
    with pytest.raises(queue.Empty):  # paused: nothing polls...
        server.polled.get(timeout=0.2)
    agent._answered("8")  # ...until an answer comes
    assert server.next_poll().version == "8"


# --- the server side --------------------------------------------------------------------------


def test_a_wait_registered_after_the_listener_stopped_is_not_parked(settings):
    """The listener's sweep (on its connection's loss it lets every registered wait go) can run
    between a wait's start of the listener and its registration: that wait would be parked
    with nobody to wake it, for its whole timeout. It is answered at once instead (the agent
    polls again shortly, which restarts the listener)."""
    settings.AGENT_LONGPOLL_SLOTS = 2
    assert fastpath.enabled()
    listener = longpoll._Listener()
    listener._ensure_running = lambda: True  # type: ignore[method-assign]  # "running" ...
    listener._ready.clear()  # ... but stopped since, its sweep done
    parked = threading.Event()
    host = "h3-lapse-host"
    changed = listener.wait(host_id=host, since=fastpath.version(host_id=host), timeout_s=3600,
                            on_park=parked.set)
    assert changed is False and not parked.is_set()
    assert not listener._waiting.get(host)
