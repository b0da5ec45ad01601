"""Plugin protocols and registries (kube-scheduler framework style, STYLE 12-13).

A ``Filter`` says whether a host can take a request (``Status``); a ``Score`` ranks
the hosts that passed, 0..MAX_SCORE, multiplied by its weight. Hosts are ranked by
``(-weighted score, host_id)``. Plugins are built per cycle by a factory taking a
``CycleContext`` (now, the typical request mix, the policy knobs they need), and
registered by name so policies can name them as data.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from .model import PlacementRequest
from .state import HostState

MAX_SCORE = 100


class Code(enum.IntEnum):
    OK = 0
    UNSCHEDULABLE = 1  # might fit later (capacity in use, reserved, host not ready)
    UNRESOLVABLE = 2  # this host can never take it (wrong model, too few GPUs)


@dataclass(frozen=True, slots=True)
class Status:
    code: Code
    reasons: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.code is Code.OK


OK = Status(Code.OK)


def unschedulable(*reasons: str) -> Status:
    return Status(Code.UNSCHEDULABLE, reasons)


def unresolvable(*reasons: str) -> Status:
    return Status(Code.UNRESOLVABLE, reasons)


@dataclass(frozen=True, slots=True)
class CycleContext:
    """What plugins may know about the cycle besides the request and the host."""

    now: float
    #: the typical request mix for fragmentation: (milli per GPU or whole count, weight)
    #: entries are (gpus_per_node, gpu_milli, probability), probabilities sum to 1
    mix: tuple[tuple[int, int, float], ...] = ()
    #: the FGD target workload: (gpus_per_node, gpu_milli, vcpus, probability)
    workload: tuple[tuple[int, int, int, float], ...] = ()
    require_island: bool = False


class Filter(Protocol):
    name: str
    #: True when the free-capacity index already guarantees this filter for every
    #: candidate it yields, so the hot path may skip it (kube's PreFilter idea).
    indexed: bool

    def filter(self, req: PlacementRequest, host: HostState) -> Status: ...


class Score(Protocol):
    name: str
    weight: int

    def score(self, req: PlacementRequest, host: HostState) -> int: ...  # 0..MAX_SCORE


FilterFactory = Callable[[CycleContext], Filter]
ScoreFactory = Callable[[CycleContext, int], Score]

FILTERS: dict[str, FilterFactory] = {}
SCORES: dict[str, ScoreFactory] = {}


def register_filter(name: str, factory: FilterFactory) -> None:
    FILTERS[name] = factory


def register_score(name: str, factory: ScoreFactory) -> None:
    SCORES[name] = factory


@dataclass(frozen=True, slots=True)
class PlacementSpec:
    """A named placement strategy: how to walk the index and how to score.

    ``scan`` is "fullest" (hosts with the fewest free GPUs that still fit first:
    packing) or "emptiest" (most free first: spreading). ``k`` hosts that pass the
    filters are scored (kube's percentageOfNodesToScore); k=1 means take the
    first feasible host. ``share_pick`` chooses the GPU for a fractional share:
    "best-fit" (least free that fits), "spread" (most free) or "frag" (least
    increase of expected fragmentation) or "fgd" (least fragmentation gradient
    against the target workload, vCPUs included). ``gradient`` ranks every
    feasible host (the policy's ``k`` is ignored) by the FGD fragmentation
    gradient alone (``FgdGradientScore``, then host_id) instead of ``scores``.
    """

    name: str
    scan: str
    scores: tuple[tuple[str, int], ...]
    k: int = 4
    share_pick: str = "best-fit"
    gradient: bool = False

    @property
    def uses_workload(self) -> bool:
        """Whether it reads FGD's target workload (``Policy.workload``)."""
        return self.gradient or self.share_pick == "fgd" or any(n == "fgd" for n, _w in self.scores)


PLACEMENTS: dict[str, PlacementSpec] = {}


def register_placement(spec: PlacementSpec) -> None:
    PLACEMENTS[spec.name] = spec
