"""Pure reconciliation: desired containers + observed containers -> actions.

Rules (one row per instance id; ``desired`` comes from the last heartbeat response)::

    desired?  observed state        actions
    yes       (none)                Start        start what is desired and missing
    yes       running               -            converged
    yes       created               Remove, Start  a create that never started: retry it
    yes       exited                ReportExit   never restarted here: the control plane
                                                 decides (job done, retry, instance failed)
    no        running               Stop         no longer wanted (invariant 5: within one
                                                 interval); removed on a later pass, after
                                                 its exit has been reported once
    no, never running               Stop, Remove  a stray: a gpucloud container this agent
    (not known)                                  was never asked to run (left from before a
                                                 restart, or started by hand): nobody waits
                                                 for its exit, so it goes in one pass
    no        created | exited      Remove       finished, or a gpucloud container we do
                                                 not know: clean it up

``known`` is the set of instance ids the control plane has asked this agent process to
run; None (the default) treats every container as known.

``hold``: desired instance ids not to start now (``start_held``): a start that failed waits
out its backoff, and one that failed ``bound`` times in a row is given up (the control plane
fails the workload at that count, with the runtime's message). A held instance gets no Start;
a ``created`` leftover of its failed start is removed.

Checkpoint-aware preemption (``checkpoint_actions``, a second pure pass): a desired, running
container whose job checkpoints (``checkpoint_signal``) and that is under a preemption notice
(``stop_by``) gets a ``Signal`` once, then a ``Stop`` once ``checkpoint_grace_s`` has passed
since the signal - while it is still desired (if the control plane drops it first, the rules
above stop it at once). Its exit is then reported like any other; the control plane requeues
a job that ends under a notice (docs/scheduler.md).

Actions are ordered Stop, Remove, Start (free GPUs before taking them), each group by
instance id, so the result is deterministic. Applying the actions and reconciling again
with the new observation yields only ReportExit (for exited-but-still-desired work):
reconcile is idempotent.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from agents.protocol import DesiredContainer, ObservedContainer


@dataclass(frozen=True)
class Start:
    spec: DesiredContainer

    @property
    def instance_id(self) -> str:
        return self.spec.instance_id


@dataclass(frozen=True)
class Stop:
    instance_id: str


@dataclass(frozen=True)
class Remove:
    instance_id: str


@dataclass(frozen=True)
class Signal:
    instance_id: str
    signal: str


@dataclass(frozen=True)
class ReportExit:
    instance_id: str
    exit_code: int | None


Action = Start | Stop | Remove | ReportExit | Signal


@dataclass(frozen=True)
class StartFailure:
    """The failed starts in a row of one desired container: how many, the runtime's message
    of the last, and when (the agent's clock) the next may be tried."""

    attempts: int
    error: str
    retry_at: float


def start_failed(prev: StartFailure | None, error: str, now: float, delay: float) -> StartFailure:
    """One more failed start after ``prev``; the next is tried ``delay`` seconds from ``now``."""
    return StartFailure((prev.attempts if prev else 0) + 1, error, now + delay)


def start_held(failures: Mapping[str, StartFailure], now: float, bound: int) -> set[str]:
    """Instance ids whose start waits (within its backoff) or is given up (``bound`` failed
    starts in a row: a start that fails the same way is not tried forever)."""
    return {iid for iid, f in failures.items() if f.attempts >= bound or now < f.retry_at}

_ORDER = {Stop: 0, Remove: 1, Start: 2, ReportExit: 3, Signal: 4}


def reconcile(
    desired: Iterable[DesiredContainer],
    observed: Iterable[ObservedContainer],
    known: Collection[str] | None = None,
    hold: Collection[str] = (),
) -> list[Action]:
    """Actions that move ``observed`` towards ``desired``; see the module docstring."""
    want = {d.instance_id: d for d in desired}
    have: dict[str, ObservedContainer] = {}
    for o in observed:
        if o.state == "missing":
            continue  # a report, not a container
        have.setdefault(o.instance_id, o)

    actions: list[Action] = []
    for iid, spec in want.items():
        seen = have.get(iid)
        if seen is None:
            if iid not in hold:
                actions.append(Start(spec))
        elif seen.state == "created":
            actions += [Remove(iid)] if iid in hold else [Remove(iid), Start(spec)]
        elif seen.state == "exited":
            actions.append(ReportExit(iid, seen.exit_code))
    for iid, o in have.items():
        if iid in want:
            continue
        if o.state != "running":
            actions.append(Remove(iid))
        elif known is None or iid in known:
            actions.append(Stop(iid))
        else:
            actions += [Stop(iid), Remove(iid)]

    actions.sort(key=lambda a: (_ORDER[type(a)], a.instance_id))
    return actions


def checkpoint_actions(
    desired: Iterable[DesiredContainer],
    observed: Iterable[ObservedContainer],
    signalled: Mapping[str, float],
    now: float,
) -> list[Action]:
    """Signal, then Stop after the grace (see the module docstring). ``signalled`` maps an
    instance id to when (on the caller's clock, like ``now``) its signal was sent."""
    running = {o.instance_id for o in observed if o.state == "running"}
    out: list[Action] = []
    for d in desired:
        iid = d.instance_id
        if d.checkpoint_signal is None or d.stop_by is None or iid not in running:
            continue
        sent = signalled.get(iid)
        if sent is None:
            out.append(Signal(iid, d.checkpoint_signal))
        elif now - sent >= d.checkpoint_grace_s:
            out.append(Stop(iid))
    out.sort(key=lambda a: (_ORDER[type(a)], a.instance_id))
    return out


def checkpoint_due_in(
    desired: Iterable[DesiredContainer], signalled: Mapping[str, float], now: float
) -> float | None:
    """Seconds until the next grace runs out (0 if one has); None if none is running."""
    due = [
        signalled[d.instance_id] + d.checkpoint_grace_s - now
        for d in desired
        if d.instance_id in signalled and d.stop_by is not None
    ]
    return max(0.0, min(due)) if due else None
