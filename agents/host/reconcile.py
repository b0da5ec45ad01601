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

Actions are ordered Stop, Remove, Start (free GPUs before taking them), each group by
instance id, so the result is deterministic. Applying the actions and reconciling again
with the new observation yields only ReportExit (for exited-but-still-desired work):
reconcile is idempotent.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
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
class ReportExit:
    instance_id: str
    exit_code: int | None


Action = Start | Stop | Remove | ReportExit

_ORDER = {Stop: 0, Remove: 1, Start: 2, ReportExit: 3}


def reconcile(
    desired: Iterable[DesiredContainer],
    observed: Iterable[ObservedContainer],
    known: Collection[str] | None = None,
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
            actions.append(Start(spec))
        elif seen.state == "created":
            actions += [Remove(iid), Start(spec)]
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
