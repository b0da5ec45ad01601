"""What the queue looks like, for the fragmentation scores: the request mix and
FGD's target workload, derived from the pending requests when the policy fixes none.
The simulator derives them once from the whole trace with the same functions."""

from __future__ import annotations

import operator
from collections import Counter
from collections.abc import Iterable, Sequence

from ..model import WHOLE, PlacementRequest

_MIX_SHAPE_OF = operator.attrgetter("gpus_per_node", "gpu_milli")
_WORKLOAD_SHAPE_OF = operator.attrgetter("gpus_per_node", "gpu_milli", "vcpus")


def derive_mix(
    reqs: Sequence[PlacementRequest], top: int = 8
) -> tuple[tuple[int, int, float], ...]:
    """The typical request mix for fragmentation scores: the ``top`` most common
    shapes of the queue, as (gpus_per_node, gpu_milli, probability)."""
    counts = Counter(map(_MIX_SHAPE_OF, reqs))
    if not counts:
        return ((1, WHOLE, 1.0),)
    common = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
    total = sum(c for _k, c in common)
    return tuple((g, m, c / total) for (g, m), c in common)


def derive_workload(
    reqs: Iterable[PlacementRequest], popularity: float = 1.0
) -> tuple[tuple[int, int, int, float], ...]:
    """The FGD target workload: the popularity of the task shapes (GPU count or
    milli share, and vCPUs) among ``reqs``, as (gpus_per_node, gpu_milli, vcpus,
    probability), most popular first (ties by shape). With ``popularity`` < 1 only
    the most popular shapes are kept, until they cover that share of the tasks,
    and renormalised (FGD's "typical pods": 0.95 in its experiments)."""
    counts = Counter(map(_WORKLOAD_SHAPE_OF, reqs))
    if not counts:
        return ((1, WHOLE, 0, 1.0),)
    total = sum(counts.values())
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    if popularity < 1.0:
        kept = 0
        for i, (_shape, n) in enumerate(ranked):
            if kept >= popularity * total:
                ranked = ranked[:i]
                break
            kept += n
        total = kept
    return tuple((g, m, c, n / total) for (g, m, c), n in ranked)
