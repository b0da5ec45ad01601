"""The lifecycle of an instance or batch job: the legal edges, and nothing else. Pure.

    ┌──── start: a stopped instance goes back through the queue ◀──── STOPPED (either)
    ▼
    PENDING ──place──▶ SCHEDULED ──agent creates──▶ STARTING ──container up──▶ RUNNING
       ▲  │                │  │                         │  │                  │  │  │
       │  │ cancel         │  └────── stop ─────────────┼──┼──▶ STOPPING ◀────┘  │  │
       │  └──▶ STOPPED ◀───┘ (never started)            │  │       │             │  │
       │                                                │  │       ▼             │  │
       │                                       start fails │    STOPPED          │  │
       │                                                ▼  │                     │  │
       │      requeue (job with retries left,       FAILED ◀────── exit≠0 ───────┘  │
       ├──── or spot/batch work preempted) ─────── PREEMPTED ◀── notice runs out ───┤
       │                                                                            │
       └──────────── LOST (host down past grace) ◀── SCHEDULED/STARTING/RUNNING     │
                                                   SUCCEEDED ◀──── exit 0 ──────────┘

STOPPED is where an instance rests: `start` sends it back to PENDING with the same
configuration (its GPUs were released when it stopped; billing stopped with them). A
`DELETE` (terminate) ends it for good. SUCCEEDED is final.

Only `scheduler.services.workload_transition` writes a state, through `can_transition`.
A multi-host job moves along these edges as all its parts say (`scheduler.gang`).
"""
from __future__ import annotations

from scheduler.choices import State

TRANSITIONS: dict[str, frozenset[str]] = {
    State.PENDING: frozenset({State.SCHEDULED, State.STOPPED, State.FAILED}),
    State.SCHEDULED: frozenset(
        {State.STARTING, State.RUNNING, State.STOPPING, State.STOPPED, State.PREEMPTED, State.LOST,
         State.PENDING, State.FAILED}
    ),
    State.STARTING: frozenset(
        {State.RUNNING, State.STOPPING, State.FAILED, State.PREEMPTED, State.LOST, State.SUCCEEDED}
    ),
    State.RUNNING: frozenset(
        {State.STOPPING, State.SUCCEEDED, State.FAILED, State.PREEMPTED, State.LOST}
    ),
    State.STOPPING: frozenset({State.STOPPED, State.LOST, State.SUCCEEDED, State.FAILED}),
    # Requeues: a batch job with retries left, preempted work that goes back to the queue.
    State.FAILED: frozenset({State.PENDING}),
    State.PREEMPTED: frozenset({State.PENDING}),
    State.LOST: frozenset({State.PENDING}),
    # An instance started again (scheduler.services.workload_start) goes back to the queue.
    State.STOPPED: frozenset({State.PENDING}),
    State.SUCCEEDED: frozenset(),
}


def can_transition(old: str, new: str) -> bool:
    return new in TRANSITIONS.get(old, frozenset())
