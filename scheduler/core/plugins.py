"""Built-in filters, scores, placements and GPU pickers.

Every score returns 0..MAX_SCORE for the host *after* the request would land on
it; a placement is a named list of (score, weight) plus how to walk the index.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Sequence

from .framework import (
    MAX_SCORE,
    OK,
    CycleContext,
    Filter,
    PlacementSpec,
    Score,
    Status,
    register_filter,
    register_placement,
    register_score,
    unresolvable,
    unschedulable,
)
from .model import WHOLE, PlacementRequest
from .state import HostState, share_open

# ------------------------------------------------------------------------------ filters

_NOT_READY = unschedulable("host is not ready")
_WRONG_MODEL = unresolvable("host has no GPUs of this model")
_WRONG_REGION = unresolvable("host is in another region")
_FEW_GPUS = unschedulable("not enough free GPUs")
_NO_SHARE = unschedulable("no GPU with a large enough free share")
_SMALL_HOST = unresolvable("host has too few GPUs")
_NO_CPU = unschedulable("not enough free vCPUs")
_NO_MEM = unschedulable("not enough free memory")
_NO_ISLAND = unschedulable("free GPUs are not on one NVLink island")
_RESERVED = unschedulable("reserved for an earlier request")


class ReadyFilter:
    name = "ready"
    indexed = True  # the index holds ready hosts only

    def filter(self, req: PlacementRequest, host: HostState) -> Status:
        return OK if host.ready else _NOT_READY


class GpuModelFilter:
    name = "gpu-model"
    indexed = True

    def filter(self, req: PlacementRequest, host: HostState) -> Status:
        return OK if host.model == req.gpu_model else _WRONG_MODEL


class RegionFilter:
    name = "region"
    indexed = True

    def filter(self, req: PlacementRequest, host: HostState) -> Status:
        return OK if req.region is None or host.region == req.region else _WRONG_REGION


class FreeGpusFilter:
    """Enough free whole GPUs, or one GPU with a large enough free share.

    Whole and fractional work never share a GPU: whole requests only count GPUs
    with nothing on them; shares only go on GPUs not held whole, and only on GPUs
    whose shares are the request's own tenant's or open to sharing (``share_open``).
    """

    name = "gpus"
    indexed = False  # the share buckets are coarse, so the exact check stays

    def filter(self, req: PlacementRequest, host: HostState) -> Status:
        g = req.gpus_per_node
        if g == 0:
            if req.gpu_milli == 0:
                return OK  # no GPU asked for
            return OK if host.fits_share(req.gpu_milli, req.tenant_id) else _NO_SHARE
        if host.total < g:
            return _SMALL_HOST
        return OK if host.free >= g else _FEW_GPUS


class ResourcesFilter:
    name = "resources"
    indexed = False

    def filter(self, req: PlacementRequest, host: HostState) -> Status:
        res = host.res
        if res.free_vcpus < req.vcpus:
            return _NO_CPU
        if res.free_mem < req.memory_mib:
            return _NO_MEM
        return OK


class NvlinkFilter:
    """Strict topology: a multi-GPU request that fits in one island of this host
    must get GPUs from one island (only used when the policy says ``require``)."""

    name = "nvlink"
    indexed = False

    def filter(self, req: PlacementRequest, host: HostState) -> Status:
        g = req.gpus_per_node
        if g <= 1 or island_ok(host, g):
            return OK
        return _NO_ISLAND


def island_ok(host: HostState, g: int) -> bool:
    """True when ``g`` free GPUs exist on one island, or the request is larger
    than any island of the host (then it spans islands by necessity)."""
    best = 0
    for cnt in host.island_free.values():
        if cnt >= g:
            return True
        best = max(best, cnt)
    sizes: dict[int, int] = {}
    for isl in host.island:
        sizes[isl] = sizes.get(isl, 0) + 1
    return g > max(sizes.values(), default=0) and host.free >= g


class ReservationFilter:
    """Backfill guard: a host reserved for the blocked head of the queue only
    takes work that will have ended before the reservation starts."""

    name = "reservation"
    indexed = False

    def __init__(self, now: float) -> None:
        self.now = now

    def filter(self, req: PlacementRequest, host: HostState) -> Status:
        at = host.reserved_at
        if at is None or host.reserved_for == req.request_id:
            return OK
        d = req.expected_duration
        if d is not None and self.now + d <= at:
            return OK
        return _RESERVED


class BatchPoolFilter:
    """A batch pool's job runs only where the pool's members run (Azure Batch: a pool's
    tasks run on the pool's nodes), never elsewhere in the region. Requests of no pool pass."""

    name = "batch-pool"
    indexed = False

    def filter(self, req: PlacementRequest, host: HostState) -> Status:
        if not req.pool or host.host_id in req.pool_hosts:
            return OK
        return unschedulable(f"not a host of batch pool {req.pool}'s members")


register_filter("ready", lambda ctx: ReadyFilter())
register_filter("gpu-model", lambda ctx: GpuModelFilter())
register_filter("region", lambda ctx: RegionFilter())
register_filter("gpus", lambda ctx: FreeGpusFilter())
register_filter("resources", lambda ctx: ResourcesFilter())
register_filter("nvlink", lambda ctx: NvlinkFilter())
register_filter("reservation", lambda ctx: ReservationFilter(ctx.now))
register_filter("batch-pool", lambda ctx: BatchPoolFilter())

# ------------------------------------------------------------------------------ scores


def _clamp(x: float) -> int:
    return 0 if x < 0 else MAX_SCORE if x > MAX_SCORE else int(x + 0.5)


def _gpu_after(req: PlacementRequest, host: HostState) -> float:
    """Fraction of the host's GPU capacity in use after the request lands."""
    used = sum(host.milli) + (
        req.gpu_milli if req.gpus_per_node == 0 else req.gpus_per_node * WHOLE
    )
    return used / (host.total * WHOLE) if host.total else 1.0


class BestFitScore:
    """Fewest free GPUs left on the host (whole), or the tightest fitting shared
    GPU (fractional): the classic best fit."""

    name = "best-fit"

    def __init__(self, weight: int) -> None:
        self.weight = weight

    def score(self, req: PlacementRequest, host: HostState) -> int:
        if req.gpus_per_node == 0 and req.gpu_milli == 0:
            # no GPU: the host whose vCPUs it fills tightest
            res = host.res
            if not res.total_vcpus:
                return MAX_SCORE
            return _clamp(MAX_SCORE * (1 - (res.free_vcpus - req.vcpus) / res.total_vcpus))
        if req.gpus_per_node == 0:
            i = pick_share(host, req.gpu_milli, "best-fit", (), tenant=req.tenant_id)
            if i is None:
                return 0
            return _clamp(MAX_SCORE * (1 - (WHOLE - host.milli[i] - req.gpu_milli) / WHOLE))
        left = host.free - req.gpus_per_node
        return _clamp(MAX_SCORE * (1 - left / host.total)) if host.total else 0


class MostAllocatedScore:
    """Binpack across GPU, vCPU and memory (kube's MostAllocated)."""

    name = "binpack"

    def __init__(self, weight: int) -> None:
        self.weight = weight

    def score(self, req: PlacementRequest, host: HostState) -> int:
        res = host.res
        cpu = (
            (res.total_vcpus - res.free_vcpus + req.vcpus) / res.total_vcpus
            if res.total_vcpus
            else 1.0
        )
        mem = (
            (res.total_mem - res.free_mem + req.memory_mib) / res.total_mem
            if res.total_mem
            else 1.0
        )
        return _clamp(MAX_SCORE * (2 * _gpu_after(req, host) + cpu + mem) / 4)


class LeastAllocatedScore:
    """Spread: the inverse of binpack (kube's LeastAllocated)."""

    name = "least-allocated"

    def __init__(self, weight: int) -> None:
        self.weight = weight
        self._most = MostAllocatedScore(1)

    def score(self, req: PlacementRequest, host: HostState) -> int:
        return MAX_SCORE - self._most.score(req, host)


class LoadScore:
    """Prefer hosts whose GPUs are measured least busy (thermal / noisy-neighbour
    spreading; only meaningful for shared GPUs and host-level contention)."""

    name = "load"

    def __init__(self, weight: int) -> None:
        self.weight = weight

    def score(self, req: PlacementRequest, host: HostState) -> int:
        x = MAX_SCORE * (1 - host.load)  # _clamp() written out: a hot call
        return 0 if x < 0 else MAX_SCORE if x > MAX_SCORE else int(x + 0.5)


class TopologyScore:
    """Multi-GPU requests: all GPUs on one NVLink island scores 100, on one NUMA
    node 50, scattered 0. Single GPUs prefer the island with the fewest free GPUs
    so whole islands stay free for multi-GPU work."""

    name = "topology"

    def __init__(self, weight: int) -> None:
        self.weight = weight

    def score(self, req: PlacementRequest, host: HostState) -> int:
        g = req.gpus_per_node
        if g == 0:
            return MAX_SCORE
        isl = host.island_free
        if len(isl) == 1:
            return MAX_SCORE  # one island: any choice is as good as another
        if g == 1:
            smallest = min([c for c in isl.values() if c > 0], default=0)
            big = max(isl.values()) or 1
            return _clamp(MAX_SCORE * (1 - (smallest - 1) / big))
        for c in isl.values():
            if c >= g:
                return MAX_SCORE
        numa: dict[int, int] = {}
        for i in range(host.total):
            if host.milli[i] == 0:
                numa[host.numa[i]] = numa.get(host.numa[i], 0) + 1
        return MAX_SCORE // 2 if any(c >= g for c in numa.values()) else 0


class FragScore:
    """Fragmentation-gradient score in the spirit of FGD (Weng et al., ATC'23):
    prefer the host/GPU whose use increases the expected fragmentation of the fleet
    - free capacity the typical request mix cannot use - the least."""

    name = "frag-aware"

    def __init__(self, ctx: CycleContext, weight: int) -> None:
        self.weight = weight
        self.model = frag_model(ctx.mix)

    def score(self, req: PlacementRequest, host: HostState) -> int:
        if req.gpus_per_node == 0 and req.gpu_milli == 0:
            delta = 0.0  # no GPU: this mix has no vCPU dimension
        elif req.gpus_per_node == 0:
            got = self.model.best_share(host, req.gpu_milli, req.tenant_id)
            if got is None:
                return 0
            delta = got[1]
        else:
            delta = self.model.delta_whole(host, req.gpus_per_node)
        # 1000 milli more fragmentation costs 25 points around a neutral 50
        x = MAX_SCORE / 2 - delta / 40  # _clamp() written out: a hot call
        return 0 if x < 0 else MAX_SCORE if x > MAX_SCORE else int(x + 0.5)


register_score("best-fit", lambda ctx, w: BestFitScore(w))
register_score("binpack", lambda ctx, w: MostAllocatedScore(w))
register_score("least-allocated", lambda ctx, w: LeastAllocatedScore(w))
register_score("load", lambda ctx, w: LoadScore(w))
register_score("topology", lambda ctx, w: TopologyScore(w))
register_score("frag-aware", lambda ctx, w: FragScore(ctx, w))

# ------------------------------------------------------------------------- fragmentation


Mix = tuple[tuple[int, int, float], ...]


class FragModel:
    """Expected fragmentation for a request mix, precomputed so a delta is O(1).

    For a host, fragmentation = sum over request types t (probability p_t) of the
    free milli-GPUs t cannot use:
    * a fractional type of m_t milli cannot use a GPU with free f < m_t;
    * a whole type of g_t GPUs cannot use free shares on shared GPUs, nor any
      free GPU of a host with fewer than g_t free GPUs.
    ``frac[f]`` sums the fractional types for one GPU with f free milli,
    ``whole[c]`` the whole types for a host with c free GPUs, and ``p_whole`` is
    the weight of free milli stranded on shared GPUs.
    """

    __slots__ = ("mix", "frac", "whole", "p_whole")

    def __init__(self, mix: Mix, max_free: int = 256) -> None:
        self.mix = mix
        fr = [t for t in mix if t[0] == 0]
        wh = [t for t in mix if t[0] >= 1]
        self.frac: list[float] = [
            sum(p * (f if f < tm else 0) for _tg, tm, p in fr) for f in range(WHOLE + 1)
        ]
        self.whole: list[float] = [
            sum(p * (c * WHOLE if c < tg else 0) for tg, _tm, p in wh) for c in range(max_free + 1)
        ]
        self.p_whole = sum(p for _tg, _tm, p in wh)

    def delta_whole(self, host: HostState, g: int) -> float:
        w = self.whole
        return w[host.free - g] - w[host.free]

    def best_share(self, host: HostState, m: int, tenant: str) -> tuple[int, float] | None:
        """The GPU open to ``tenant`` whose share of ``m`` raises fragmentation least
        (ties: less free room, lower index), with that delta. Memoised on the host
        until it changes (the score and the commit of one placement both ask)."""
        memo = host.share_memo
        key = (m, tenant)
        if memo is not None and memo[0] == key and memo[1] is self:
            return memo[2]
        got = self._best_share(host, m, tenant)
        host.share_memo = (key, self, got)
        return got

    def _best_share(self, host: HostState, m: int, tenant: str) -> tuple[int, float] | None:
        # The delta of a share of m on GPU i with f free, inlined (this loop runs for
        # every candidate of every share): a fresh GPU turns its leftover into a shared
        # fragment (and the host has one free GPU fewer); a shared GPU's fragment shrinks.
        frac = self.frac
        milli = host.milli
        whole = host.whole
        pw = self.p_whole
        free = host.free
        owner = host.owner
        fresh_extra = self.whole[free - 1] - self.whole[free] if free > 0 else 0.0
        best_i = -1
        best_d = 0.0
        best_f = 0
        for i in range(host.total):
            used = milli[i]
            f = WHOLE - used
            if f < m or whole[i] or not share_open(owner[i], tenant):
                continue
            f2 = f - m
            if used == 0:
                d = frac[f2] - frac[f] + pw * f2 + fresh_extra
            else:
                d = frac[f2] - frac[f] - pw * m
            if best_i < 0 or d < best_d or (d == best_d and f < best_f):
                best_i, best_d, best_f = i, d, f
        return None if best_i < 0 else (best_i, best_d)


@functools.lru_cache(maxsize=8)
def frag_model(mix: Mix) -> FragModel:
    return FragModel(mix)


# ------------------------------------------------------------------ FGD (faithful form)

#: the target workload: (gpus_per_node, gpu_milli, vcpus, probability) per task shape;
#: gpus_per_node 0 is a share of ``gpu_milli`` of one GPU (0 milli: no GPU at all),
#: >= 1 whole GPUs
Workload = tuple[tuple[int, int, int, float], ...]


def _frag_sums(frees: Sequence[int], q: Sequence[float]) -> tuple[int, float, int]:
    """The terms of F over a node's GPUs: total free milli, free milli weighted by the
    chance a task cannot use it (``q``), and the number of wholly free GPUs."""
    t = 0
    u = 0.0
    n = 0
    for f in frees:
        t += f
        u += f * q[f]
        if f == WHOLE:
            n += 1
    return t, u, n


class FgdModel:
    """Node fragmentation against a target workload, as in FGD (Weng et al.,
    ATC'23, section 3): for a task shape t and a node n, F_n(t) is the free GPU
    milli of n that t cannot use. If t cannot run on n at all (too few vCPUs, or
    fewer than its GPU count with enough free room each), every free milli of
    the node counts; otherwise the free milli of the GPUs with less room than
    t's per-GPU request does (for whole-GPU shapes: every partly used GPU).
    F_n = sum_t p_t F_n(t). A task goes where F rises least (the gradient).

    Written as F = P*T - U with T the node's free milli, P the total
    probability and U the milli usable by the shapes that fit:
    U = sum_i f_i * Q[c][f_i] + 1000 * n * W[c][n], where f_i is GPU i's free
    milli, n the fully free GPUs, c the number of distinct vCPU requests the
    node's free vCPUs cover, Q[c][f] the probability of share shapes (and
    1-GPU whole shapes) with such vCPUs asking <= f milli, W[c][n] that of
    multi-GPU whole shapes with such vCPUs asking <= n GPUs. One node costs
    O(GPUs), whatever the number of shapes.
    """

    __slots__ = ("workload", "cpus", "Q", "W", "P")

    def __init__(self, workload: Workload, max_gpus: int = 64) -> None:
        self.workload = workload
        self.cpus: list[int] = sorted({t[2] for t in workload})
        self.P = sum(t[3] for t in workload)
        idx = {c: j for j, c in enumerate(self.cpus)}
        rows = len(self.cpus) + 1
        dq = [[0.0] * (WHOLE + 1) for _ in range(rows)]
        dw = [[0.0] * (max_gpus + 1) for _ in range(rows)]
        for g, m, cpu, p in workload:
            r = idx[cpu] + 1  # covered once the free vCPUs reach this request
            if g == 0 and m == 0:
                continue  # no GPU: it can use no free GPU milli (FGD's XL/XR), only P counts it
            if g == 0 or g == 1:
                dq[r][min(m if g == 0 else WHOLE, WHOLE)] += p
            elif g <= max_gpus:
                dw[r][g] += p
        # cumulative over vCPU rows, then over milli / GPU count
        for r in range(1, rows):
            a, b = dq[r], dq[r - 1]
            for f in range(WHOLE + 1):
                a[f] += b[f]
            a, b = dw[r], dw[r - 1]
            for n in range(max_gpus + 1):
                a[n] += b[n]
        for a in dq:
            for f in range(1, WHOLE + 1):
                a[f] += a[f - 1]
        for a in dw:
            for n in range(1, max_gpus + 1):
                a[n] += a[n - 1]
        self.Q = dq
        self.W = dw

    def frag(self, free_vcpus: int, frees: Sequence[int]) -> float:
        """F for a node with these free vCPUs and free milli per GPU."""
        c = bisect.bisect_right(self.cpus, free_vcpus)
        t, u, n = _frag_sums(frees, self.Q[c])
        return self.P * t - u - WHOLE * n * self.W[c][n]

    def frag_host(self, host: HostState) -> float:
        return self.frag(host.res.free_vcpus, [WHOLE - x for x in host.milli])

    def delta_cpu(self, host: HostState, vcpus: int) -> float:
        """F after work without GPUs takes ``vcpus`` of the host, minus F before."""
        frees = [WHOLE - x for x in host.milli]
        return self.frag(host.res.free_vcpus - vcpus, frees) - self.frag(
            host.res.free_vcpus, frees
        )

    def delta_whole(self, host: HostState, g: int, vcpus: int) -> float:
        """F after ``g`` whole GPUs and ``vcpus`` land on the host, minus F before."""
        before = self.frag_host(host)
        frees = [WHOLE - x for x in host.milli]
        left = g
        for i, f in enumerate(frees):
            if left and f == WHOLE:
                frees[i] = 0
                left -= 1
        return self.frag(host.res.free_vcpus - vcpus, frees) - before

    def best_share(
        self, host: HostState, m: int, vcpus: int, tenant: str
    ) -> tuple[int, float] | None:
        """The GPU open to ``tenant`` whose share of ``m`` (with ``vcpus``) raises F
        least (ties: less free room, lower index), with that delta. Memoised on the
        host until it changes (the ranking and the commit both ask)."""
        memo = host.share_memo
        key = (m, vcpus, tenant)
        if memo is not None and memo[0] == key and memo[1] is self:
            return memo[2]
        got = self._best_share(host, m, vcpus, tenant)
        host.share_memo = (key, self, got)
        return got

    def _best_share(
        self, host: HostState, m: int, vcpus: int, tenant: str
    ) -> tuple[int, float] | None:
        cpu = host.res.free_vcpus
        milli = host.milli
        whole = host.whole
        frees = [WHOLE - x for x in milli]
        before = self.frag(cpu, frees)
        c = bisect.bisect_right(self.cpus, cpu - vcpus)
        q = self.Q[c]
        w = self.W[c]
        t, u, n = _frag_sums(frees, q)
        base = self.P * (t - m)
        w_same = WHOLE * n * w[n]
        w_less = WHOLE * (n - 1) * w[n - 1] if n else 0.0
        owner = host.owner
        best_i = -1
        best_d = 0.0
        best_f = 0
        for i in range(host.total):
            f = frees[i]
            if f < m or whole[i] or not share_open(owner[i], tenant):
                continue
            f2 = f - m
            ui = u - f * q[f] + f2 * q[f2]
            after = base - ui - (w_less if f == WHOLE else w_same)
            d = round(after - before, 6)
            if best_i < 0 or d < best_d or (d == best_d and f < best_f):
                best_i, best_d, best_f = i, d, f
        return None if best_i < 0 else (best_i, best_d)


class FgdGradientScore:
    """Ranks hosts for an FGD placement by the fragmentation gradient alone, scored
    as FGD's own plugin does (fgd_score.go in Weng et al.'s simulator):
    ``int(sigmoid(-delta / 1000) * MAX_SCORE)``, so a host whose F falls scores
    over 50 and one whose F rises under. Equal scores go to the lower host_id,
    as FGD's simulator gives them to the smallest node name (which it prefixes with
    a seeded random permutation: ``scheduler.sim.trace.fgd_node_order``)."""

    name = "frag-gradient"

    def __init__(self, model: FgdModel, weight: int = 1) -> None:
        self.model = model
        self.weight = weight

    def delta(self, req: PlacementRequest, host: HostState) -> float | None:
        if req.gpus_per_node == 0 and req.gpu_milli == 0:
            return self.model.delta_cpu(host, req.vcpus)
        if req.gpus_per_node == 0:
            got = self.model.best_share(host, req.gpu_milli, req.vcpus, req.tenant_id)
            return None if got is None else got[1]
        return self.model.delta_whole(host, req.gpus_per_node, req.vcpus)

    def score(self, req: PlacementRequest, host: HostState) -> int:
        d = self.delta(req, host)
        if d is None:
            return 0
        x = -d / 1000
        # a numerically safe logistic: exp() of a large positive argument overflows
        sig = 1 / (1 + math.exp(-x)) if x >= 0 else math.exp(x) / (1 + math.exp(x))
        return int(sig * MAX_SCORE)


@functools.lru_cache(maxsize=8)
def fgd_model(workload: Workload) -> FgdModel:
    return FgdModel(workload)


# FGD's gradient as one score among others (on the k candidates a placement scores)
register_score(
    "fgd", lambda ctx, w: FgdGradientScore(fgd_model(ctx.workload or ((1, WHOLE, 0, 1.0),)), w)
)


# ---------------------------------------------------------------------------- pickers


def pick_share(
    host: HostState, m: int, how: str, mix: Mix, frag: FragModel | None = None, *, tenant: str
) -> int | None:
    """The GPU index a fractional share of ``m`` of ``tenant`` goes on, or None."""
    if how == "frag":
        got = (frag or frag_model(mix)).best_share(host, m, tenant)
        return None if got is None else got[0]
    best: int | None = None
    best_key: tuple[int, int] = (0, 0)
    owner = host.owner
    for i in range(host.total):
        if host.whole[i] or not share_open(owner[i], tenant):
            continue
        f = WHOLE - host.milli[i]
        if f < m:
            continue
        # spread: most room first; best-fit: tightest shared GPU first, fresh last
        key = (-f, i) if how == "spread" else (f, i)
        if best is None or key < best_key:
            best, best_key = i, key
    return best


def pick_whole(host: HostState, g: int) -> list[int] | None:
    """``g`` free GPUs, topology first: the fullest island that still holds all
    of them (keeps bigger islands intact), within it one NUMA node when possible;
    otherwise the fewest NUMA nodes. Ties go to the lowest GPU index."""
    if host.free < g:
        return None
    milli = host.milli
    isl_free = host.island_free
    if len(isl_free) == 1:
        free = [i for i, m in enumerate(milli) if m == 0]
        if host.free == g:
            return free  # every free GPU of a single-island host
    else:
        best_isl = -1
        best_cnt = 0
        for isl, cnt in isl_free.items():
            if cnt >= g and (
                best_isl < 0 or cnt < best_cnt or (cnt == best_cnt and isl < best_isl)
            ):
                best_isl, best_cnt = isl, cnt
        island = host.island
        if best_isl >= 0:
            free = [i for i, m in enumerate(milli) if m == 0 and island[i] == best_isl]
        else:
            free = [i for i, m in enumerate(milli) if m == 0]
    numa = host.numa
    groups: dict[int, list[int]] = {}
    for i in free:
        n = numa[i]
        grp = groups.get(n)
        if grp is None:
            groups[n] = [i]
        else:
            grp.append(i)
    if len(groups) == 1:
        return free[:g]
    best_n = -1
    best_len = 0
    for n, grp in groups.items():
        ln = len(grp)
        if ln >= g and (best_n < 0 or ln < best_len or (ln == best_len and n < best_n)):
            best_n, best_len = n, ln
    if best_n >= 0:
        return groups[best_n][:g]
    out: list[int] = []
    for _n, k in sorted((-len(v), k) for k, v in groups.items()):
        out.extend(groups[k][: g - len(out)])
        if len(out) == g:
            break
    return sorted(out)


# --------------------------------------------------------------------------- placements

register_placement(PlacementSpec("first-fit", scan="fullest", scores=(), k=1))
register_placement(
    PlacementSpec("best-fit", scan="fullest", scores=(("best-fit", 2), ("topology", 1)))
)
register_placement(
    PlacementSpec("binpack", scan="fullest", scores=(("binpack", 2), ("topology", 1)))
)
register_placement(
    PlacementSpec(
        "spread",
        scan="emptiest",
        scores=(("least-allocated", 2), ("load", 1), ("topology", 1)),
        share_pick="spread",
    )
)
# Fragmentation-aware for the live loop: FGD's gradient (vCPUs included, against the
# target workload) on the policy's k fullest feasible candidates only (fast enough for
# 100,000 GPUs), with topology and load; a share goes on the GPU FGD would pick.
register_placement(
    PlacementSpec(
        "frag-aware",
        scan="fullest",
        scores=(("fgd", 3), ("topology", 2), ("load", 1)),
        share_pick="fgd",
    )
)
# The earlier live default: the old expected-fragmentation score (GPU shapes only, no
# vCPUs, the 8 most common shapes) on the k candidates. Kept for comparison.
register_placement(
    PlacementSpec(
        "frag-mix",
        scan="fullest",
        scores=(("frag-aware", 3), ("topology", 2), ("load", 1)),
        share_pick="frag",
    )
)
# FGD as published: every feasible host ranked by the fragmentation gradient against the
# target workload alone. Faithful, but it scores every host per request: for experiments
# and small fleets (the simulator), not the default of a 100,000-GPU loop.
register_placement(
    PlacementSpec(
        "fgd",
        scan="fullest",
        scores=(("frag-aware", 3), ("topology", 2), ("load", 1)),
        share_pick="fgd",
        gradient=True,
    )
)

__all__ = [
    "BatchPoolFilter",
    "BestFitScore",
    "Filter",
    "FgdGradientScore",
    "FgdModel",
    "FragScore",
    "FreeGpusFilter",
    "GpuModelFilter",
    "LeastAllocatedScore",
    "LoadScore",
    "MostAllocatedScore",
    "NvlinkFilter",
    "ReadyFilter",
    "RegionFilter",
    "ReservationFilter",
    "ResourcesFilter",
    "Score",
    "TopologyScore",
    "pick_share",
    "pick_whole",
]
