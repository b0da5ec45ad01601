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
    missing with an error,      SCHEDULED..RUNNING     FAILED "could not start: <error>"
      attempts 0 or >= bound
    missing with an error,      SCHEDULED..RUNNING     reason "start failed (attempt k of N)...":
      attempts < bound                                   the agent tries again after a backoff
    missing, no error           SCHEDULED, STARTING    none: the agent is still starting it
    missing, no error           RUNNING                container_lost event (count, what the agent
                                                         saw); a job FAILED (requeued if retries are
                                                         left), an instance recreated by its agent,
                                                         FAILED once lost more than the bound
    running, restarts > seen    RUNNING                container_restarted event; a job FAILED (a
                                                         second run its retry policy did not allow)
    exited, missing, gone       STOPPING               STOPPED (a job stopped for its timeout: FAILED)
    anything else                                      none

The bound on attempts is WORKLOAD_START_ATTEMPTS (the agent stops trying at the same count,
`HeartbeatResponse.start_attempts`); "attempts 0" is an older agent, which reports one failure
only. The bound on time in SCHEDULED/STARTING is `scheduler.services.workloads_start_overdue`'s
(a periodic check). The agent's `note` (a stand-in image, what it saw of a lost container)
goes into the reason of the RUNNING step and into the events.

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
NOTE: Final = "note"  # no move: the reason alone changes (guarded on the state)
EVENT: Final = "event"  # no move: a container event on the workload (`container_event_record`)

# The kinds of container event (scheduler.models.ContainerEvent).
CONTAINER_LOST: Final = "container_lost"
CONTAINER_RESTARTED: Final = "container_restarted"

_UP: Final = (SCHEDULED, STARTING, RUNNING)


@dataclass(frozen=True)
class Step:
    """One step of a workload. `exit_code`: a fact reported alongside the state, recorded with
    it (None: nothing to record). A PREEMPTED step's reason is the notice's cause, which the
    applier takes from the workload (`Workload.stop_cause`, scheduler/notice.py)."""

    to: str
    reason: str
    how: str = MOVE
    exit_code: int | None = None
    event: str = ""  # EVENT: its kind
    count: int = 0  # EVENT: the how-manieth of its kind in this run


@dataclass(frozen=True)
class Seen:
    """What the agent said beyond the state (`agents.protocol.ObservedContainer`), and what the
    workload's run has recorded of it: container events so far since it last started."""

    start_attempts: int = 0
    max_attempts: int = 3
    restarts: int = 0
    note: str = ""
    losses: int = 0  # container_lost events recorded in this run
    restarts_seen: int = 0  # the highest restart count recorded in this run
    max_losses: int = 3


def needs_history(current: str, report: Report, *, error: str = "", restarts: int = 0) -> bool:
    """Whether `container_next` needs the run's recorded events (`Seen.losses`,
    `Seen.restarts_seen`) for this report: only a lost or restarted container (rare)."""
    return current == RUNNING and ((report == "missing" and not error) or restarts > 0)


def container_next(current: str, report: Report, *, job: bool, on_notice: bool = False,
                   exit_code: int | None = None, error: str = "", seen: Seen | None = None) -> list[Step]:
    """The steps a single-host workload in `current` takes on `report` of its container (pure).

    `exit_code` and `error` as the agent reported them; `job`: a batch
    job (not an instance); `on_notice`: it has a preemption or drain deadline; `seen`: the
    rest of the report and the run's history (`needs_history`). Empty: no change.
    """
    seen = seen or Seen()
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
    running = "container running" + (f"; {seen.note}" if seen.note else "")
    if report == "running":
        steps = [Step(RUNNING, running)] if current != RUNNING else []
        if current == RUNNING and seen.restarts > seen.restarts_seen:
            what = seen.note or "its container started again without the agent's order"
            steps.append(Step(RUNNING, what, EVENT, event=CONTAINER_RESTARTED, count=seen.restarts))
            if job:  # a second run of the job that its retry policy did not allow
                steps.append(Step(FAILED, f"container restarted without the agent's order: {what}", END))
        return steps
    if report == "missing":
        if error:
            k, bound = seen.start_attempts, seen.max_attempts
            if 0 < k < bound:
                return [Step(current, f"start failed (attempt {k} of {bound}), trying again: {error}", NOTE)]
            after = f" (after {k} attempts)" if k > 1 else ""
            return [Step(FAILED, f"could not start{after}: {error}", END)]
        if current != RUNNING:
            return []
        n, what = seen.losses + 1, seen.note or "its container is gone; the agent did not remove it"
        steps = [Step(RUNNING, what, EVENT, event=CONTAINER_LOST, count=n)]
        if job:
            steps.append(Step(FAILED, f"container lost: {what}", END))
        elif n > seen.max_losses:
            steps.append(Step(FAILED, f"container lost {n} times: {what}", END))
        else:  # its agent starts it again (it is still desired): said, not silent
            steps.append(Step(RUNNING, f"container lost ({n} of at most {seen.max_losses}), recreated: {what}",
                              NOTE))
        return steps
    if report != "exited":
        return []
    ran = [Step(RUNNING, running)] if current != RUNNING else []
    if job and exit_code == 0:
        return [*ran, Step(SUCCEEDED, "exited with code 0", MOVE, 0)]
    if job and on_notice:
        return [*ran, Step(PREEMPTED, "", END, exit_code)]
    return [*ran, Step(FAILED, f"container exited with code {exit_code}", END, exit_code)]
