"""`starts_first` (agents/host/daemon.py): a start is not kept waiting by the removal of
containers nobody wants, and such removals are put off at most one iteration."""
from __future__ import annotations

from agents.host.daemon import starts_first
from agents.host.reconcile import Remove, ReportExit, Start, Stop
from agents.protocol import DesiredContainer


def _spec(iid: str) -> DesiredContainer:
    return DesiredContainer(instance_id=iid, tenant_id="t", kind="job", image="x")


def test_removals_of_unwanted_containers_wait_behind_a_start_or_for_the_next_iteration():
    new, stale = _spec("new"), _spec("stale")
    actions = [Stop("stray"), Remove("done"), Remove("stale"), Start(new), Start(stale), ReportExit("x", 0)]
    desired = [new, stale]
    assert starts_first(actions, desired, defer=True) == [
        Stop("stray"), Remove("stale"), Start(new), Start(stale), ReportExit("x", 0)]
    assert starts_first(actions, desired, defer=False) == [
        Stop("stray"), Remove("stale"), Start(new), Start(stale), ReportExit("x", 0), Remove("done")]


def test_without_a_start_nothing_moves():
    actions = [Stop("a"), Remove("b"), ReportExit("c", 1)]
    assert starts_first(actions, [], defer=True) == actions
