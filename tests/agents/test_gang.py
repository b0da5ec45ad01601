"""A 2-host gang (a multi-node job) on two real agent processes (`python -m agents.host`,
simulated runtime) against the live control plane: the job follows both its parts.

Ordering, not timing: one agent is frozen (SIGSTOP) while the other reports, so whatever the
machine's speed the control plane has heard from one part only when the assertions run.
The gang is placed by the real scheduling cycle (run in process; the cycle trigger is recorded).
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agents.models import Host
from agents.selectors import host_desired_containers
from gpucloud.catalogue.models import InstanceType
from scheduler.choices import State
from scheduler.cycle import run_cycle
from scheduler.models import Allocation, GangPart, Workload
from tests.agents.test_agent_api import new_token, region, triggered  # noqa: F401 (fixtures)

REPO = Path(__file__).resolve().parents[2]


class Agent:
    def __init__(self, name: str, server: str, token: str, tmp: Path) -> None:
        self.name = name
        self.log = tmp / f"{name}.log"
        argv = [sys.executable, "-m", "agents.host", "--server", server, "--bootstrap-token", token,
                "--gpu-backend", "sim", "--runtime", "sim", "--sim-gpus", "2", "--sim-model", "H100",
                "--state-dir", str(tmp / name), "--hostname", name, "--log-level", "INFO"]
        self.proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=self.log.open("w"))

    def freeze(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        self.thaw()
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(timeout=20) == 0, self.log.read_text()


@pytest.fixture
def agents(live_server, region, tmp_path, triggered, settings) -> Iterator[tuple[Agent, Agent]]:  # noqa: F811
    settings.AGENT_HEARTBEAT_INTERVAL_S = 1  # the live server tells the agents their interval
    a = Agent("gang-a", live_server.url, new_token(region), tmp_path)
    b = Agent("gang-b", live_server.url, new_token(region), tmp_path)
    try:
        wait_for(lambda: Host.objects.filter(name__in=["gang-a", "gang-b"]).count() == 2, "registration", a, b)
        yield a, b
    finally:
        for agent in (a, b):
            if agent.proc.poll() is None:
                agent.stop()


def wait_for(predicate: Callable[[], bool], what: str, *agents: Agent, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        for agent in agents:
            assert agent.proc.poll() is None, agent.log.read_text()
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


def submit_gang(tenant, region, env: dict[str, str], max_retries: int = 0) -> Workload:  # noqa: F811
    """A 2-node job of one H100 per node, placed by a real scheduling cycle on gang-a and gang-b."""
    w = Workload.objects.create(tenant=tenant, kind="job", name="gang", region=region, nodes=2,
                                instance_type=InstanceType.objects.get(code="h100.1x"), image="gpucloud/test:1",
                                command=["torchrun", "train.py"], env=env, max_retries=max_retries)
    run_cycle(region_id=region.pk)
    w.refresh_from_db()
    assert w.state == State.SCHEDULED, w.reason
    hosts = set(Allocation.objects.filter(workload=w, active=True).values_list("host__name", flat=True))
    assert hosts == {"gang-a", "gang-b"}
    return w


def part(w: Workload, host: str) -> GangPart | None:
    return GangPart.objects.filter(workload=w, host__name=host).first()


def rank_of(w: Workload, host: str) -> int:
    """Ranks follow the parts' first allocations (agents.selectors.gang_parts)."""
    first: dict[str, int] = {}
    for pk, name in Allocation.objects.filter(workload=w, active=True).order_by("pk").values_list("pk", "host__name"):
        first.setdefault(name, pk)
    return sorted(first, key=first.__getitem__).index(host)


def states(w: Workload) -> list[str]:
    return list(w.events.values_list("to_state", flat=True))


def logged(agent: Agent, msg: str, instance_id: str) -> bool:
    for line in agent.log.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("msg") == msg and rec.get("instance_id") == instance_id:
            return True
    return False


def test_a_gang_runs_only_with_both_parts_and_succeeds_only_when_both_exit_0(agents, alice, region):  # noqa: F811
    a, b = agents
    b.freeze()
    # each part runs 1 s of simulated work, then exits 0
    w = submit_gang(alice.tenant, region, {"GPUCLOUD_SIM_DURATION_S": "1"})
    wait_for(lambda: (p := part(w, "gang-a")) is not None and p.state in ("running", "exited"), "part A running", a)
    w.refresh_from_db()
    assert w.state == State.STARTING, "one part of two runs: the gang is not running yet"
    wait_for(lambda: (p := part(w, "gang-a")) is not None and p.state == "exited", "part A exited", a)
    w.refresh_from_db()
    assert (part(w, "gang-a").exit_code, w.state) == (0, State.STARTING), "one part exited 0: not a success"
    assert Allocation.objects.filter(workload=w, active=True).count() == 2  # B's part keeps its GPU
    # each part knows its place in the gang
    envs = {name: host_desired_containers(host=Host.objects.get(name=name))[0].env for name in ("gang-a", "gang-b")}
    assert {(e["GPUCLOUD_NODE_RANK"], e["GPUCLOUD_NUM_NODES"]) for e in envs.values()} == {("0", "2"), ("1", "2")}
    b.thaw()
    wait_for(lambda: Workload.objects.get(pk=w.pk).state == State.SUCCEEDED, "SUCCEEDED", a, b)
    w.refresh_from_db()
    assert states(w) == [State.SCHEDULED, State.STARTING, State.RUNNING, State.SUCCEEDED]
    assert w.exit_code == 0 and w.reason == "all 2 parts exited with code 0"
    assert (part(w, "gang-b").state, part(w, "gang-b").exit_code) == ("exited", 0)
    assert not Allocation.objects.filter(workload=w, active=True).exists()


def test_one_part_failing_requeues_the_whole_gang_and_stops_the_other_part(agents, alice, region):  # noqa: F811
    a, b = agents
    # rank 0 runs until stopped; rank 1 exits with code 3 after 1 s
    w = submit_gang(alice.tenant, region, {"GPUCLOUD_SIM_DURATION_S": "3600,1", "GPUCLOUD_SIM_EXIT_CODE": "0,3"},
                    max_retries=1)
    survivor, survivor_agent = ("gang-a", a) if rank_of(w, "gang-a") == 0 else ("gang-b", b)
    first = min(Allocation.objects.filter(workload=w, active=True, host__name=survivor).values_list("pk", flat=True))
    attempt = f"{w.pk}.{first}"
    wait_for(lambda: Workload.objects.get(pk=w.pk).state == State.PENDING, "the gang requeued", a, b)
    w.refresh_from_db()
    assert states(w)[-2:] == [State.FAILED, State.PENDING] and State.SUCCEEDED not in states(w)
    assert w.events.get(to_state=State.FAILED).reason == "part 1 of 2: container exited with code 3"
    assert (w.retries, w.exit_code) == (1, 3)
    assert not Allocation.objects.filter(workload=w, active=True).exists()  # both parts' GPUs are free
    # the surviving part ran, then left its host's desired set: its agent stops the container
    assert logged(survivor_agent, "container started", attempt)
    wait_for(lambda: logged(survivor_agent, "container stopped", attempt), "the other part stopped", a, b)


def test_a_checkpointing_gang_under_notice_is_signalled_stopped_and_requeued_without_a_retry(
        agents, alice, region):  # noqa: F811
    from agents.services.host_ops import host_drain

    a, b = agents
    w = submit_gang(alice.tenant, region, {"GPUCLOUD_SIM_DURATION_S": "3600"}, max_retries=1)
    Workload.objects.filter(pk=w.pk).update(checkpoint_signal="SIGUSR1", checkpoint_grace_s=1)
    wait_for(lambda: Workload.objects.get(pk=w.pk).state == State.RUNNING, "the gang RUNNING", a, b)
    # a notice (the drain of one host gives the whole gang one): both parts get the signal,
    # are stopped a second later, and the gang goes back to the queue, not as a failure
    host_drain(host=Host.objects.get(name="gang-a"))
    wait_for(lambda: Workload.objects.get(pk=w.pk).state == State.PENDING, "the gang requeued", a, b)
    w.refresh_from_db()
    assert State.PREEMPTED in states(w) and State.FAILED not in states(w) and w.retries == 0
    for agent in (a, b):
        assert any(logged(agent, "checkpoint signal sent", iid) for iid in
                   {p.attempt_id for p in GangPart.objects.filter(workload=w)})
