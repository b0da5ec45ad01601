"""The gang rule (scheduler/gang.py): a multi-host job's state from all its parts. Pure."""
from __future__ import annotations

import pytest

from scheduler.choices import State
from scheduler.gang import CREATED, EXITED, GONE, MISSING, RUNNING, Move, Part, gang_next


def parts(*specs) -> list[Part]:
    out = []
    for rank, spec in enumerate(specs):
        if spec is None:
            out.append(Part(rank))
        elif isinstance(spec, tuple):
            out.append(Part(rank, *spec))
        else:
            out.append(Part(rank, spec))
    return out


def test_one_part_running_is_not_a_running_gang():
    assert gang_next(State.SCHEDULED, parts(RUNNING, None)) == [Move(State.STARTING, "1 of 2 parts running")]
    assert gang_next(State.STARTING, parts(RUNNING, CREATED)) == []
    assert gang_next(State.SCHEDULED, parts(None, None)) == []


def test_the_gang_runs_once_every_part_runs():
    assert gang_next(State.STARTING, parts(RUNNING, RUNNING)) == [Move(State.RUNNING, "all 2 parts running")]
    assert gang_next(State.SCHEDULED, parts(RUNNING, RUNNING, RUNNING)) == [
        Move(State.RUNNING, "all 3 parts running")]
    assert gang_next(State.RUNNING, parts(RUNNING, RUNNING)) == []


def test_one_part_exiting_0_waits_for_the_others():
    assert gang_next(State.RUNNING, parts((EXITED, 0), RUNNING)) == []
    # a part that exited 0 did run: with the other running, the gang has run whole
    assert gang_next(State.STARTING, parts((EXITED, 0), RUNNING)) == [Move(State.RUNNING, "all 2 parts running")]


def test_the_gang_succeeds_when_every_part_exited_0():
    assert gang_next(State.RUNNING, parts((EXITED, 0), (EXITED, 0))) == [
        Move(State.SUCCEEDED, "all 2 parts exited with code 0", 0)]
    # both ended between two reports: through RUNNING, so billing and the log see it ran
    assert [m.to for m in gang_next(State.SCHEDULED, parts((EXITED, 0), (EXITED, 0)))] == [
        State.RUNNING, State.SUCCEEDED]


@pytest.mark.parametrize("current", [State.SCHEDULED, State.STARTING, State.RUNNING])
def test_any_part_failing_fails_the_gang(current):
    assert gang_next(current, parts(RUNNING, (EXITED, 3))) == [
        Move(State.FAILED, "part 1 of 2: container exited with code 3", 3)]
    assert gang_next(current, parts((EXITED, 0), (EXITED, 3))) == [
        Move(State.FAILED, "part 1 of 2: container exited with code 3", 3)]
    assert gang_next(current, parts(None, (MISSING, None, "pull access denied"))) == [
        Move(State.FAILED, "part 1 of 2: could not start: pull access denied", None)]


def test_the_first_failing_part_by_rank_is_named():
    assert gang_next(State.RUNNING, parts((EXITED, 0), (EXITED, 2), (EXITED, 9)))[0].reason.startswith("part 1 of 3")


def test_a_missing_part_without_an_error_is_not_a_failure():
    assert gang_next(State.RUNNING, parts(RUNNING, MISSING)) == []


def test_a_stopping_gang_stops_when_every_part_is_gone():
    assert gang_next(State.STOPPING, parts((EXITED, 143), RUNNING)) == []
    assert gang_next(State.STOPPING, parts((EXITED, 143), GONE)) == [
        Move(State.STOPPED, "all 2 containers stopped", 143)]
    assert gang_next(State.STOPPING, parts(GONE, MISSING)) == [Move(State.STOPPED, "all 2 containers stopped")]


@pytest.mark.parametrize("current", [State.PENDING, State.SUCCEEDED, State.FAILED, State.STOPPED, State.LOST])
def test_ended_or_queued_gangs_do_not_move(current):
    assert gang_next(current, parts((EXITED, 3), RUNNING)) == []
    assert gang_next(State.RUNNING, []) == []
