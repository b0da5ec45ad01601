"""The container rule (scheduler/container.py): a single-host workload's steps from its state and
what its host reports of its container. Pure: every (state, report) pair, for a job, a job on
notice and an instance. That it imports no Django is the "pure" import contract's to check
(pyproject.toml, `lint-imports`)."""
from __future__ import annotations

import itertools

import pytest

from agents.protocol import CONTAINER_STATES
from scheduler import container
from scheduler.choices import State
from scheduler.container import (
    CONTAINER_LOST,
    CONTAINER_RESTARTED,
    END,
    EVENT,
    MOVE,
    NOTE,
    REPORTS,
    STOP,
    Seen,
    Step,
    container_next,
    needs_history,
)
from scheduler.lifecycle import can_transition

# What a report can say: (container state, exit code, error)
CREATED = ("created", None, "")
RUNNING = ("running", None, "")
EXIT_0 = ("exited", 0, "")
EXIT_3 = ("exited", 3, "")
MISSING = ("missing", None, "")
UNPULLABLE = ("missing", None, "pull access denied")
GONE = ("gone", None, "")
CASES = [CREATED, RUNNING, EXIT_0, EXIT_3, MISSING, UNPULLABLE, GONE]

RAN = Step(State.RUNNING, "container running")
SUCCEEDED = Step(State.SUCCEEDED, "exited with code 0", MOVE, 0)
FAILED_3 = Step(State.FAILED, "container exited with code 3", END, 3)
NOT_STARTED = Step(State.FAILED, "could not start: pull access denied", END)

GONE_WORDS = "its container is gone; the agent did not remove it"
LOST = Step(State.RUNNING, GONE_WORDS, EVENT, event=CONTAINER_LOST, count=1)

# A batch job with no notice. Every pair not listed changes nothing.
JOB = {
    (State.SCHEDULED, CREATED): [Step(State.STARTING, "container created")],
    (State.SCHEDULED, RUNNING): [RAN],
    (State.SCHEDULED, EXIT_0): [RAN, SUCCEEDED],
    (State.SCHEDULED, EXIT_3): [RAN, FAILED_3],
    (State.SCHEDULED, UNPULLABLE): [NOT_STARTED],
    (State.STARTING, RUNNING): [RAN],
    (State.STARTING, EXIT_0): [RAN, SUCCEEDED],
    (State.STARTING, EXIT_3): [RAN, FAILED_3],
    (State.STARTING, UNPULLABLE): [NOT_STARTED],
    (State.RUNNING, EXIT_0): [SUCCEEDED],
    (State.RUNNING, EXIT_3): [FAILED_3],
    (State.RUNNING, UNPULLABLE): [NOT_STARTED],
    # its container gone without the agent's order: the event, and the run ends (a retry if allowed)
    (State.RUNNING, MISSING): [LOST, Step(State.FAILED, f"container lost: {GONE_WORDS}", END)],
    (State.STOPPING, EXIT_0): [Step(State.STOPPED, "container stopped", STOP, 0)],
    (State.STOPPING, EXIT_3): [Step(State.STOPPED, "container stopped", STOP, 3)],
    (State.STOPPING, MISSING): [Step(State.STOPPED, "container stopped", STOP)],
    (State.STOPPING, UNPULLABLE): [Step(State.STOPPED, "container stopped", STOP)],
    (State.STOPPING, GONE): [Step(State.STOPPED, "container gone", STOP)],
}
# A job on notice (preempted, or its host draining) that exits but with 0 is preempted.
PREEMPTED_3 = Step(State.PREEMPTED, "", END, 3)
JOB_ON_NOTICE = JOB | {
    (State.SCHEDULED, EXIT_3): [RAN, PREEMPTED_3],
    (State.STARTING, EXIT_3): [RAN, PREEMPTED_3],
    (State.RUNNING, EXIT_3): [PREEMPTED_3],
}
# An instance never succeeds: whatever it exits with, it failed (a rental is not meant to end).
FAILED_0 = Step(State.FAILED, "container exited with code 0", END, 0)
INSTANCE = JOB | {
    (State.SCHEDULED, EXIT_0): [RAN, FAILED_0],
    (State.STARTING, EXIT_0): [RAN, FAILED_0],
    (State.RUNNING, EXIT_0): [FAILED_0],
    # recreated by its agent (still desired), and said so
    (State.RUNNING, MISSING): [LOST, Step(State.RUNNING, f"container lost (1 of at most 3), recreated: {GONE_WORDS}",
                                          NOTE)],
}

PAIRS = list(itertools.product(State, CASES))
IDS = [f"{state.value}-{report}-{code}-{'error' if error else ''}" for state, (report, code, error) in PAIRS]
RULES = {"job": (JOB, True, False), "job on notice": (JOB_ON_NOTICE, True, True), "instance": (INSTANCE, False, False),
         "instance on notice": (INSTANCE, False, True)}


def _steps(current: str, case: tuple, *, job: bool, on_notice: bool) -> list[Step]:
    report, exit_code, error = case
    return container_next(current, report, job=job, on_notice=on_notice, exit_code=exit_code, error=error)


@pytest.mark.parametrize("rule", list(RULES))
@pytest.mark.parametrize(("current", "case"), PAIRS, ids=IDS)
def test_the_container_rule(rule: str, current: State, case: tuple) -> None:
    table, job, on_notice = RULES[rule]
    assert _steps(current, case, job=job, on_notice=on_notice) == table.get((current, case), [])


def test_the_tables_name_only_real_pairs() -> None:
    for table, _, _ in RULES.values():
        assert set(table) <= set(PAIRS)


@pytest.mark.parametrize(("current", "case"), PAIRS, ids=IDS)
def test_every_step_is_an_edge_of_the_lifecycle(current: State, case: tuple) -> None:
    for _, job, on_notice in RULES.values():
        at = str(current)
        for step in _steps(current, case, job=job, on_notice=on_notice):
            if step.how in (NOTE, EVENT):  # no move: said of the state it is in
                assert step.to == at, (at, step)
                continue
            assert can_transition(at, step.to), (at, step)
            if step.how == STOP:  # a job stopped for its timeout ends FAILED instead
                assert can_transition(at, State.FAILED)
            at = step.to


def test_its_states_and_reports_are_the_platforms() -> None:
    for name in ("SCHEDULED", "STARTING", "RUNNING", "STOPPING", "STOPPED", "SUCCEEDED", "FAILED", "PREEMPTED"):
        assert getattr(container, name) == State[name]
    assert set(REPORTS) == set(CONTAINER_STATES) | {"gone"}



# The bound on attempts: (failed starts reported, bound) -> what a SCHEDULED workload does.
@pytest.mark.parametrize(("attempts", "expected"), [
    (0, [Step(State.FAILED, "could not start: mount refused", END)]),  # an older agent: at once
    (1, [Step(State.SCHEDULED, "start failed (attempt 1 of 3), trying again: mount refused", NOTE)]),
    (2, [Step(State.SCHEDULED, "start failed (attempt 2 of 3), trying again: mount refused", NOTE)]),
    (3, [Step(State.FAILED, "could not start (after 3 attempts): mount refused", END)]),
    (7, [Step(State.FAILED, "could not start (after 7 attempts): mount refused", END)]),
])
def test_a_failing_start_is_tried_up_to_the_bound_then_fails_with_the_runtimes_message(attempts, expected):
    seen = Seen(start_attempts=attempts, max_attempts=3)
    for job in (True, False):
        assert container_next(State.SCHEDULED, "missing", job=job, error="mount refused", seen=seen) == expected


def test_an_instance_lost_more_often_than_the_bound_fails_with_what_the_agent_saw():
    what = "container 0123456789ab is gone; the agent did not remove it"
    seen = Seen(note=what, losses=3, max_losses=3)
    assert needs_history(State.RUNNING, "missing")
    assert container_next(State.RUNNING, "missing", job=False, seen=seen) == [
        Step(State.RUNNING, what, EVENT, event=CONTAINER_LOST, count=4),
        Step(State.FAILED, f"container lost 4 times: {what}", END)]


def test_a_restart_without_the_agents_order_is_an_event_once_and_ends_a_jobs_run():
    what = "container 0123456789ab started again at T1 (first at T0) without the agent's order"
    event = Step(State.RUNNING, what, EVENT, event=CONTAINER_RESTARTED, count=2)
    assert needs_history(State.RUNNING, "running", restarts=2)
    assert container_next(State.RUNNING, "running", job=False, seen=Seen(restarts=2, restarts_seen=1, note=what)) \
        == [event]
    assert container_next(State.RUNNING, "running", job=False, seen=Seen(restarts=2, restarts_seen=2, note=what)) \
        == []  # recorded already
    assert container_next(State.RUNNING, "running", job=True, seen=Seen(restarts=2, restarts_seen=1, note=what)) \
        == [event, Step(State.FAILED, f"container restarted without the agent's order: {what}", END)]


def test_the_agents_note_of_a_stand_in_image_is_in_the_running_reason():
    note = "image x/y is not on this host (a demo pulls nothing): the busybox stand-in runs in its place"
    assert container_next(State.STARTING, "running", job=False, seen=Seen(note=note)) == [
        Step(State.RUNNING, f"container running; {note}")]
