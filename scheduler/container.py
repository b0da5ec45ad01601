"""The state of a single-host workload from what its host says of its container. Pure.

The host's agent reports each container of the work it runs (`agents.protocol.
ObservedContainer`); a container of a workload the host holds that the report leaves out is
*gone*. This table turns one report and the workload's current state into the steps the
workload takes, in order (multi-host jobs follow all their parts instead: `scheduler.gang`):

    reported container          workload               steps
    --------------------------  ---------------------  --------------------------------------------
    created                     SCHEDULED              STARTING
    running                     SCHEDULED, STARTING    RUNNING
    exited 0, job               SCHEDULED..RUNNING     (RUNNING ->) SUCCEEDED
    exited N, job on notice     SCHEDULED..RUNNING     (RUNNING ->) PREEMPTED, requeued, no retry spent
    exited N, job               SCHEDULED..RUNNING     (RUNNING ->) FAILED, requeued if retries are left
    exited N, instance          SCHEDULED..RUNNING     (RUNNING ->) FAILED "container exited with code N"
    missing with an error       SCHEDULED..RUNNING     FAILED "could not start: <error>"
    missing, no error           SCHEDULED..RUNNING     none: the agent is still starting it
    exited, missing, gone       STOPPING               STOPPED (a job stopped for its timeout: FAILED)
    anything else                                      none

An exited container passes through RUNNING first, so billing and the event log see that it
started even when it ended between two heartbeats. A job "on notice" has a preemption or
drain deadline (`stop_by`): whatever it exits with but 0 (its checkpoint saved, or stopped by
the agent when the grace ran out), it is preempted, as when the notice runs out.

`container_next` is the rule; `agents.services.containers` applies its steps (one by one, or
the common moves in bulk), so the slow and the bulk heartbeat path cannot drift apart.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal, get_args

# What the agent says of a container (agents.protocol.ContainerState), or "gone": the report
# leaves it out.
Report = Literal["created", "running", "exited", "missing", "gone"]
REPORTS: Final[tuple[Report, ...]] = get_args(Report)

# Workload states by their stored values: scheduler.choices.State is Django's, and this module
# imports no Django (tests/scheduler/test_container_rule.py checks that they match).
SCHEDULED: Final = "scheduled"
STARTING: Final = "starting"
RUNNING: Final = "running"
STOPPING: Final = "stopping"
STOPPED: Final = "stopped"
SUCCEEDED: Final = "succeeded"
FAILED: Final = "failed"
PREEMPTED: Final = "preempted"

# How a step is applied (scheduler.services):
MOVE: Final = "move"  # one guarded transition (`workload_transition`)
END: Final = "end"  # the run ends: a job is requeued if it may (`workload_requeue_or_end`)
STOP: Final = "stop"  # a stop is done: STOPPED, or FAILED for a timeout (`workload_stopped`)

_UP: Final = (SCHEDULED, STARTING, RUNNING)


@dataclass(frozen=True)
class Step:
    """One step of a workload. `exit_code`: a fact reported alongside the state, recorded with
    it (None: nothing to record). A PREEMPTED step's reason is the notice's own, less its
    countdown, which the applier takes from the workload (`scheduler.cycle.notice_served`)."""

    to: str
    reason: str
    how: str = MOVE
    exit_code: int | None = None


def container_next(current: str, report: Report, *, job: bool, on_notice: bool = False,
                   exit_code: int | None = None, error: str = "") -> list[Step]:
    """The steps a single-host workload in `current` takes on `report` of its container (pure).

    `exit_code` and `error` as the agent reported them; `job`: a batch
    job (not an instance); `on_notice`: it has a preemption or drain deadline. Empty: no change.
    """
    if current == STOPPING:
        if report == "gone":
            return [Step(STOPPED, "container gone", STOP)]
        if report in ("exited", "missing"):
            return [Step(STOPPED, "container stopped", STOP, exit_code)]
        return []
    if current not in _UP:
        return []
    if report == "created":
        return [Step(STARTING, "container created")] if current == SCHEDULED else []
    if report == "running":
        return [Step(RUNNING, "container running")] if current != RUNNING else []
    if report == "missing":
        return [Step(FAILED, f"could not start: {error}", END)] if error else []
    if report != "exited":
        return []
    ran = [Step(RUNNING, "container running")] if current != RUNNING else []
    if job and exit_code == 0:
        return [*ran, Step(SUCCEEDED, "exited with code 0", MOVE, 0)]
    if job and on_notice:
        return [*ran, Step(PREEMPTED, "", END, exit_code)]
    return [*ran, Step(FAILED, f"container exited with code {exit_code}", END, exit_code)]
