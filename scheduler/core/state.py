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
* ``shared[owner][b]`` - GPUs carrying fractional shares, by the tenant that owns
  their shares (None: open to every tenant) and bucketed by free milli // 125,
as insertion-ordered dicts (ordered sets), so a request looks only at buckets
that can hold it - and only at GPUs its tenant may share - instead of scanning
the fleet.
"""

from __future__ import annotations

import math
import operator
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from .model import (
    CLASS_RANK,
    SEVERAL_TENANTS,
    WHOLE,
    Allocation,
    ClusterSnapshot,
    GpuView,
    HostPlacement,
    HostView,
    Place,
)

# a C-level getter of every field of a GPU: building the state for 100k GPUs is
# a hot loop
_ROW = operator.attrgetter(
    "index", "uuid", "nvlink_island", "numa_node", "whole", "used_milli", "utilisation", "idle_since",
    "share_tenant", "cross_tenant",
)

SHARE_BUCKET = 125  # milli per shared-GPU bucket; 8 buckets cover 1..999 free
N_SHARE_BUCKETS = WHOLE // SHARE_BUCKET
INF = math.inf


# ------------------------------------------------------------------ tenant isolation
#
# The one home of the rule "a GPU's shares go to one tenant at a time": every path
# that puts a share on a GPU - the filter, the pickers and scores, preemption and
# backfill's what-if copies, the commit - asks ``share_open`` about the GPU's owner,
# and the owner is only ever derived by ``share_owner`` (from the snapshot) and
# updated by ``Pool.take_share`` / ``release_owner`` (within a cycle).


def share_owner(cross_tenant: bool, used_milli: int, tenant: str | None) -> str | None:
    """The owner a GPU starts the cycle with: None when any tenant may add a share
    (it carries none, or it is open to cross-tenant sharing), else the tenant whose
    shares it carries (``SEVERAL_TENANTS`` when unknown or several: closed to all)."""
    if cross_tenant or used_milli <= 0:
        return None
    return tenant if tenant is not None else SEVERAL_TENANTS


def share_open(owner: str | None, tenant: str) -> bool:
    """May ``tenant`` add a share to a GPU whose owner is ``owner``?"""
    return owner is None or owner == tenant


def release_owner(owner: list[str | None], milli: list[int], i: int) -> None:
    """After shares left GPU ``i``: a GPU with none left has no owner any more."""
    if milli[i] <= 0:
        owner[i] = None


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

    __slots__ = ("alloc", "rank", "doomed", "end", "gpu_count", "milli", "home")

    def __init__(self, alloc: Allocation, now: float) -> None:
        self.alloc = alloc
        self.rank = CLASS_RANK.get(alloc.priority, 1)
        placements = alloc.placements
        #: (host id, first GPU) of work on one node: where ``Fleet`` files it
        self.home: tuple[str, str] | None = None
        if len(placements) == 1:
            p = placements[0]
            self.gpu_count = len(p.gpus)
            self.milli = self.gpu_count * p.milli
            if p.gpus:
                self.home = (p.host_id, p.gpus[0])
        else:
            self.gpu_count = sum(len(p.gpus) for p in placements)
            self.milli = sum(len(p.gpus) * p.milli for p in placements)
        self.reset(now)

    def reset(self, now: float) -> None:
        """Back to what the snapshot says (a cached state is reused next cycle)."""
        alloc = self.alloc
        # doomed: already under notice, or chosen as a victim in this cycle
        self.doomed = alloc.preempting
        if alloc.preempting:
            self.end = alloc.stop_by if alloc.stop_by is not None else now
        else:
            self.end = alloc.expected_end if alloc.expected_end is not None else INF


class Ending(NamedTuple):
    """Work that frees its GPUs at ``end``, as backfill reservations see it."""

    end: float
    request_id: str
    vcpus: int  # per node
    memory_mib: int
    placements: tuple[HostPlacement, ...]
    gpus: int  # GPUs held in all (an upper bound of what it frees on one host)


#: what a slice's GPUs say, derived from its ``GpuView`` objects alone (``slice_columns``):
#: total, uuids, islands, NUMA nodes, held whole, milli used, open to shares of
#: several tenants, share owners, GPUs carrying shares, utilisation, idle since,
#: mean load, free GPUs, free GPUs per island, position by uuid. Never changed once
#: made: ``HostState`` copies the parts a cycle changes.
SliceColumns = tuple[
    int,
    tuple[str, ...],
    tuple[int, ...],
    tuple[int, ...],
    tuple[bool, ...],
    tuple[int, ...],
    tuple[bool, ...],
    tuple["str | None", ...],
    tuple[int, ...],
    tuple[float, ...],
    "tuple[float | None, ...]",
    float,
    int,
    dict[int, int],
    dict[str, int],
]


def slice_columns(gpus: Sequence[GpuView]) -> SliceColumns:
    """The columns of a slice with these GPUs (any order: sorted by index here)."""
    n = len(gpus)
    if n:
        # runs for every host of the fleet each cycle: one C-level pass reads
        # every field of every GPU, zip(*) turns the rows into columns
        idx, uuids, island, numa, whole, used, util, idle, tenant, cross = zip(*map(_ROW, gpus), strict=True)
        if any(a > b for a, b in zip(idx, idx[1:], strict=False)):
            order = sorted(range(n), key=idx.__getitem__)
            uuids, island, numa, whole, used, util, idle, tenant, cross = (
                tuple(col[i] for i in order) for col in (uuids, island, numa, whole, used, util, idle, tenant, cross)
            )
    else:
        uuids = island = numa = whole = used = util = idle = tenant = cross = ()
    milli = tuple([WHOLE if w else (m if m < WHOLE else WHOLE) for w, m in zip(whole, used, strict=True)])
    if any(used):
        owner: tuple[str | None, ...] = tuple(
            [None if w else share_owner(c, m, t) for w, m, t, c in zip(whole, milli, tenant, cross, strict=True)]
        )
        #: GPUs carrying fractional shares when the slice was built: ``Pool.add``
        #: indexes them without a scan (a slice is only ever added unbooked)
        shares0 = tuple(i for i, m in enumerate(milli) if 0 < m < WHOLE)
    else:
        owner = (None,) * n
        shares0 = ()
    island_free = dict.fromkeys(island, 0)
    free = 0
    if 0 in milli:
        for i, m in enumerate(milli):
            if m == 0:
                free += 1
                island_free[island[i]] += 1
    return (
        n,
        uuids,
        island,
        numa,
        whole,
        milli,
        cross,
        owner,
        shares0,
        util,
        idle,
        sum(util) / n if n else 0.0,
        free,
        island_free,
        dict(zip(uuids, range(n), strict=True)),
    )


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
        "alloc_gpus",
        "placed",
        "reserved_at",
        "reserved_for",
        "pool",
        "scores",
        "share_memo",
        "owner",
        "open",
        "shares0",
        "pool_key",
    )

    def __init__(
        self,
        view: HostView,
        model: str,
        res: HostRes,
        single_model: bool = False,
        cols: SliceColumns | None = None,
    ) -> None:
        self.view = view
        self.host_id = view.host_id
        self.region = view.region
        self.model = model
        #: the key of its pool in ``Fleet.pools``
        self.pool_key = (view.region, model)
        self.ready = view.ready
        if cols is None:
            cols = slice_columns(view.gpus if single_model else [g for g in view.gpus if g.model == model])
        (
            self.total,
            self.uuids,
            self.island,
            self.numa,
            whole,
            milli,
            self.open,
            owner,
            self.shares0,
            self.util,
            self.idle_since,
            self.load,
            self.free,
            island_free,
            self.pos,
        ) = cols
        # what a cycle changes is copied; the rest is shared with the columns
        self.whole: list[bool] = list(whole)
        self.milli: list[int] = list(milli)
        #: tenant isolation: per GPU, whether shares of several tenants may mix on it
        #: (``open``), and who owns its shares now (see share_owner / share_open)
        self.owner: list[str | None] = list(owner)
        self.island_free: dict[int, int] = dict(island_free)
        self.res = res
        self.allocs: list[AllocState] = []
        #: the GPUs of ``allocs`` (``AllocState.gpu_count``): more than any victims here free
        self.alloc_gpus = 0
        #: work this plan placed here that has an expected end: backfill counts it as
        #: leaving then, as the next cycle will once it is an allocation (never a victim)
        self.placed: list[Ending] = []
        self.reserved_at: float | None = None  # backfill / preemption reservation start
        self.reserved_for: str | None = None
        self.pool: Pool | None = None
        #: weighted score totals by request shape, valid until the host changes
        self.scores: dict[tuple[int, int, int, int, str | None], int] | None = None
        #: FragModel.best_share's last answer for this host: (milli, model, answer)
        # (share key: milli, or (milli, vcpus) for FGD; the model that ranked it; its answer)
        self.share_memo: tuple[object, object, tuple[int, float] | None] | None = None

    def __repr__(self) -> str:
        return f"HostState({self.host_id}, {self.model}, free={self.free}/{self.total})"

    def max_island(self) -> int:
        """GPUs on the largest NVLink island of this slice."""
        sizes: dict[int, int] = {}
        for isl in self.island:
            sizes[isl] = sizes.get(isl, 0) + 1
        return max(sizes.values(), default=0)

    def fits_share(self, milli: int, tenant: str) -> bool:
        owner = self.owner
        for i in range(self.total):
            if not self.whole[i] and WHOLE - self.milli[i] >= milli and share_open(owner[i], tenant):
                return True
        return False


class Pool:
    """Ready hosts with GPUs of one model in one region, indexed by free capacity."""

    __slots__ = ("region", "model", "hosts", "by_free", "shared", "max_gpus", "touched", "sizes")

    def __init__(
        self, region: str, model: str, max_gpus: int, touched: set[str] | None = None
    ) -> None:
        self.touched: set[str] = touched if touched is not None else set()
        self.region = region
        self.model = model
        self.max_gpus = max_gpus
        self.hosts: list[HostState] = []
        self.by_free: list[dict[HostState, None]] = [{} for _ in range(max_gpus + 1)]
        self.shared: dict[str | None, list[dict[tuple[HostState, int], None]]] = {}
        #: GPUs per slice -> slices of this pool, ready or not (kept for a PlanCache only)
        self.sizes: dict[int, int] = {}

    def shared_of(self, owner: str | None) -> list[dict[tuple[HostState, int], None]]:
        """The share buckets of GPUs whose shares ``owner`` owns (None: open ones)."""
        got = self.shared.get(owner)
        if got is None:
            got = self.shared[owner] = [{} for _ in range(N_SHARE_BUCKETS)]
        return got

    def add(self, hs: HostState) -> None:
        hs.pool = self
        self.hosts.append(hs)
        by_free = self.by_free
        free = hs.free
        while len(by_free) <= free:  # a pool may be sized as its hosts come
            by_free.append({})
        by_free[free][hs] = None
        # the slice is as built (a booked one is never reused), so the GPUs with
        # shares are those of ``shares0``
        for i in hs.shares0:
            self.shared_of(hs.owner[i])[(WHOLE - hs.milli[i]) // SHARE_BUCKET][(hs, i)] = None

    # -- an incremental fleet (PlanCache) ----------------------------------------------
    #
    # ``add`` appends, which keeps every bucket in host id order only while hosts come
    # in that order (a fresh build). Between cycles a cached fleet re-files a few
    # hosts: ``insert`` puts each where a fresh build would have it, ``remove`` takes
    # a slice out of wherever this cycle's bookings moved it.

    def insert(self, hs: HostState) -> None:
        """``add`` at the slice's place in host id order."""
        hs.pool = self
        hid = hs.host_id
        hosts = self.hosts
        if not hosts or hosts[-1].host_id < hid:
            hosts.append(hs)
        else:
            hosts.insert(bisect_left(hosts, hid, key=_host_id), hs)
        by_free = self.by_free
        free = hs.free
        while len(by_free) <= free:
            by_free.append({})
        _insert_sorted(by_free, free, hs, hid, _host_id)
        for i in hs.shares0:
            _insert_sorted(
                self.shared_of(hs.owner[i]),
                (WHOLE - hs.milli[i]) // SHARE_BUCKET,
                (hs, i),
                (hid, i),
                _share_key,
            )

    def remove(self, hs: HostState) -> None:
        """Take a slice out of every index, as this cycle left it."""
        self.hosts.remove(hs)
        del self.by_free[hs.free][hs]
        milli = hs.milli
        whole = hs.whole
        owner = hs.owner
        for i in range(hs.total):
            m = milli[i]
            if 0 < m < WHOLE and not whole[i]:
                del self.shared[owner[i]][(WHOLE - m) // SHARE_BUCKET][(hs, i)]

    # -- consumption -----------------------------------------------------------------

    def take_whole(self, hs: HostState, idxs: Iterable[int]) -> None:
        self.touched.add(hs.host_id)
        hs.share_memo = None
        old = hs.free
        for i in idxs:
            assert not hs.whole[i] and hs.milli[i] == 0, "GPU booked twice"
            hs.whole[i] = True
            hs.milli[i] = WHOLE
            hs.free -= 1
            hs.island_free[hs.island[i]] -= 1
        self._move(hs, old)

    def take_share(self, hs: HostState, i: int, milli: int, tenant: str) -> None:
        assert not hs.whole[i] and hs.milli[i] + milli <= WHOLE, "GPU share overbooked"
        owner = hs.owner[i]
        assert share_open(owner, tenant), "GPU shares of two tenants"
        self.touched.add(hs.host_id)
        hs.share_memo = None
        before = hs.milli[i]
        if before == 0:
            old = hs.free
            hs.free -= 1
            hs.island_free[hs.island[i]] -= 1
            self._move(hs, old)
        else:
            self.shared_of(owner)[(WHOLE - before) // SHARE_BUCKET].pop((hs, i), None)
        if not hs.open[i]:
            owner = hs.owner[i] = tenant
        hs.milli[i] = before + milli
        if hs.milli[i] < WHOLE:
            self.shared_of(owner)[(WHOLE - hs.milli[i]) // SHARE_BUCKET][(hs, i)] = None

    def _move(self, hs: HostState, old: int) -> None:
        if old != hs.free:
            del self.by_free[old][hs]
            self.by_free[hs.free][hs] = None


def _host_id(hs: HostState) -> str:
    return hs.host_id


def _share_key(entry: tuple[HostState, int]) -> tuple[str, int]:
    return (entry[0].host_id, entry[1])



def _insert_sorted(buckets: list, b: int, item: object, key: object, key_of) -> None:  # type: ignore[type-arg, no-untyped-def]
    """Put ``item`` into the ordered set ``buckets[b]`` where its ``key`` sorts."""
    bucket = buckets[b]
    if not bucket or key_of(next(reversed(bucket))) < key:
        bucket[item] = None
        return
    items = list(bucket)
    items.insert(bisect_left(items, key, key=key_of), item)
    buckets[b] = dict.fromkeys(items)


def _clear_marks(slices: list[HostState]) -> None:
    """Cycle-local marks a reused slice kept from its last cycle, cleared only where set."""
    for hs in slices:
        if hs.allocs:
            hs.allocs = []
            hs.alloc_gpus = 0
        if hs.placed:
            hs.placed = []
        if hs.reserved_at is not None:
            hs.reserved_at = None
            hs.reserved_for = None


#: how many slices' columns a ``PlanCache`` keeps (then it starts afresh)
COLUMNS_KEPT = 16384


def _host_state(
    view: HostView, columns: dict[tuple[int, ...], tuple[object, SliceColumns]] | None = None
) -> tuple[HostRes, list[HostState]]:
    """A host's resources and its slices, one per GPU model, as its view says.

    ``columns`` (a ``PlanCache``'s): the columns of one-model hosts by the
    identities of their ``GpuView`` objects. A caller that keeps its GPU views
    (the simulator makes one per GPU state) gets a host's columns back for the
    same GPUs in the same states; the entry holds the views, so no id is reused
    while it is kept."""
    res = HostRes(view.free_vcpus, view.free_memory_mib, view.total_vcpus, view.total_memory_mib)
    gpus = view.gpus
    first = gpus[0].model if gpus else ""
    if all(g.model == first for g in gpus):
        models = [first] if gpus else []
    else:
        models = sorted({g.model for g in gpus})
    if columns is not None and len(models) == 1:
        key = tuple(map(id, gpus))
        got = columns.get(key)
        if got is None:
            if len(columns) >= COLUMNS_KEPT:
                columns.clear()
            got = columns[key] = (gpus, slice_columns(gpus))
        return res, [HostState(view, first, res, True, got[1])]
    return res, [HostState(view, model, res, len(models) == 1) for model in models]


class PlanCache:
    """Working state ``plan()`` may keep between calls (opt-in, for callers that
    plan many times over a slowly changing fleet, like the trace simulator).

    A host's per-cycle state (``HostState`` slices and ``HostRes``) is derived
    from its ``HostView`` only, so when the caller passes the *identical*
    ``HostView`` object again, the state built last time is reused instead of
    rebuilt. Hosts a cycle booked capacity on are dropped after that cycle (their
    state no longer matches their view; the caller will pass a new view once it
    applied the plan), and cycle-local marks (reservations, allocations) are reset
    on reuse, so a plan with a cache equals the plan without one.

    The last cycle's ``Fleet`` is kept too (``keep``): the next one takes over its
    pools, index buckets and fleet figures and re-files only the hosts whose view
    changed, came or left, and those the last cycle booked - each where a fresh
    build would put it, so the tie-breaks by host id stay the same.

    Score totals cached on a host depend on the scoring plugins and the request
    mix, so the cache is emptied whenever ``key`` (placement spec and mix)
    changes. Not thread-safe: one cache per planning loop.
    """

    __slots__ = ("hosts", "allocs", "key", "hits", "misses", "fleet", "policy_memo", "columns")

    def __init__(self) -> None:
        self.hosts: dict[str, tuple[HostView, HostRes, list[HostState]]] = {}
        #: the last cycle's allocation states, reused for identical Allocation objects
        self.allocs: dict[str, AllocState] = {}
        self.key: object = None
        self.hits = 0
        self.misses = 0
        #: the last whole cycle's fleet, for the next one to take over
        self.fleet: Fleet | None = None
        #: (policy, its read-only figures by class) for the planner's setup
        self.policy_memo: tuple[object, dict[str, bool], dict[str, float]] | None = None
        #: the columns of hosts' GPUs, by the identities of their views (``_host_state``)
        self.columns: dict[tuple[int, ...], tuple[object, SliceColumns]] = {}

    def clear(self) -> None:
        self.hosts.clear()
        self.allocs = {}
        self.fleet = None

    def forget(self, host_ids: Iterable[str]) -> None:
        pop = self.hosts.pop
        for h in host_ids:
            pop(h, None)

    def keep(self, fleet: Fleet, decisions: Iterable[object], reserved: bool) -> None:
        """After a whole cycle: drop what it booked and keep ``fleet`` for the next.

        Hosts of every ``Place`` count as booked, also work without GPUs (it took
        vCPUs and memory but booked no GPU); ``reserved``: some host was reserved."""
        touched = fleet.touched
        for d in decisions:
            if type(d) is Place:
                for p in d.placements:
                    touched.add(p.host_id)
        self.forget(touched)
        fleet.reserved = reserved
        # (a fleet built from a snapshot with two views of a host is not kept)
        self.fleet = fleet if fleet._views is not None else None


def _sizes_of(entry: tuple[HostView, HostRes, list[HostState]]) -> tuple[object, ...]:
    """A filed host as the fleet's size figures count it (``Fleet._update``)."""
    _view, res, slices = entry
    return (res.total_vcpus, res.total_mem, *[(hs.pool_key, hs.total) for hs in slices])


def _count(counts: dict[int, int], n: int, by: int) -> None:
    left = counts.get(n, 0) + by
    if left:
        counts[n] = left
    else:
        del counts[n]


class Fleet:
    """All working state of one cycle.

    Built from the snapshot, or - with a ``PlanCache`` that kept the last cycle's
    fleet - taken over from that one and brought up to the snapshot (``_update``);
    both give the same structures (``tests/scheduler/core/test_h6_fleet_cache.py``).
    """

    def __init__(
        self, snapshot: ClusterSnapshot, now: float, cache: PlanCache | None = None
    ) -> None:
        #: the slices that hold allocations this cycle (cleared by the next fleet)
        self.held: list[HostState] = []
        #: some host was reserved in this fleet's cycle (set by ``PlanCache.keep``)
        self.reserved = False
        old = cache.fleet if cache is not None else None
        if old is not None and cache is not None:
            cache.fleet = None  # in use: plan() hands it back after a whole cycle
            self._update(old, snapshot, cache)
        else:
            self._build(snapshot, cache)
        self._file_allocs(snapshot, now, cache)

    def _build(self, snapshot: ClusterSnapshot, cache: PlanCache | None) -> None:
        self.slices: dict[str, list[HostState]] = {}
        self.pools: dict[tuple[str, str], Pool] = {}
        self.pools_by_model: dict[str, list[Pool]] = {}
        # fleet capabilities (all hosts, ready or not) for "could never place" checks
        self.max_gpus: dict[tuple[str, str | None], int] = {}
        # (model, region or None) -> GPUs per host -> hosts with that many, for hosts_with()
        self.totals: dict[tuple[str, str | None], dict[int, int]] = {}
        self._hosts_with: dict[tuple[str, str | None, int], int] = {}
        self.max_vcpus = 0
        self.max_mem = 0
        # capacity of ready hosts, the denominators of dominant-resource shares
        self.cap_milli: dict[str, int] = {}
        self.cap_vcpus = 0
        self.cap_mem = 0
        #: host ids whose capacity this cycle consumed (a PlanCache drops them)
        self.touched: set[str] = set()
        # what an update needs besides (only with a cache): the views by object id
        # and by host id, each host's (view, res, slices), counts of hosts by vCPUs
        # and by memory, and of ready slices by model
        self._views: dict[int, HostView] | None = None
        #: the snapshot's hosts, as the views were last taken
        self._hosts: Sequence[HostView] = snapshot.hosts
        self._by_host: dict[str, HostView] = {}
        self._filed: dict[str, tuple[HostView, HostRes, list[HostState]]] = {}
        self._vcpus_n: dict[int, int] = {}
        self._mem_n: dict[int, int] = {}
        self._ready_models: dict[str, int] = {}
        counts: dict[tuple[str, str], list[int]] = {}
        cached = cache.hosts if cache is not None else None
        max_vcpus = max_mem = cap_vcpus = cap_mem = 0
        hits = misses = 0
        cap_milli = self.cap_milli
        slices_of = self.slices
        pools = self.pools
        touched = self.touched
        hosts: Sequence[HostView] = snapshot.hosts
        ids = [v.host_id for v in hosts]
        if ids != sorted(ids):
            hosts = sorted(hosts, key=lambda h: h.host_id)
        # hosts are taken in host id order, so every index bucket starts in host
        # id order: the tie-break of the walk
        for view in hosts:
            entry = cached.get(view.host_id) if cached is not None else None
            if entry is not None and entry[0] is view:
                res = entry[1]
                slices = entry[2]
                _clear_marks(slices)
                hits += 1
            else:
                res, slices = _host_state(view, cache.columns if cache is not None else None)
                if cached is not None:
                    cached[view.host_id] = (view, res, slices)
                    misses += 1
            tv = res.total_vcpus
            tm = res.total_mem
            if tv > max_vcpus:
                max_vcpus = tv
            if tm > max_mem:
                max_mem = tm
            ready = view.ready
            if ready:
                cap_vcpus += tv
                cap_mem += tm
            for hs in slices:
                key = hs.pool_key
                pool = pools.get(key)
                if pool is None:
                    # max_gpus is known once every host was seen (set below)
                    pool = pools[key] = Pool(key[0], key[1], 0, touched)
                    counts[key] = [hs.total]
                else:
                    counts[key].append(hs.total)
                if ready:
                    model = key[1]
                    cap_milli[model] = cap_milli.get(model, 0) + hs.total * WHOLE
                    pool.add(hs)
            slices_of[view.host_id] = slices
        self.max_vcpus = max_vcpus
        self.max_mem = max_mem
        self.cap_vcpus = cap_vcpus
        self.cap_mem = cap_mem
        for key, lst in counts.items():
            pools[key].sizes = Counter(lst)
        self._figures()
        self._order_pools()
        if cache is not None:
            cache.hits += hits
            cache.misses += misses
            if len(set(ids)) == len(ids):  # else a bad snapshot: the next call builds afresh
                self._views = dict(zip(map(id, snapshot.hosts), snapshot.hosts, strict=True))
                self._by_host = {v.host_id: v for v in hosts}
                self._filed = {hid: cached[hid] for hid in ids}  # type: ignore[index]
                vcpus_n = self._vcpus_n
                mem_n = self._mem_n
                ready_models = self._ready_models
                for view, res, slices in self._filed.values():
                    _count(vcpus_n, res.total_vcpus, 1)
                    _count(mem_n, res.total_mem, 1)
                    if view.ready:
                        for hs in slices:
                            ready_models[hs.model] = ready_models.get(hs.model, 0) + 1

    def _figures(self) -> None:
        """max_gpus, totals and each pool's max_gpus from the pools' sizes."""
        totals = self.totals
        max_gpus = self.max_gpus
        totals.clear()
        max_gpus.clear()
        self._hosts_with.clear()
        for (region, model), pool in self.pools.items():
            sizes = pool.sizes
            mx = max(sizes)
            for key2 in ((model, region), (model, None)):
                if max_gpus.get(key2, 0) < mx:
                    max_gpus[key2] = mx
                t = totals.get(key2)
                if t is None:
                    totals[key2] = dict(sizes)
                else:
                    for n, k in sizes.items():
                        t[n] = t.get(n, 0) + k
            pool.max_gpus = mx
            by_free = pool.by_free
            while len(by_free) <= mx:
                by_free.append({})
            if len(by_free) > mx + 1:
                del by_free[mx + 1 :]  # empty: no slice has more free GPUs than mx

    def _order_pools(self) -> None:
        by_model: dict[str, list[Pool]] = {}
        for (_region, model), pool in sorted(self.pools.items()):
            by_model.setdefault(model, []).append(pool)
        self.pools_by_model = by_model

    def _update(self, old: Fleet, snapshot: ClusterSnapshot, cache: PlanCache) -> None:
        """Take over ``old`` (the last cycle's fleet) and bring it up to ``snapshot``."""
        self.slices = old.slices
        self.pools = old.pools
        self.pools_by_model = old.pools_by_model
        self.max_gpus = old.max_gpus
        self.totals = old.totals
        self._hosts_with = old._hosts_with
        self.max_vcpus = old.max_vcpus
        self.max_mem = old.max_mem
        self.cap_milli = old.cap_milli
        self.cap_vcpus = old.cap_vcpus
        self.cap_mem = old.cap_mem
        self.touched = touched = old.touched  # the pools share it
        self._views = views = old._views
        self._hosts = old._hosts
        self._by_host = by_host = old._by_host
        self._filed = old._filed
        self._vcpus_n = old._vcpus_n
        self._mem_n = old._mem_n
        self._ready_models = old._ready_models
        assert views is not None
        for hs in old.held:
            hs.allocs = []
            hs.alloc_gpus = 0
        if old.reserved:
            for _view, _res, slices in self._filed.values():
                for hs in slices:
                    if hs.reserved_at is not None:
                        hs.reserved_at = None
                        hs.reserved_for = None
        hosts = snapshot.hosts
        last = old._hosts
        refile = set(touched)
        touched.clear()
        # the usual call: the same hosts in the same places, a few of them with a
        # new view (a host in a place keeps its id, so ids stay unique)
        swapped = [(v, w) for v, w in zip(hosts, last, strict=True) if v is not w] if len(last) == len(hosts) else None
        if swapped is not None and all(v.host_id == w.host_id for v, w in swapped):
            for v, w in swapped:
                del views[id(w)]
                views[id(v)] = v
                by_host[v.host_id] = v
                refile.add(v.host_id)
        else:
            new = dict(zip(map(id, hosts), hosts, strict=True))
            if len(new) != len(hosts):
                self._build(snapshot, cache)  # one view twice: not a fleet to update
                return
            for i in views.keys() - new.keys():
                view = views.pop(i)
                hid = view.host_id
                if by_host.get(hid) is view:
                    del by_host[hid]
                refile.add(hid)
            for i in new.keys() - views.keys():
                view = views[i] = new[i]
                by_host[view.host_id] = view
                refile.add(view.host_id)
            if len(by_host) != len(views):
                # two views of one host in the snapshot: not a fleet to update
                self._build(snapshot, cache)
                return
        self._hosts = hosts
        if not refile:
            cache.hits += len(self._filed)  # every host's state reused
            return
        pools = self.pools
        n_pools = len(pools)
        filed = self._filed
        # what the pools' sizes and the fleet's largest host read of the hosts
        # taken out, to compare with what goes back in
        out: list[tuple[object, ...]] = []
        for hid in refile:
            if hid in filed:
                out.append(_sizes_of(filed[hid]))
                self._unfile(hid)
        back: list[tuple[object, ...]] = []
        cached = cache.hosts
        misses = 0
        for hid in sorted(refile):
            view = by_host.get(hid)  # type: ignore[assignment]
            if view is None:
                continue
            entry = cached.get(hid)
            if entry is not None and entry[0] is view:
                _clear_marks(entry[2])
            else:
                entry = (view, *_host_state(view, cache.columns))
                cached[hid] = entry
                misses += 1
            self._file(hid, entry)
            back.append(_sizes_of(entry))
        # hosts kept as filed count as reused too
        cache.hits += len(filed) - misses
        cache.misses += misses
        if len(out) == len(back) and sorted(out) == sorted(back):
            # the same hosts' sizes went back (new views of the same hosts, the
            # usual update): pool sizes, fleet figures and largest hosts stand
            return
        empty = [key for key, pool in pools.items() if not pool.sizes]
        for key in empty:
            del pools[key]
        self._figures()
        self.max_vcpus = max(self._vcpus_n, default=0)
        self.max_mem = max(self._mem_n, default=0)
        if empty or len(pools) != n_pools:
            self._order_pools()

    def _unfile(self, hid: str) -> None:
        view, res, slices = self._filed.pop(hid)
        del self.slices[hid]
        tv = res.total_vcpus
        tm = res.total_mem
        _count(self._vcpus_n, tv, -1)
        _count(self._mem_n, tm, -1)
        ready = view.ready
        if ready:
            self.cap_vcpus -= tv
            self.cap_mem -= tm
        cap_milli = self.cap_milli
        ready_models = self._ready_models
        for hs in slices:
            pool = self.pools[hs.pool_key]
            _count(pool.sizes, hs.total, -1)
            if ready:
                model = hs.model
                left = ready_models[model] - 1
                if left:
                    ready_models[model] = left
                    cap_milli[model] -= hs.total * WHOLE
                else:
                    del ready_models[model]
                    del cap_milli[model]
                pool.remove(hs)

    def _file(self, hid: str, entry: tuple[HostView, HostRes, list[HostState]]) -> None:
        view, res, slices = entry
        self._filed[hid] = entry
        self.slices[hid] = slices
        tv = res.total_vcpus
        tm = res.total_mem
        _count(self._vcpus_n, tv, 1)
        _count(self._mem_n, tm, 1)
        ready = view.ready
        if ready:
            self.cap_vcpus += tv
            self.cap_mem += tm
        pools = self.pools
        cap_milli = self.cap_milli
        ready_models = self._ready_models
        for hs in slices:
            key = hs.pool_key
            pool = pools.get(key)
            if pool is None:
                pool = pools[key] = Pool(key[0], key[1], 0, self.touched)
            _count(pool.sizes, hs.total, 1)
            if ready:
                model = key[1]
                ready_models[model] = ready_models.get(model, 0) + 1
                cap_milli[model] = cap_milli.get(model, 0) + hs.total * WHOLE
                pool.insert(hs)

    def _file_allocs(self, snapshot: ClusterSnapshot, now: float, cache: PlanCache | None) -> None:
        self.allocs: dict[str, AllocState] = {}
        allocs = self.allocs
        held = self.held
        old_get = cache.allocs.get if cache is not None else None
        slices_get = self.slices.get
        for a in snapshot.allocations:
            rid = a.request_id
            st = old_get(rid) if old_get is not None else None
            if st is not None and st.alloc is a:
                # what reset() would change: only work under notice (its end may
                # read the clock) or chosen as a victim last cycle differs
                if st.doomed or a.preempting:
                    st.reset(now)
            else:
                st = AllocState(a, now)
            allocs[rid] = st
            home = st.home
            if home is not None:
                # one placement: on one slice of one host, once (no duplicate to look for)
                sl = slices_get(home[0])
                if sl is not None:
                    u = home[1]
                    for hs in sl:
                        if u in hs.pos:
                            if not hs.allocs:
                                held.append(hs)
                            hs.allocs.append(st)
                            hs.alloc_gpus += st.gpu_count
                            break
                continue
            for p in a.placements:
                sl = slices_get(p.host_id)
                if sl is None or not p.gpus:
                    continue
                u = p.gpus[0]
                for hs in sl:
                    if u in hs.pos:
                        on = hs.allocs
                        if st not in on:
                            if not on:
                                held.append(hs)
                            on.append(st)
                            hs.alloc_gpus += st.gpu_count
        if cache is not None:
            cache.allocs = allocs

    def hosts_with(self, model: str, region: str | None, c: int) -> int:
        """How many hosts (ready or not) have at least ``c`` GPUs of ``model``."""
        key = (model, region, c)
        n = self._hosts_with.get(key)
        if n is None:
            n = self._hosts_with[key] = sum(
                k for t, k in self.totals.get((model, region), {}).items() if t >= c
            )
        return n

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
