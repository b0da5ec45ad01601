"""The state of a multi-host job (a gang, `nodes > 1`) from the states of its parts. Pure.

A gang is one workload whose allocations span `nodes` hosts; each host's agent runs one
container of it (a *part*) and reports that container alone. The workload's state
follows all its parts, never the first to report:

    parts (this attempt's hosts)                     gang becomes
    -----------------------------------------------  ------------------------------------
    any part failed (exited non-zero, or its         FAILED (requeued as a whole while
      container could not start)                       retries are left); the other parts
                                                       leave their hosts' desired sets and
                                                       their agents stop them
    every part exited 0                              SUCCEEDED (through RUNNING if no
                                                       report saw all of them running)
    every part running or exited 0                   RUNNING
    some part created, running or exited 0           STARTING (from SCHEDULED)
    nothing reported yet                             no change
    STOPPING and every part gone (exited, missing)   STOPPED (scheduler.services decides:
                                                       a timed-out job ends FAILED)

Parts start together: one placement transaction writes every part's allocation, so every
host finds its part in the same desired-set version (and is woken for it), and the job's
clock (`started_at`, billing's RUNNING seconds) starts only when the last part runs.
`gang_next` is the rule; agents.gangs applies it under the workload's row lock, so two
hosts reporting at once are judged one after the other, each seeing the other's part.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

# The workload's states by their stored values, from the container rule's pure copies of
# scheduler.choices.State (Django's; tests/scheduler/test_container_rule.py checks that they
# match). RUNNING below is a part's container state, so the workload's is renamed here.
from scheduler.container import FAILED, SCHEDULED, STARTING, STOPPED, STOPPING, SUCCEEDED
from scheduler.container import RUNNING as WORKLOAD_RUNNING

# What a part's agent last reported about its container.
UNREPORTED: Final = "unreported"  # no report yet (no GangPart row)
CREATED: Final = "created"
RUNNING: Final = "running"
EXITED: Final = "exited"  # with exit_code
MISSING: Final = "missing"  # gone; with `error` when it could not start
GONE: Final = "gone"  # absent from the host's report while the gang is STOPPING


@dataclass(frozen=True)
class Part:
    rank: int
    state: str = UNREPORTED
    exit_code: int | None = None
    error: str = ""

    @property
    def failed(self) -> bool:
        return (self.state == EXITED and self.exit_code != 0) or (self.state == MISSING and bool(self.error))

    @property
    def done(self) -> bool:
        return self.state == EXITED and self.exit_code == 0

    @property
    def up(self) -> bool:
        """Its container ran: running now, or exited 0 after running."""
        return self.state == RUNNING or self.done


@dataclass(frozen=True)
class Move:
    to: str
    reason: str
    exit_code: int | None = None


def gang_next(current: str, parts: Sequence[Part]) -> list[Move]:
    """The transitions a gang in `current` makes given its parts (pure), in order.

    `parts`: one per host of the current attempt, reported or not. Empty: no change.
    """
    if not parts:
        return []
    n = len(parts)
    if current == STOPPING:
        if all(p.state in (EXITED, MISSING, GONE) for p in parts):
            codes = [p.exit_code for p in sorted(parts, key=lambda p: p.rank) if p.exit_code is not None]
            return [Move(STOPPED, f"all {n} containers stopped", codes[0] if codes else None)]
        return []
    if current not in (SCHEDULED, STARTING, WORKLOAD_RUNNING):
        return []
    failed = [p for p in parts if p.failed]
    if failed:
        p = min(failed, key=lambda p: p.rank)
        why = (f"could not start: {p.error}" if p.state == MISSING
               else f"container exited with code {p.exit_code}")
        return [Move(FAILED, f"part {p.rank} of {n}: {why}", p.exit_code)]
    moves: list[Move] = []
    if all(p.up for p in parts):
        if current != WORKLOAD_RUNNING:
            moves.append(Move(WORKLOAD_RUNNING, f"all {n} parts running"))
        if all(p.done for p in parts):
            moves.append(Move(SUCCEEDED, f"all {n} parts exited with code 0", 0))
        return moves
    if current == SCHEDULED and any(p.state in (CREATED, RUNNING, EXITED) for p in parts):
        up = sum(1 for p in parts if p.up)
        return [Move(STARTING, f"{up} of {n} parts running")]
    return []
