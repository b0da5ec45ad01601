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
from scheduler.container import END, MOVE, REPORTS, STOP, Step, container_next
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
            assert can_transition(at, step.to), (at, step)
            if step.how == STOP:  # a job stopped for its timeout ends FAILED instead
                assert can_transition(at, State.FAILED)
            at = step.to


def test_its_states_and_reports_are_the_platforms() -> None:
    for name in ("SCHEDULED", "STARTING", "RUNNING", "STOPPING", "STOPPED", "SUCCEEDED", "FAILED", "PREEMPTED"):
        assert getattr(container, name) == State[name]
    assert set(REPORTS) == set(CONTAINER_STATES) | {"gone"}

