"""Cycle-local working state: mutable per-host views and the free-capacity index.

``plan()`` copies the frozen snapshot into these structures once, then every
placement consumes capacity here (STYLE 14, AWX ``consume_capacity``), so one
cycle never books a GPU twice. Plugins receive a ``HostState`` - the core's
equivalent of kube-scheduler's ``NodeInfo``: the static ``HostView`` facts plus
what this cycle has already taken - rather than the frozen ``HostView``,
because re-building frozen views after each placement would cost more than the
placement itself.

The index (STYLE 17): a ``Pool`` per (region, GPU model) keeps
* ``by_free[c]`` - ready hosts with exactly ``c`` free whole GPUs, and
* ``shared[b]`` - GPUs carrying fractional shares, bucketed by free milli // 125,
as insertion-ordered dicts (ordered sets), so a request looks only at buckets
that can hold it instead of scanning the fleet.
"""

from __future__ import annotations

import math
import operator
from collections import Counter
from collections.abc import Iterable

from .model import (
    CLASS_RANK,
    WHOLE,
    Allocation,
    ClusterSnapshot,
    HostPlacement,
    HostView,
)

# C-level attribute getters: building the state for 100k GPUs is a hot loop
_UUID = operator.attrgetter("uuid")
_ISLAND = operator.attrgetter("nvlink_island")
_NUMA = operator.attrgetter("numa_node")
_WHOLE = operator.attrgetter("whole")
_HELD = operator.attrgetter("whole", "used_milli")
_UTIL = operator.attrgetter("utilisation")
_IDLE = operator.attrgetter("idle_since")

SHARE_BUCKET = 125  # milli per shared-GPU bucket; 8 buckets cover 1..999 free
N_SHARE_BUCKETS = WHOLE // SHARE_BUCKET
INF = math.inf


class HostRes:
    """CPU and memory of a host, shared by its per-model slices."""

    __slots__ = ("free_vcpus", "free_mem", "total_vcpus", "total_mem")

    def __init__(self, free_vcpus: int, free_mem: int, total_vcpus: int, total_mem: int) -> None:
        self.free_vcpus = free_vcpus
        self.free_mem = free_mem
        self.total_vcpus = max(total_vcpus, free_vcpus)
        self.total_mem = max(total_mem, free_mem)


class AllocState:
    """A running allocation plus what this cycle decided about it."""

    __slots__ = ("alloc", "rank", "doomed", "end", "gpu_count")

    def __init__(self, alloc: Allocation, now: float) -> None:
        self.alloc = alloc
        self.rank = CLASS_RANK.get(alloc.priority, 1)
        # doomed: already under notice, or chosen as a victim in this cycle
        self.doomed = alloc.preempting
        if alloc.preempting:
            self.end = alloc.stop_by if alloc.stop_by is not None else now
        else:
            self.end = alloc.expected_end if alloc.expected_end is not None else INF
        self.gpu_count = sum(len(p.gpus) for p in alloc.placements)


class HostState:
    """The GPUs of one model on one host (a host with two models has two slices)."""

    __slots__ = (
        "host_id",
        "region",
        "model",
        "ready",
        "view",
        "uuids",
        "island",
        "numa",
        "whole",
        "milli",
        "util",
        "idle_since",
        "load",
        "total",
        "free",
        "island_free",
        "res",
        "pos",
        "allocs",
        "reserved_at",
        "reserved_for",
        "pool",
        "scores",
        "share_memo",
    )

    def __init__(
        self, view: HostView, model: str, res: HostRes, single_model: bool = False
    ) -> None:
        gpus = list(view.gpus) if single_model else [g for g in view.gpus if g.model == model]
        idx = [g.index for g in gpus]
        if idx != sorted(idx):
            gpus.sort(key=lambda g: g.index)
        self.view = view
        self.host_id = view.host_id
        self.region = view.region
        self.model = model
        self.ready = view.ready
        # runs for every host of the fleet each cycle: list comprehensions beat one
        # loop with appends in CPython
        uuids = list(map(_UUID, gpus))
        island = tuple(map(_ISLAND, gpus))
        milli = [WHOLE if w else min(m, WHOLE) for w, m in map(_HELD, gpus)]
        util = tuple(map(_UTIL, gpus))
        self.uuids: tuple[str, ...] = tuple(uuids)
        self.island: tuple[int, ...] = island
        self.numa: tuple[int, ...] = tuple(map(_NUMA, gpus))
        self.whole: list[bool] = list(map(_WHOLE, gpus))
        self.milli: list[int] = milli
        self.util: tuple[float, ...] = util
        self.idle_since: tuple[float | None, ...] = tuple(map(_IDLE, gpus))
        self.total = len(gpus)
        self.load = sum(util) / self.total if gpus else 0.0
        island_free = dict.fromkeys(island, 0)
        free = 0
        for i, m in enumerate(milli):
            if m == 0:
                free += 1
                island_free[island[i]] += 1
        self.free = free
        self.island_free = island_free
        self.res = res
        self.pos: dict[str, int] = {u: i for i, u in enumerate(uuids)}
        self.allocs: list[AllocState] = []
        self.reserved_at: float | None = None  # backfill / preemption reservation start
        self.reserved_for: str | None = None
        self.pool: Pool | None = None
        #: weighted score totals by request shape, valid until the host changes
        self.scores: dict[tuple[int, int, int, int], int] | None = None
        #: FragModel.best_share's last answer for this host: (milli, model, answer)
        self.share_memo: tuple[int, object, tuple[int, float] | None] | None = None

    def __repr__(self) -> str:
        return f"HostState({self.host_id}, {self.model}, free={self.free}/{self.total})"

    def max_island_free(self) -> int:
        return max(self.island_free.values(), default=0)

    def fits_share(self, milli: int) -> bool:
        for i in range(self.total):
            if not self.whole[i] and WHOLE - self.milli[i] >= milli:
                return True
        return False


class Pool:
    """Ready hosts with GPUs of one model in one region, indexed by free capacity."""

    __slots__ = ("region", "model", "hosts", "by_free", "shared", "max_gpus")

    def __init__(self, region: str, model: str, max_gpus: int) -> None:
        self.region = region
        self.model = model
        self.max_gpus = max_gpus
        self.hosts: list[HostState] = []
        self.by_free: list[dict[HostState, None]] = [{} for _ in range(max_gpus + 1)]
        self.shared: list[dict[tuple[HostState, int], None]] = [{} for _ in range(N_SHARE_BUCKETS)]

    def add(self, hs: HostState) -> None:
        hs.pool = self
        self.hosts.append(hs)
        self.by_free[hs.free][hs] = None
        for i in range(hs.total):
            if not hs.whole[i] and 0 < hs.milli[i] < WHOLE:
                self.shared[(WHOLE - hs.milli[i]) // SHARE_BUCKET][(hs, i)] = None

    # -- consumption -----------------------------------------------------------------

    def take_whole(self, hs: HostState, idxs: Iterable[int]) -> None:
        hs.share_memo = None
        old = hs.free
        for i in idxs:
            assert not hs.whole[i] and hs.milli[i] == 0, "GPU booked twice"
            hs.whole[i] = True
            hs.milli[i] = WHOLE
            hs.free -= 1
            hs.island_free[hs.island[i]] -= 1
        self._move(hs, old)

    def take_share(self, hs: HostState, i: int, milli: int) -> None:
        assert not hs.whole[i] and hs.milli[i] + milli <= WHOLE, "GPU share overbooked"
        hs.share_memo = None
        before = hs.milli[i]
        if before == 0:
            old = hs.free
            hs.free -= 1
            hs.island_free[hs.island[i]] -= 1
            self._move(hs, old)
        else:
            self.shared[(WHOLE - before) // SHARE_BUCKET].pop((hs, i), None)
        hs.milli[i] = before + milli
        if hs.milli[i] < WHOLE:
            self.shared[(WHOLE - hs.milli[i]) // SHARE_BUCKET][(hs, i)] = None

    def _move(self, hs: HostState, old: int) -> None:
        if old != hs.free:
            del self.by_free[old][hs]
            self.by_free[hs.free][hs] = None


class Fleet:
    """All working state of one cycle."""

    def __init__(self, snapshot: ClusterSnapshot, now: float) -> None:
        self.slices: dict[str, list[HostState]] = {}
        self.pools: dict[tuple[str, str], Pool] = {}
        self.pools_by_model: dict[str, list[Pool]] = {}
        # fleet capabilities (all hosts, ready or not) for "could never place" checks
        self.max_gpus: dict[tuple[str, str | None], int] = {}
        self.hosts_with: dict[tuple[str, str | None, int], int] = {}
        self.max_vcpus = 0
        self.max_mem = 0
        # capacity of ready hosts, the denominators of dominant-resource shares
        self.cap_milli: dict[str, int] = {}
        self.cap_vcpus = 0
        self.cap_mem = 0
        counts: dict[tuple[str, str], list[int]] = {}
        for view in sorted(snapshot.hosts, key=lambda h: h.host_id):
            res = HostRes(
                view.free_vcpus, view.free_memory_mib, view.total_vcpus, view.total_memory_mib
            )
            self.max_vcpus = max(self.max_vcpus, res.total_vcpus)
            self.max_mem = max(self.max_mem, res.total_mem)
            if view.ready:
                self.cap_vcpus += res.total_vcpus
                self.cap_mem += res.total_mem
            first = view.gpus[0].model if view.gpus else ""
            if all(g.model == first for g in view.gpus):
                models = [first] if view.gpus else []
            else:
                models = sorted({g.model for g in view.gpus})
            slices = []
            for model in models:
                hs = HostState(view, model, res, len(models) == 1)
                slices.append(hs)
                counts.setdefault((view.region, model), []).append(hs.total)
                if view.ready:
                    self.cap_milli[model] = self.cap_milli.get(model, 0) + hs.total * WHOLE
            self.slices[view.host_id] = slices
        for (region, model), totals in counts.items():
            mx = max(totals)
            per_total = Counter(totals)
            for key in ((model, region), (model, None)):
                self.max_gpus[key] = max(self.max_gpus.get(key, 0), mx)
                for c in range(1, mx + 1):
                    k3 = (key[0], key[1], c)
                    n = sum(k for t, k in per_total.items() if t >= c)
                    self.hosts_with[k3] = self.hosts_with.get(k3, 0) + n
            self.pools[(region, model)] = Pool(region, model, mx)
        for host_id in sorted(self.slices):
            for hs in self.slices[host_id]:
                if hs.ready:
                    self.pools[(hs.region, hs.model)].add(hs)
        for (_region, model), pool in sorted(self.pools.items()):
            self.pools_by_model.setdefault(model, []).append(pool)
        self.allocs: dict[str, AllocState] = {}
        for a in snapshot.allocations:
            st = AllocState(a, now)
            self.allocs[a.request_id] = st
            for p in a.placements:
                for hs in self.slices.get(p.host_id, ()):
                    if p.gpus and p.gpus[0] in hs.pos and st not in hs.allocs:
                        hs.allocs.append(st)

    def host_slice(self, host_id: str, model: str) -> HostState | None:
        for hs in self.slices.get(host_id, ()):
            if hs.model == model:
                return hs
        return None

    def model_of(self, alloc: Allocation) -> str:
        if alloc.gpu_model:
            return alloc.gpu_model
        for p in alloc.placements:
            for hs in self.slices.get(p.host_id, ()):
                if p.gpus and p.gpus[0] in hs.pos:
                    return hs.model
        return ""

    def region_of(self, alloc: Allocation) -> str:
        for p in alloc.placements:
            for hs in self.slices.get(p.host_id, ()):
                return hs.region
        return ""


def placement_of(hs: HostState, idxs: Iterable[int], milli: int) -> HostPlacement:
    return HostPlacement(hs.host_id, tuple(hs.uuids[i] for i in idxs), milli)
