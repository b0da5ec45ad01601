from __future__ import annotations

import pytest

from agents.host.reconcile import (
    Remove,
    ReportExit,
    Signal,
    Start,
    StartFailure,
    Stop,
    checkpoint_actions,
    checkpoint_due_in,
    reconcile,
    start_failed,
    start_held,
)
from agents.host.sim import SimRuntime
from agents.protocol import DesiredContainer, ObservedContainer


def want(iid: str, **kw: object) -> DesiredContainer:
    return DesiredContainer(instance_id=iid, tenant_id="t1", kind="instance", image="img", **kw)  # type: ignore[arg-type]


def seen(iid: str, state: str, exit_code: int | None = None) -> ObservedContainer:
    return ObservedContainer(instance_id=iid, state=state, exit_code=exit_code)  # type: ignore[arg-type]


A, B = want("a"), want("b")

TABLE = [
    ("nothing desired, nothing there", [], [], []),
    ("desired and missing is started", [A], [], [Start(A)]),
    ("desired and running is left alone", [A], [seen("a", "running")], []),
    ("desired but only created is recreated", [A], [seen("a", "created")], [Remove("a"), Start(A)]),
    (
        "desired and exited is reported, not restarted",
        [A],
        [seen("a", "exited", 3)],
        [ReportExit("a", 3)],
    ),
    ("no longer desired and running is stopped", [], [seen("a", "running")], [Stop("a")]),
    ("no longer desired and exited is removed", [], [seen("a", "exited", 0)], [Remove("a")]),
    ("unknown created container is removed", [], [seen("x", "created")], [Remove("x")]),
    ("a missing report is not a container", [A], [seen("a", "missing")], [Start(A)]),
    (
        "stops come before removes before starts, each by id",
        [B, A],
        [seen("z", "running"), seen("y", "exited", 0), seen("c", "running")],
        [Stop("c"), Stop("z"), Remove("y"), Start(A), Start(B)],
    ),
]


@pytest.mark.parametrize(
    ("desired", "observed", "actions"), [t[1:] for t in TABLE], ids=[t[0] for t in TABLE]
)
def test_reconcile_table(
    desired: list[DesiredContainer], observed: list[ObservedContainer], actions: list[object]
) -> None:
    assert reconcile(desired, observed) == actions


def test_a_running_stray_is_stopped_and_removed_in_one_pass() -> None:
    # "a" was asked for by the control plane and is no longer: stopped now, removed after
    # its exit is reported. "x" never was (left from before a restart): gone in one pass.
    observed = [seen("a", "running"), seen("x", "running")]
    assert reconcile([], observed, known={"a"}) == [Stop("a"), Stop("x"), Remove("x")]
    assert reconcile([], [seen("a", "exited", 0)], known={"a"}) == [Remove("a")]


def test_reconcile_is_idempotent_once_actions_are_applied() -> None:
    rt = SimRuntime(clock=lambda: 1000.0)
    rt.run(want("old"))
    rt.run(want("keep"))
    desired = [want("keep"), want("new")]

    for a in reconcile(desired, rt.list()):
        if isinstance(a, Start):
            rt.run(a.spec)
        elif isinstance(a, Stop):
            rt.stop(a.instance_id)
        elif isinstance(a, Remove):
            rt.remove(a.instance_id)
    # The stopped container is removed on the next pass (after its exit was reported).
    assert reconcile(desired, rt.list()) == [Remove("old")]
    rt.remove("old")
    assert reconcile(desired, rt.list()) == []
    assert reconcile(desired, rt.list()) == []
    assert [o.instance_id for o in rt.list()] == ["keep", "new"]


# --- checkpoint-aware preemption ---------------------------------------------------------

SAVES = dict(checkpoint_signal="SIGUSR1", checkpoint_grace_s=60)
NOTICE = "2026-12-03T16:00:00Z"

CHECKPOINT_TABLE = [
    ("no notice: nothing", [want("a", **SAVES)], {}, 0.0, []),
    ("a notice but no checkpoint: nothing", [want("a", stop_by=NOTICE)], {}, 0.0, []),
    ("a notice and a checkpoint: the signal", [want("a", stop_by=NOTICE, **SAVES)], {}, 0.0,
     [Signal("a", "SIGUSR1")]),
    ("signalled, inside the grace: nothing", [want("a", stop_by=NOTICE, **SAVES)], {"a": 100.0}, 159.0, []),
    ("signalled, the grace over: the stop", [want("a", stop_by=NOTICE, **SAVES)], {"a": 100.0}, 160.0,
     [Stop("a")]),
]


@pytest.mark.parametrize(("desired", "signalled", "now", "expected"),
                         [c[1:] for c in CHECKPOINT_TABLE], ids=[c[0] for c in CHECKPOINT_TABLE])
def test_checkpoint_actions(desired, signalled, now, expected):  # type: ignore[no-untyped-def]
    assert checkpoint_actions(desired, [seen("a", "running")], signalled, now) == expected


def test_a_container_that_is_not_running_gets_no_signal_and_no_stop():
    d = [want("a", stop_by=NOTICE, **SAVES)]
    assert checkpoint_actions(d, [seen("a", "exited", 143)], {}, 0.0) == []
    assert checkpoint_actions(d, [], {"a": 0.0}, 1000.0) == []


def test_the_agent_wakes_when_a_grace_runs_out():
    d = [want("a", stop_by=NOTICE, **SAVES), want("b", **SAVES)]
    assert checkpoint_due_in(d, {}, 0.0) is None
    assert checkpoint_due_in(d, {"a": 100.0}, 130.0) == 30.0
    assert checkpoint_due_in(d, {"a": 100.0}, 500.0) == 0.0


# --- a start that fails: backoff, then give up -------------------------------------------


def test_a_start_that_keeps_failing_is_backed_off_then_given_up() -> None:
    failures: dict[str, StartFailure] = {}
    f = failures["a"] = start_failed(None, "mount refused", now=100.0, delay=2.0)
    assert (f.attempts, f.error, f.retry_at) == (1, "mount refused", 102.0)
    # within its backoff: held (not started, a created leftover removed); after it: tried again
    assert start_held(failures, now=101.0, bound=3) == {"a"}
    assert reconcile([A], [], hold={"a"}) == []
    assert reconcile([A], [seen("a", "created")], hold={"a"}) == [Remove("a")]
    assert start_held(failures, now=102.0, bound=3) == set()
    assert reconcile([A, B], [], hold=start_held(failures, now=102.0, bound=3)) == [Start(A), Start(B)]
    f = failures["a"] = start_failed(f, "mount refused", now=102.0, delay=4.0)
    f = failures["a"] = start_failed(f, "mount refused", now=106.0, delay=8.0)
    assert f.attempts == 3
    # the bound reached: given up for good, whatever the clock says (the control plane fails it)
    assert start_held(failures, now=1e9, bound=3) == {"a"}
    assert reconcile([A, B], [], hold=start_held(failures, now=1e9, bound=3)) == [Start(B)]
