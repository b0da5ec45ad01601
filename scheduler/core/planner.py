"""``plan()``: one scheduling cycle over a snapshot and a queue.

    queue ──order──▶ admission ──▶ candidates (index) ──filter──▶ score ──▶ Place
                         │ reject/quota        │ none fit
                         ▼                     ▼
                  Reject / Wait      preempt (dynamic classes) ──▶ Preempt* + Wait
                                               │ no victims
                                               ▼
                                 reserve for the head (backfill) ──▶ Wait
    after the queue: reclaim idle GPUs (dynamic) ▸ migration suggestions (defrag)

See docs/scheduler.md for the full story.
"""

from __future__ import annotations

import operator
import sys
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from typing import TypeVar

from . import plugins as _plugins  # noqa: F401  (registers the built-in plugins)
from .framework import (
    FILTERS,
    OK,
    PLACEMENTS,
    SCORES,
    CycleContext,
    Filter,
    Score,
)
from .gcpause import gc_paused
from .model import (
    CLASS_RANK,
    WHOLE,
    ClusterSnapshot,
    Decision,
    HostPlacement,
    Migrate,
    Place,
    PlacementRequest,
    Plan,
    PlanCounters,
    Preempt,
    Reject,
    TenantView,
    Wait,
)
from .plugins import (
    FgdGradientScore,
    FgdModel,
    ResourcesFilter,
    fgd_model,
    frag_model,
    pick_share,
    pick_whole,
)
from .policy import Policy, get_policy
from .queue import Order, ShareBook, las_level, las_queue, make_order, remaining_time
from .quota import QuotaBook
from .state import (
    INF,
    N_SHARE_BUCKETS,
    SHARE_BUCKET,
    AllocState,
    Ending,
    Fleet,
    HostState,
    PlanCache,
    Pool,
    release_owner,
    share_open,
)

_T = TypeVar("_T")

# the order in which running work is expected to end: by time, ties by request id
_end_order = operator.itemgetter(0, 1)
_SHAPE_OF = operator.attrgetter("gpus_per_node", "gpu_milli")


class _Miss:
    """Why a request found no room: filter failures by name, hosts examined."""

    __slots__ = ("fails", "examined")

    def __init__(self, fails: Counter[str], examined: int) -> None:
        self.fails = fails
        self.examined = examined


_Shape = tuple[int, int, int, int, float]
#: a shape plus the requester's time-slice key (``slice_of``): what a victim search depends on
_VShape = tuple[int, int, int, int, float, float]


def _first_two(r: tuple[int, str, HostState]) -> tuple[int, str]:
    return r[0], r[1]


def _release(
    hs: HostState,
    whole: list[bool],
    milli: list[int],
    owner: list[str | None],
    placements: Sequence[HostPlacement],
) -> None:
    """Free, in the ``whole``/``milli``/``owner`` copies of ``hs``, the GPUs these
    placements hold there."""
    pos = hs.pos
    for p in placements:
        if p.host_id != hs.host_id:
            continue
        for u in p.gpus:
            i = pos.get(u)
            if i is None:
                continue
            if whole[i]:
                whole[i] = False
                milli[i] = 0
            else:
                milli[i] = max(0, milli[i] - p.milli)
                release_owner(owner, milli, i)


def _dominated(frontier: list[tuple[_Shape, _T]] | None, shape: _Shape) -> _T | None:
    """The payload of a remembered failure ``shape`` is at least as large as."""
    if frontier:
        for f, payload in frontier:
            if (
                shape[0] >= f[0]
                and shape[1] >= f[1]
                and shape[2] >= f[2]
                and shape[3] >= f[3]
                and shape[4] >= f[4]
            ):
                return payload
    return None


BASE_FILTERS = ("ready", "gpu-model", "region", "gpus", "resources")


class _Cap:
    """The blast radius of one preemption (``Policy.preempt_cap``): the victims may
    hold at most ``mult`` times what the request needs - GPU-seconds of remaining
    expected work when the request and every victim have estimates, else GPUs.
    ``over`` keeps the smallest eviction that would have made room but was refused,
    for the request's wait reason."""

    __slots__ = ("mult", "milli", "gpu_s", "now", "over", "max_milli", "max_gpu_s")

    def __init__(self, req: PlacementRequest, mult: float, now: float) -> None:
        self.mult = mult
        self.milli = req.milli_per_node  # per node: victims are chosen host by host
        d = req.expected_duration
        self.gpu_s = None if d is None else self.milli / WHOLE * d
        self.now = now
        self.over: tuple[float, bool] | None = None
        # what one victim may hold at most, in each measure (+ rounding slack)
        self.max_milli = mult * self.milli + 1e-6
        self.max_gpu_s = INF if self.gpu_s is None else mult * self.gpu_s * WHOLE + 1e-3

    def one_ok(self, a: AllocState) -> bool:
        """May ``a`` be a victim at all (alone within the cap)? The hot filter."""
        end = a.alloc.expected_end
        if end is None or self.gpu_s is None:
            return a.milli <= self.max_milli
        return a.milli * max(0.0, end - self.now) <= self.max_gpu_s

    @property
    def bounded(self) -> bool:
        return self.mult != INF

    def cost(self, victims: Iterable[AllocState]) -> tuple[float, bool]:
        """What evicting ``victims`` costs: (GPU-seconds of remaining work, True) or (GPUs, False)."""
        vs = list(victims)
        now = self.now
        if self.gpu_s is not None:
            ends = [a.alloc.expected_end for a in vs]
            if None not in ends:
                return (
                    sum(a.milli / WHOLE * max(0.0, e - now) for a, e in zip(vs, ends, strict=True) if e is not None),
                    True,
                )
        return sum(a.milli for a in vs) / WHOLE, False

    def ok(self, victims: Iterable[AllocState], nodes: int = 1) -> bool:
        if self.mult == INF:
            return True
        c, secs = self.cost(victims)
        need = self.gpu_s if secs else self.milli / WHOLE
        return c <= self.mult * nodes * need + 1e-9  # type: ignore[operator]

    def note(self, victims: Iterable[AllocState]) -> None:
        c = self.cost(victims)
        if self.over is None or c < self.over:
            self.over = c

    def words(self, req: PlacementRequest) -> str:
        """Why preemption did not make room: "" unless the cap refused some."""
        if self.over is None:
            return ""
        c, secs = self.over
        if secs:
            need = (self.gpu_s or 0.0) * req.nodes / 3600
            return (
                f"preempting for it would evict {c / 3600:.1f} GPU-hours of remaining work, "
                f"over the cap of {self.mult:g}x its {need:.1f} GPU-hours"
            )
        need_gpus = self.milli * req.nodes / WHOLE
        return (
            f"preempting for it would evict {c:g} GPUs of running work, "
            f"over the cap of {self.mult:g}x the {need_gpus:g} GPU{'s' if need_gpus != 1 else ''} "
            f"it asks for"
        )


def plan(
    snapshot: ClusterSnapshot,
    queue: Iterable[PlacementRequest],
    policy: Policy | str,
    *,
    now: float,
    cache: PlanCache | None = None,
) -> Plan:
    """Decide one cycle. Pure: same arguments, same plan.

    ``queue`` holds the pending requests (any order; the policy orders them).
    Running work, tenants and idle data come in ``snapshot``.

    ``cache`` (optional) lets a caller that plans again and again over mostly the
    same ``HostView`` objects skip rebuilding their working state; the plan is
    the same with or without it (see ``PlanCache``).
    """
    pol = get_policy(policy) if isinstance(policy, str) else policy
    reqs = list(queue)
    with gc_paused():
        if cache is None:
            return _Planner(snapshot, reqs, pol, now).run()
        planner = None
        try:
            planner = _Planner(snapshot, reqs, pol, now, cache)
            return planner.run()
        finally:
            if planner is None or sys.exc_info()[0] is not None:
                cache.clear()  # half-built or half-booked state: start afresh
            else:
                cache.forget(planner.fleet.touched)


def derive_mix(
    reqs: Sequence[PlacementRequest], top: int = 8
) -> tuple[tuple[int, int, float], ...]:
    """The typical request mix for fragmentation scores: the ``top`` most common
    shapes of the queue, as (gpus_per_node, gpu_milli, probability)."""
    counts = Counter(map(_SHAPE_OF, reqs))
    if not counts:
        return ((1, WHOLE, 1.0),)
    common = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
    total = sum(c for _k, c in common)
    return tuple((g, m, c / total) for (g, m), c in common)


#: "every feasible host" for gradient placements (the scan limit still bounds it)
ALL_HOSTS = 1 << 30

_WORKLOAD_OF = operator.attrgetter("gpus_per_node", "gpu_milli", "vcpus")


def derive_workload(
    reqs: Iterable[PlacementRequest], popularity: float = 1.0
) -> tuple[tuple[int, int, int, float], ...]:
    """The FGD target workload: the popularity of the task shapes (GPU count or
    milli share, and vCPUs) among ``reqs``, as (gpus_per_node, gpu_milli, vcpus,
    probability), most popular first (ties by shape). With ``popularity`` < 1 only
    the most popular shapes are kept, until they cover that share of the tasks,
    and renormalised (FGD's "typical pods": 0.95 in its experiments)."""
    counts = Counter(map(_WORKLOAD_OF, reqs))
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


def _gib(mib: int) -> str:
    return f"{mib / 1024:g}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


class _Planner:
    def __init__(
        self,
        snapshot: ClusterSnapshot,
        reqs: list[PlacementRequest],
        policy: Policy,
        now: float,
        cache: PlanCache | None = None,
    ) -> None:
        self.p = policy
        self.now = now
        self.reqs = reqs
        self.spec = PLACEMENTS[policy.placement]
        self.k = (
            ALL_HOSTS
            if self.spec.gradient
            else max(1, policy.k if policy.k is not None else self.spec.k)
        )
        self.mix = policy.mix or derive_mix(reqs)
        self.workload = (
            (policy.workload or derive_workload(reqs)) if self.spec.uses_workload else ()
        )
        if cache is not None:
            # cached score totals are only valid for the same plugins and mix
            key: tuple[object, ...] = (self.spec, self.mix)
            if self.spec.uses_workload:
                key = (self.spec, self.mix, self.workload)
            if cache.key != key:
                cache.clear()
                cache.key = key
        self.fleet = Fleet(snapshot, now, cache)
        self.frag = frag_model(self.mix)
        ctx = CycleContext(
            now=now,
            mix=self.mix,
            workload=self.workload,
            require_island=policy.topology == "require",
        )
        names = list(BASE_FILTERS)
        if policy.topology == "require":
            names.append("nvlink")
        names.append("reservation")
        names.extend(policy.extra_filters)
        self.filters: list[Filter] = [FILTERS[n](ctx) for n in names]
        self.hot: list[Filter] = []
        self.hot_one: list[Filter] = []
        self.hot_multi: list[Filter] = []
        self.reserving = False
        self.pick_hot_filters()
        self.scores: list[Score] = [SCORES[n](ctx, w) for n, w in self.spec.scores]
        self.fgd: FgdModel | None = None
        if self.spec.uses_workload:
            self.fgd = fgd_model(self.workload)
        if self.spec.gradient:
            assert self.fgd is not None
            self.scores = [FgdGradientScore(self.fgd)]
        self.tenants: dict[str, TenantView] = {t.tenant_id: t for t in snapshot.tenants}
        self.book = ShareBook(self.fleet, snapshot)
        self.quota = QuotaBook(self.fleet, snapshot)
        self.decisions: list[Decision] = []
        self.failed: dict[tuple[object, ...], list[tuple[_Shape, _Miss]]] = {}
        # (gpu model, region or None) -> first blocked request id. Keyed by region
        # too: a head pinned to one region must not block work pinned elsewhere.
        self.blocked: dict[tuple[str, str | None], str] = {}
        self.reservation: dict[str, float] = {}  # gpu model -> reserved start
        self.ahead: dict[str, int] = {}  # gpu model -> requests already waiting
        self.waiting_milli: dict[str, int] = {}
        self.under_notice: dict[str, list[AllocState]] = {}
        for st in self.fleet.allocs.values():
            pf = st.alloc.preempting_for
            if st.alloc.preempting and pf is not None:
                self.under_notice.setdefault(pf, []).append(st)
        self.n = Counter[str]()
        self.pool_cache: dict[tuple[str, str | None, tuple[str, ...]], list[Pool]] = {}
        # shape and time-slice key -> "" (no victims at all: any larger shape, or one
        # with a later slice key, has none either) or the cap's words (refused by the
        # cap: only this very shape and key, a larger one may fit the cap)
        self.no_victims: dict[tuple[object, ...], list[tuple[_VShape, str]]] = {}
        # the blast-radius bound of the request whose victims are being chosen
        self.cap: _Cap | None = None
        # (pool, class rank) -> hosts that still hold work that class could preempt
        self.victim_hosts: dict[tuple[str, str, int, float], dict[HostState, None]] = {}
        self.slice_cache: dict[str, float] = {}
        self.level_cache: dict[str, int] = {}
        self.dynamic = {c: policy.mode_for(c) == "dynamic" for c in CLASS_RANK}
        self.quantum: dict[str, float] = dict(policy.slice_quantum)

    # ------------------------------------------------------------------ the cycle

    def run(self) -> Plan:
        order = make_order(self.p, self.reqs, self.book, self.now)
        cap = self.p.max_waits
        if cap is None:
            while (req := order.pop()) is not None:
                placed = self.decide(req)
                order.done(req, placed)
        else:
            misses = 0
            while (req := order.pop()) is not None:
                placed = self.decide(req)
                order.done(req, placed)
                if not placed:
                    misses += 1
                    if misses >= cap:
                        break
            self.unexamined(order, misses)
        if self.p.reclaim:
            self.reclaim()
        if self.p.defrag:
            self.defragment()
        n = self.n
        return Plan(
            policy=self.p.name,
            now=self.now,
            decisions=tuple(self.decisions),
            counters=PlanCounters(
                placed=n["placed"],
                backfilled=n["backfilled"],
                waiting=n["waiting"],
                rejected=n["rejected"],
                preempted=n["preempted"],
                reclaimed=n["reclaimed"],
                migrations=n["migrations"],
                placed_gpu_milli=n["placed_gpu_milli"],
                hosts_examined=n["examined"],
            ),
        )

    def unexamined(self, order: Order, misses: int) -> None:
        """The depth cap: what is left of the queue waits without being looked at."""
        rest = []
        while (req := order.pop()) is not None:
            rest.append(req)
            order.done(req, False)
        if not rest:
            return
        reason = (
            f"not examined this cycle: {_plural(misses, 'request')} ahead of it could not start"
        )
        self.decisions.extend(Wait(r.request_id, reason) for r in rest)
        self.n["waiting"] += len(rest)

    def wait(self, req: PlacementRequest, reason: str, *, capacity: bool = True) -> bool:
        if capacity:
            ahead = self.ahead.get(req.gpu_model, 0)
            if ahead:
                reason = f"{reason}; {_plural(ahead, 'request')} ahead of you"
            self.ahead[req.gpu_model] = ahead + 1
            self.waiting_milli[req.gpu_model] = (
                self.waiting_milli.get(req.gpu_model, 0) + req.total_milli
            )
        self.decisions.append(Wait(req.request_id, reason))
        self.n["waiting"] += 1
        return False

    def reject(self, req: PlacementRequest, reason: str) -> bool:
        self.decisions.append(Reject(req.request_id, reason))
        self.n["rejected"] += 1
        return False

    def decide(self, req: PlacementRequest) -> bool:
        bad = self.invalid(req) or self.never_fits(req)
        if bad:
            return self.reject(req, bad)
        return self.admit(req)

    def admit(self, req: PlacementRequest) -> bool:
        tenant = self.tenants.get(req.tenant_id)
        if tenant is not None and tenant.budget_exhausted:
            return self.wait(req, "budget: the tenant's budget is spent", capacity=False)
        excluded: tuple[str, ...] = ()
        if self.quota.has_rules(req.tenant_id):
            q = self.quota.check(req, req.region)
            if q is not None:
                is_reject, why = q
                return self.reject(req, why) if is_reject else self.wait(req, why, capacity=False)
            if req.region is None:
                ex = []
                why = ""
                for pool in self.fleet.pools_by_model.get(req.gpu_model, ()):
                    if pool.region in ex:
                        continue
                    q = self.quota.check(req, pool.region)
                    if q is not None:
                        ex.append(pool.region)
                        why = why or q[1]
                pools_left = [
                    p
                    for p in self.fleet.pools_by_model.get(req.gpu_model, ())
                    if p.region not in ex
                ]
                if not pools_left:
                    return self.wait(req, why, capacity=False)
                excluded = tuple(ex)
        model = req.gpu_model
        if self.p.head_of_line and not self.p.backfill and self.is_blocked(req):
            return self.wait(req, f"waiting behind an earlier {model} request")
        if req.pinned_host is not None:
            return self.admit_pinned(req)
        pkey0 = (model, req.region, excluded)
        pools = self.pool_cache.get(pkey0)
        if pools is None:
            pools = self.pool_cache[pkey0] = [
                p
                for p in self.fleet.pools_by_model.get(model, ())
                if (req.region is None or p.region == req.region) and p.region not in excluded
            ]
        # Capacity only shrinks within a cycle, so once a shape failed, any request
        # at least as large (per resource) fails too: remember the minimal failures.
        # a share's room depends on its tenant (tenant isolation), a whole GPU's does not
        key = (model, req.region, req.tenant_id if req.gpus_per_node == 0 else None, excluded)
        shape = (
            req.gpus_per_node or req.gpu_milli,
            req.nodes,
            req.vcpus,
            req.memory_mib,
            INF if req.expected_duration is None else req.expected_duration,
        )
        memo = _dominated(self.failed.get(key), shape)
        if memo is None:
            placement = self.find(req, pools)
            if isinstance(placement, tuple):
                self.commit(req, placement)
                return True
            memo = placement
            self.failed.setdefault(key, []).append((shape, memo))
        failure = self.why(req, memo.fails, memo.examined)
        # no room now: preempt lower classes, or wait for victims already under notice
        if self.may_preempt(req):
            pending = [a for a in self.under_notice.get(req.request_id, ()) if a.doomed]
            if pending:
                self.reserve_hosts_of(req, pending)
                return self.wait(
                    req, f"waiting for {self.victim_words(pending)} to stop", capacity=False
                )
            pkey = (*key, CLASS_RANK.get(req.priority, 1))
            vshape = (*shape, self.slice_of(req))
            capped = self.known_no_victims(pkey, vshape)
            if capped is None:
                self.cap = _Cap(req, self.p.preempt_cap, self.now)
                victims = self.find_victims(req, pools)
                if victims:
                    return self.preempt_for(req, victims)
                # victims only ever get fewer within a cycle, so this shape stays unservable
                capped = self.cap.words(req)
                self.no_victims.setdefault(pkey, []).append((vshape, capped))
            if capped:
                failure = f"{failure}; {capped}"
        if not self.is_blocked(req):
            self.blocked[(model, req.region)] = req.request_id
            if self.p.backfill:
                self.reserve(req, pools)
        return self.wait(req, failure)

    def admit_pinned(self, req: PlacementRequest) -> bool:
        """Host affinity: the request goes on ``req.pinned_host`` or waits for it.

        Every filter runs on that one host (no index walk). When it does not fit, a
        dynamic class may preempt lower-class work there; otherwise it waits, and under
        backfill holds the host from the time its running work is expected to end.
        """
        host = req.pinned_host
        assert host is not None
        hs = self.fleet.host_slice(host, req.gpu_model)
        because = f", {req.pinned_because}," if req.pinned_because else ""
        reason = f"waiting for host {req.pinned_host_name or host}{because} to have {self.what(req)}"
        if hs is not None:
            for flt in self.filters:
                if not flt.filter(req, hs).ok:
                    break
            else:
                self.commit(req, (hs,))
                return True
            if hs.ready and self.may_preempt(req):
                pending = [a for a in self.under_notice.get(req.request_id, ()) if a.doomed]
                if pending:
                    return self.wait(
                        req, f"waiting for {self.victim_words(pending)} to stop", capacity=False
                    )
                if hs.reserved_at is None or hs.reserved_for == req.request_id:
                    self.cap = _Cap(req, self.p.preempt_cap, self.now)
                    victims = self.host_victims(req, hs)
                    if victims:
                        self.mark_reserved(hs, self.now, req.request_id)
                        return self.preempt_for(req, victims)
                    capped = self.cap.words(req)
                    if capped:
                        reason = f"{reason}; {capped}"
            if self.p.backfill and hs.ready and hs.reserved_at is None:
                at = self.earliest_fit(req, hs)
                if at < INF:
                    self.mark_reserved(hs, at, req.request_id)
        return self.wait(req, reason)

    def preempt_for(self, req: PlacementRequest, victims: Sequence[AllocState]) -> bool:
        """Give ``victims`` notice to make room for ``req``, which waits for them."""
        for a in victims:
            a.doomed = True
            # a checkpointing victim gets its declared grace to save its progress
            notice = max(self.p.notice_s, a.alloc.grace_s)
            self.decisions.append(
                Preempt(
                    a.alloc.request_id,
                    req.request_id,
                    notice,
                    f"preempted to make room for {req.priority}-class work; "
                    f"stops in {notice:g} s",
                )
            )
            self.n["preempted"] += 1
        return self.wait(req, f"waiting for {self.victim_words(victims)} to stop", capacity=False)

    def is_blocked(self, req: PlacementRequest) -> bool:
        """Is an earlier request for this model blocked where ``req`` could go?"""
        b = self.blocked
        return (req.gpu_model, req.region) in b or (req.gpu_model, None) in b

    def pick_hot_filters(self) -> None:
        """The filters the candidate loop runs. Besides ``indexed`` filters it
        leaves out what the walk guarantees for whole-GPU requests (``gpus``: the
        bucket has >= g free), ``nvlink`` for single GPUs, and ``reservation``
        until some host is reserved; each saves a call per host examined."""
        self.hot = [
            f for f in self.filters if not f.indexed and (f.name != "reservation" or self.reserving)
        ]
        self.hot_multi = [f for f in self.hot if f.name != "gpus"]
        self.hot_one = [f for f in self.hot_multi if f.name != "nvlink"]
        # the usual single-GPU case runs the resources filter alone: the candidate
        # loop then does its two comparisons inline instead of a call per host
        self.one_res_only = len(self.hot_one) == 1 and type(self.hot_one[0]) is ResourcesFilter

    def mark_reserved(self, hs: HostState, at: float, request_id: str) -> None:
        hs.reserved_at = at
        hs.reserved_for = request_id
        if not self.reserving:
            self.reserving = True
            self.pick_hot_filters()

    # ------------------------------------------------------------------ admission

    @staticmethod
    def invalid(req: PlacementRequest) -> str:
        if req.nodes < 1:
            return "a request needs at least one node"
        if req.gpus_per_node < 0 or req.vcpus < 0 or req.memory_mib < 0:
            return "GPU, vCPU and memory amounts cannot be negative"
        if req.gpus_per_node == 0:
            if not 0 <= req.gpu_milli < WHOLE:
                return "a fractional GPU share must be between 1 and 999 milli-GPUs"
            if req.nodes > 1:
                return "fractional GPU shares are single-node"
            if req.gpu_milli == 0 and not (req.vcpus or req.memory_mib):
                return "a request without GPUs must ask for vCPUs or memory"
        elif req.gpu_milli != WHOLE:
            return "whole-GPU requests take whole GPUs (gpu_milli must be 1000)"
        if req.pinned_host is not None and req.nodes > 1:
            return "work pinned to one host (a volume lives there) runs on one node"
        return ""

    def never_fits(self, req: PlacementRequest) -> str:
        f = self.fleet
        model, region = req.gpu_model, req.region
        biggest = f.max_gpus.get((model, region))
        g = req.gpus_per_node
        if (
            biggest is not None
            and g <= biggest
            and req.vcpus <= f.max_vcpus
            and req.memory_mib <= f.max_mem
            and (req.nodes == 1 or req.nodes <= f.hosts_with(model, region, max(g, 1)))
        ):
            return ""  # the common case: no words to build
        where = f" in {region}" if region else ""
        if biggest is None:
            return f"the fleet has no {model} GPUs{where}"
        if g > biggest:
            return (
                f"asks for {g} {model} GPUs on one host but the largest {model} host{where} "
                f"has {biggest}"
            )
        if req.nodes > 1:
            have = f.hosts_with(model, region, max(g, 1))
            if req.nodes > have:
                return (
                    f"asks for {req.nodes} hosts with {g} {model} GPUs each but the fleet{where} "
                    f"has {have}"
                )
        if req.vcpus > f.max_vcpus:
            return f"asks for {req.vcpus} vCPUs but the largest host has {f.max_vcpus}"
        if req.memory_mib > f.max_mem:
            return (
                f"asks for {_gib(req.memory_mib)} GiB memory but the largest host has "
                f"{_gib(f.max_mem)} GiB"
            )
        return ""

    # ------------------------------------------------------------------ placement

    def what(self, req: PlacementRequest) -> str:
        if req.gpus_per_node == 0 and req.gpu_milli == 0:
            return "room for work without GPUs"
        if req.gpus_per_node == 0:
            return f"a {req.gpu_milli / 10:g}% share of a {req.gpu_model} GPU free"
        g = req.gpus_per_node
        return f"{g} free {req.gpu_model} GPU{'s' if g > 1 else ''}"

    def candidates(
        self, req: PlacementRequest, pools: Sequence[Pool], need: int
    ) -> tuple[list[HostState], Counter[str] | None, int]:
        """Walk the index buckets that can hold ``req`` and return up to ``need``
        hosts passing every filter, plus why the others failed."""
        out: list[HostState] = []
        fails: Counter[str] | None = None
        examined = 0
        limit = self.p.scan_limit
        g = req.gpus_per_node
        hot = self.hot if g == 0 else self.hot_one if g == 1 else self.hot_multi
        if g > 0 and self.spec.scan == "fullest":
            # the common case, walked inline (no generator): hosts with >= g free
            # GPUs, fewest free first
            top = max([p.max_gpus for p in pools], default=0)
            if g == 1 and self.one_res_only:
                vcpus = req.vcpus
                mem = req.memory_mib
                for c in range(1, top + 1):
                    for pool in pools:
                        if c >= len(pool.by_free):
                            continue
                        for hs in pool.by_free[c]:
                            examined += 1
                            res = hs.res
                            if res.free_vcpus < vcpus or res.free_mem < mem:
                                if fails is None:
                                    fails = Counter()
                                fails["resources"] += 1
                            else:
                                out.append(hs)
                                if len(out) >= need:
                                    return out, fails, examined
                            if examined >= limit:
                                return out, fails, examined
                return out, fails, examined
            for c in range(g, top + 1):
                for pool in pools:
                    if c >= len(pool.by_free):
                        continue
                    for hs in pool.by_free[c]:
                        examined += 1
                        for flt in hot:
                            st = flt.filter(req, hs)
                            if st is not OK and st.code:
                                if fails is None:
                                    fails = Counter()
                                fails[flt.name] += 1
                                break
                        else:
                            out.append(hs)
                            if len(out) >= need:
                                return out, fails, examined
                        if examined >= limit:
                            return out, fails, examined
            return out, fails, examined
        for hs in self.walk(req, pools):
            examined += 1
            for flt in hot:
                st = flt.filter(req, hs)
                if st is not OK and st.code:
                    if fails is None:
                        fails = Counter()
                    fails[flt.name] += 1
                    break
            else:
                out.append(hs)
                if len(out) >= need:
                    break
            if examined >= limit:
                break
        return out, fails, examined

    def walk(self, req: PlacementRequest, pools: Sequence[Pool]) -> Iterator[HostState]:
        """Hosts from the index buckets that can hold ``req``, in scan order.

        Whole GPUs: buckets of hosts with >= g free GPUs, fewest first (packing)
        or most first (spreading). Shares: GPUs already carrying shares with
        enough room (packing shares together), then hosts with a free GPU.
        The caller must stop iterating before it changes the index.
        """
        g = req.gpus_per_node
        fullest = self.spec.scan == "fullest"
        top = max([p.max_gpus for p in pools], default=0)
        if g > 0:
            for c in range(g, top + 1) if fullest else range(top, g - 1, -1):
                for pool in pools:
                    if c < len(pool.by_free):
                        yield from pool.by_free[c]
            return
        m = req.gpu_milli
        if m == 0:
            # no GPU: any host, fullest (fewest free GPUs) first when packing
            for c in range(0, top + 1) if fullest else range(top, -1, -1):
                for pool in pools:
                    if c < len(pool.by_free):
                        yield from pool.by_free[c]
            return
        tenant = req.tenant_id
        seen: set[HostState] = set()
        lo = m // SHARE_BUCKET
        shared_order = (
            range(lo, N_SHARE_BUCKETS) if fullest else range(N_SHARE_BUCKETS - 1, lo - 1, -1)
        )
        fresh_order = range(1, top + 1) if fullest else range(top, 0, -1)
        for phase in ("shared", "fresh") if fullest else ("fresh", "shared"):
            if phase == "shared":
                # tenant isolation by layout: only the buckets of GPUs open to every
                # tenant and of GPUs whose shares are this tenant's (share_open)
                for b in shared_order:
                    for pool in pools:
                        for owner in (None, tenant):
                            buckets = pool.shared.get(owner)
                            if buckets is None:
                                continue
                            for hs, i in buckets[b]:
                                if hs in seen or WHOLE - hs.milli[i] < m:
                                    continue
                                seen.add(hs)
                                yield hs
            else:
                for c in fresh_order:
                    for pool in pools:
                        if c < len(pool.by_free):
                            for hs in pool.by_free[c]:
                                if hs not in seen:
                                    seen.add(hs)
                                    yield hs

    def find(self, req: PlacementRequest, pools: Sequence[Pool]) -> tuple[HostState, ...] | _Miss:
        """The hosts to use (one per node), or why none fit (filter failures and
        hosts examined, turned into words by ``why``)."""
        if req.nodes > 1 and req.region is None:
            # a gang stays in one region: try regions in name order
            fails: Counter[str] = Counter()
            examined = 0
            for region in sorted({p.region for p in pools}):
                got = self.find_in(req, [p for p in pools if p.region == region])
                if isinstance(got, tuple):
                    return got
                fails.update(got.fails)
                examined += got.examined
            return _Miss(fails, examined)
        return self.find_in(req, pools)

    def find_in(
        self, req: PlacementRequest, pools: Sequence[Pool]
    ) -> tuple[HostState, ...] | _Miss:
        nodes = req.nodes
        feasible, fails, examined = self.candidates(req, pools, max(self.k, nodes))
        self.n["examined"] += examined
        if len(feasible) < nodes:
            return _Miss(fails if fails is not None else Counter(), examined)
        if self.scores and len(feasible) > nodes:
            # rank by (-weighted score, host_id); written out flat, it is the hot loop
            # Scores depend only on the request's shape and the host, so a host's
            # total is cached until something lands on it: the runners-up of one
            # request are usually the candidates of the next.
            shape = (
                req.gpus_per_node,
                req.gpu_milli,
                req.vcpus,
                req.memory_mib,
                # a share's GPU pick (and so its score) depends on its tenant
                req.tenant_id if req.gpus_per_node == 0 else None,
            )
            ranked = []
            scores = self.scores
            best: HostState | None = None
            best_total = 0
            for hs in feasible:
                cache = hs.scores
                if cache is None:
                    cache = hs.scores = {}
                total = cache.get(shape)
                if total is None:
                    total = 0
                    for sc in scores:
                        total += sc.weight * sc.score(req, hs)
                    cache[shape] = total
                if nodes == 1:
                    # min over (-total, host_id) without building the tuples
                    if (
                        best is None
                        or total > best_total
                        or (total == best_total and hs.host_id < best.host_id)
                    ):
                        best, best_total = hs, total
                else:
                    ranked.append((-total, hs.host_id, hs))
            if best is not None:
                return (best,)
            ranked.sort(key=_first_two)
            return tuple(r[2] for r in ranked[:nodes])
        return tuple(feasible[:nodes])

    def why(self, req: PlacementRequest, fails: Counter[str], examined: int) -> str:
        where = f" in {req.region}" if req.region else ""
        what = self.what(req)
        subject = "no host" if req.nodes == 1 else f"fewer than {req.nodes} hosts"
        verb = "has" if req.nodes == 1 else "have"
        if examined == 0 or not fails:
            return f"{subject}{where} {verb} {what}"
        top = max(fails.items(), key=lambda kv: (kv[1], kv[0]))[0]
        if top == "resources":
            return (
                f"{subject}{where} with {what} {verb} {req.vcpus} vCPUs and "
                f"{_gib(req.memory_mib)} GiB memory free"
            )
        if top == "nvlink":
            return f"{subject}{where} {verb} {what} on one NVLink island"
        if top == "reservation":
            at = self.reservation.get(req.gpu_model)
            when = (
                f" (starting in {max(at - self.now, 0):.0f} s)"
                if at is not None and at > self.now
                else ""
            )
            return f"the free {req.gpu_model} GPUs are reserved for an earlier request{when}"
        if top == "gpus":
            return f"{subject}{where} {verb} {what}"
        return f"{subject}{where} {verb} {what} ({top})"

    def commit(self, req: PlacementRequest, hosts: tuple[HostState, ...]) -> None:
        out: list[HostPlacement] = []
        g = req.gpus_per_node
        slices = self.fleet.slices
        for hs in hosts:
            pool = hs.pool
            assert pool is not None
            uuids = hs.uuids
            if g > 0:
                idxs = pick_whole(hs, g)
                assert idxs is not None
                pool.take_whole(hs, idxs)
                out.append(HostPlacement(hs.host_id, tuple([uuids[i] for i in idxs]), WHOLE))
            elif req.gpu_milli == 0:
                out.append(HostPlacement(hs.host_id, (), 0))  # no GPU: vCPUs and memory only
            else:
                if self.fgd is not None and self.spec.share_pick == "fgd":
                    got = self.fgd.best_share(hs, req.gpu_milli, req.vcpus, req.tenant_id)
                    i = None if got is None else got[0]
                else:
                    i = pick_share(
                        hs, req.gpu_milli, self.spec.share_pick, self.mix, self.frag,
                        tenant=req.tenant_id,
                    )
                assert i is not None
                pool.take_share(hs, i, req.gpu_milli, req.tenant_id)
                out.append(HostPlacement(hs.host_id, (uuids[i],), req.gpu_milli))
            res = hs.res
            res.free_vcpus -= req.vcpus
            res.free_mem -= req.memory_mib
            host_slices = slices[hs.host_id]
            if len(host_slices) == 1:
                hs.scores = None
            else:
                for sl in host_slices:
                    sl.scores = None
        placements = tuple(out)
        if req.expected_duration is not None:
            # A reservation computed later in this cycle must see this work end, exactly as
            # the next cycle will see it as an allocation; otherwise a head blocked behind
            # it holds hosts outright now and other hosts next cycle.
            ending = Ending(self.now + req.expected_duration, req.request_id, req.vcpus, req.memory_mib,
                          placements, (g or 1) * req.nodes)
            for hs in hosts:
                hs.placed.append(ending)
        backfilled = bool(self.blocked) and self.is_blocked(req)
        self.decisions.append(Place(req.request_id, placements, backfilled))
        if self.quota.rules:
            self.quota.charge(req, hosts[0].region)
        n = self.n
        n["placed"] += 1
        n["placed_gpu_milli"] += (g * WHOLE if g else req.gpu_milli) * req.nodes
        if backfilled:
            n["backfilled"] += 1

    # ------------------------------------------------------------------ preemption

    def may_preempt(self, req: PlacementRequest) -> bool:
        return self.p.preemption and self.p.mode != "static"

    def victim_words(self, victims: Sequence[AllocState]) -> str:
        kinds = {a.alloc.kind for a in victims}
        noun = "instance" if kinds == {"instance"} else "job" if kinds == {"job"} else "workload"
        return f"{len(victims)} preempted {noun}{'s' if len(victims) != 1 else ''}"

    def eligible(self, req: PlacementRequest, a: AllocState) -> bool:
        return self.can_evict(a, CLASS_RANK.get(req.priority, 1), self.slice_of(req))

    def slice_of(self, req: PlacementRequest) -> float:
        """The requester's time-slice key: its attained-service queue (las) or its
        expected remaining time (srtf); INF when it may preempt nothing of its class."""
        ts = self.p.time_slice
        if not ts:
            return INF
        got = self.slice_cache.get(req.request_id)
        if got is None:
            if ts == "las":
                got = float(las_level(self.p, req, self.now))
            else:
                got = remaining_time(req)
            self.slice_cache[req.request_id] = got
        return got

    def run_level(self, a: AllocState) -> int:
        """The attained-service queue running work is in now."""
        al = a.alloc
        got = self.level_cache.get(al.request_id)
        if got is None:
            attained = al.attained_service + max(0.0, self.now - al.started_at) * a.milli / WHOLE
            got = self.level_cache[al.request_id] = las_queue(attained, self.p.las_thresholds)
        return got

    def can_evict(self, a: AllocState, rank: int, mine: float) -> bool:
        """May a request of class ``rank`` with time-slice key ``mine`` preempt ``a``?

        By class: ``a`` is of a lower class whose mode is dynamic. Inside a class
        (``time_slice``): ``a`` is checkpointing batch work (kind job) that ran at
        least its class's quantum (``slice_quantum``, else ``min_run_s``) and sits
        in a lower attained-service queue (las) or is expected to run longer than
        the request (srtf). Instances are never time-sliced."""
        if a.doomed or not self.dynamic.get(a.alloc.priority, False):
            return False
        if a.rank > rank:
            return True
        if a.rank < rank or mine == INF:
            return False
        al = a.alloc
        if (
            al.kind != "job"
            or not al.restartable
            or not al.checkpointable
            or self.now - al.started_at < self.quantum.get(al.priority, self.p.min_run_s)
        ):
            return False
        if self.p.time_slice == "las":
            return self.run_level(a) > mine
        return al.expected_end is not None and al.expected_end - self.now > mine

    def known_no_victims(self, pkey: tuple[object, ...], shape: _VShape) -> str | None:
        """None, or the remembered outcome of a failed victim search this shape
        repeats: "" (no victims, for it or any shape at least as large whose
        time-slice key is at least as late) or the cap's words (remembered for the
        same GPUs, duration and key only: a larger request is allowed more).

        The key may only grow: a later key (a higher attained-service queue under
        las, more remaining time under srtf, INF for none) may evict a subset of
        what an earlier one may (``can_evict``), so under srtf, where every
        request has its own key, one failed search answers the requests after it."""
        for f, words in self.no_victims.get(pkey, ()):
            if words:
                # the same GPUs, duration (so the same cap) and key: more vCPUs,
                # memory or nodes find no victims within it either
                if (
                    shape[0] == f[0]
                    and shape[4] == f[4]
                    and shape[5] == f[5]
                    and shape[1] >= f[1]
                    and shape[2] >= f[2]
                    and shape[3] >= f[3]
                ):
                    return words
            elif (
                shape[0] >= f[0]
                and shape[1] >= f[1]
                and shape[2] >= f[2]
                and shape[3] >= f[3]
                and shape[4] >= f[4]
                and shape[5] >= f[5]
            ):
                return ""
        return None

    def lost_work(self, a: AllocState) -> float:
        """GPU-seconds a preemption throws away: the run so far, or none for work
        that saves its progress on the signal (its notice is the time to save)."""
        if a.alloc.checkpointable:
            return 0.0
        return a.milli / WHOLE * max(0.0, self.now - a.alloc.started_at)

    def victim_key(self, a: AllocState) -> tuple[bool, float, float, str]:
        """Spot first, then the least work lost, then the shortest running."""
        al = a.alloc
        return (al.billing != "spot", self.lost_work(a), self.now - al.started_at, al.request_id)

    def fits_with(self, req: PlacementRequest, hs: HostState, gone: Sequence[AllocState]) -> bool:
        """Would ``req`` fit on ``hs`` (ignoring reservations) once ``gone`` stopped?"""
        if not gone:
            return self.fits_now(req, hs)
        whole = hs.whole[:]
        milli = hs.milli[:]
        owner = hs.owner[:]
        vcpus = hs.res.free_vcpus
        mem = hs.res.free_mem
        for a in gone:
            al = a.alloc
            vcpus += al.vcpus
            mem += al.memory_mib
            _release(hs, whole, milli, owner, al.placements)
        return self.fits_counts(req, hs, whole, milli, owner, vcpus, mem)

    def fits_counts(
        self,
        req: PlacementRequest,
        hs: HostState,
        whole: list[bool],
        milli: list[int],
        owner: list[str | None],
        vcpus: int,
        mem: int,
    ) -> bool:
        """Would ``req`` fit on ``hs`` if its GPUs, their share owners and free
        resources were these?"""
        if vcpus < req.vcpus or mem < req.memory_mib:
            return False
        g = req.gpus_per_node
        if g == 0:
            m = req.gpu_milli
            t = req.tenant_id
            return any(
                not whole[i] and WHOLE - milli[i] >= m and share_open(owner[i], t)
                for i in range(hs.total)
            )
        free = [i for i in range(hs.total) if milli[i] == 0 and not whole[i]]
        if len(free) < g:
            return False
        if g > 1 and self.p.topology == "require":
            per: dict[int, int] = {}
            for i in free:
                per[hs.island[i]] = per.get(hs.island[i], 0) + 1
            if not any(c >= g for c in per.values()) and g <= hs.max_island():
                return False
        return True

    def fits_now(self, req: PlacementRequest, hs: HostState) -> bool:
        """``fits_with(req, hs, ())`` read straight off the host's counters."""
        res = hs.res
        if res.free_vcpus < req.vcpus or res.free_mem < req.memory_mib:
            return False
        g = req.gpus_per_node
        if g == 0:
            return hs.fits_share(req.gpu_milli, req.tenant_id)
        if hs.free < g:
            return False
        if g > 1 and self.p.topology == "require":
            for c in hs.island_free.values():
                if c >= g:
                    return True
            return g > hs.max_island()
        return True

    def host_victims(
        self, req: PlacementRequest, hs: HostState, stale: list[HostState] | None = None
    ) -> list[AllocState] | None:
        """The victims on ``hs`` that make ``req`` fit, or None. A host with nothing
        left to preempt for this class goes on ``stale``: the caller drops it from
        the preemptible index once it stopped iterating that index."""
        elig = [a for a in hs.allocs if self.eligible(req, a)]
        if not elig:
            if stale is not None:
                stale.append(hs)
            return None
        if req.gpus_per_node > 0:
            # cheap bound before the exact check
            if hs.free + sum(a.gpu_count for a in elig) < req.gpus_per_node:
                return None
        cap = self.cap
        assert cap is not None
        if not cap.bounded:
            elig.sort(key=self.victim_key)
            return self.greedy(req, hs, elig)
        # bounded blast radius: no victim that alone evicts more than the cap
        within = [a for a in elig if cap.one_ok(a)]
        g = req.gpus_per_node
        if len(within) < len(elig) and (
            not within or (g > 0 and hs.free + sum(a.gpu_count for a in within) < g)
        ):
            if cap.over is None:  # the first host that would need more says why, once
                elig.sort(key=self.victim_key)
                full = self.greedy(req, hs, elig)
                if full is not None:
                    cap.note(full)
            return None
        within.sort(key=self.victim_key)
        chosen = self.greedy(req, hs, within)
        if chosen is not None and not cap.ok(chosen):
            # the least-lost-work set evicts too much: try the smallest victims first
            over = chosen
            chosen = self.greedy(req, hs, sorted(within, key=lambda a: (a.milli, self.victim_key(a))))
            if chosen is None or not cap.ok(chosen):
                cap.note(over)
                return None
        if chosen is None and len(within) < len(elig) and cap.over is None:
            elig.sort(key=self.victim_key)
            full = self.greedy(req, hs, elig)
            if full is not None:
                cap.note(full)  # room only past the cap: the reason says so
        return chosen

    def greedy(
        self, req: PlacementRequest, hs: HostState, elig: Sequence[AllocState]
    ) -> list[AllocState] | None:
        """Take ``elig`` in order until ``req`` fits on ``hs``, then drop the ones
        that turned out unnecessary; None when all of them do not make room."""
        chosen: list[AllocState] = []
        for a in elig:
            chosen.append(a)
            if self.fits_with(req, hs, chosen):
                break
        else:
            return None
        # drop victims that turned out unnecessary (greedy over-picks small ones)
        for a in list(reversed(chosen[:-1])):
            trial = [x for x in chosen if x is not a]
            if self.fits_with(req, hs, trial):
                chosen = trial
        return chosen

    def find_victims(self, req: PlacementRequest, pools: Sequence[Pool]) -> list[AllocState]:
        """The cheapest victims - spot first, then least work lost - on the fewest
        hosts that make ``req`` fit; [] when no set of lower-class work would."""
        if req.nodes > 1 and req.region is None:
            for region in sorted({p.region for p in pools}):
                got = self.victims_in(req, [p for p in pools if p.region == region])
                if got:
                    return got
            return []
        return self.victims_in(req, pools)

    def victims_in(self, req: PlacementRequest, pools: Sequence[Pool]) -> list[AllocState]:
        now = self.now
        options: list[tuple[tuple[int, float, int], str, HostState, list[AllocState]]] = []
        want = max(self.p.preempt_candidates, req.nodes)
        rank = CLASS_RANK.get(req.priority, 1)
        mine = self.slice_of(req)
        stale: list[HostState] = []
        gang = req.nodes > 1
        g = req.gpus_per_node
        rid = req.request_id
        for pool in pools:
            hosts: Iterable[HostState]
            if gang:
                hosts = pool.hosts
            else:
                hosts = self.preemptible_hosts(pool, rank, mine)
            # no copy of the index: hosts found stale are dropped after the loop
            for hs in hosts:
                if hs.reserved_at is not None and hs.reserved_for != rid:
                    continue
                if g > hs.total:
                    continue
                if gang and self.fits_now(req, hs):
                    # a gang may combine free hosts with hosts that need victims
                    options.append(((0, 0.0, 0), hs.host_id, hs, []))
                else:
                    vs = self.host_victims(req, hs, stale)
                    if vs is None:
                        continue
                    cost = (
                        sum(a.alloc.billing != "spot" for a in vs),
                        sum(self.lost_work(a) for a in vs),
                        len(vs),
                    )
                    options.append((cost, hs.host_id, hs, vs))
                if len(options) >= want:
                    break
            else:
                continue
            break
        if self.p.time_slice == "srtf":
            stale = []  # the index is a superset for every remaining time: keep it
        for hs in stale:
            home = hs.pool
            if home is not None:
                index = self.victim_hosts.get((home.region, home.model, rank, mine))
                if index is not None:
                    index.pop(hs, None)
        options.sort(key=lambda o: (o[0], o[1]))
        if len(options) < req.nodes:
            return []
        picked = options[: req.nodes]
        victims: dict[str, AllocState] = {}
        for _c, _h, _hs, vs in picked:
            for a in vs:
                victims.setdefault(a.alloc.request_id, a)
        cap = self.cap
        if victims and gang and cap is not None and not cap.ok(victims.values(), req.nodes):
            cap.note(victims.values())  # host by host within the cap, together over it
            return []
        if victims:
            for _c, _h, hs, _vs in picked:
                self.mark_reserved(hs, now, req.request_id)
        return [victims[k] for k in sorted(victims)]

    def preemptible_hosts(self, pool: Pool, rank: int, mine: float) -> dict[HostState, None]:
        """Hosts of ``pool`` holding work a request of class ``rank`` (and
        time-slice key ``mine``) could preempt, built once per cycle and pruned
        as victims get chosen. Under srtf one index serves every remaining time."""
        # under srtf the index holds every host with work evictable by some key,
        # so it is keyed by that probe, not by the request's own remaining time
        probe = -INF if self.p.time_slice == "srtf" else mine
        key = (pool.region, pool.model, rank, probe)
        hosts = self.victim_hosts.get(key)
        if hosts is None:
            hosts = {}
            for hs in pool.hosts:
                if any(self.can_evict(a, rank, probe) for a in hs.allocs):
                    hosts[hs] = None
            self.victim_hosts[key] = hosts
        return hosts

    def reserve_hosts_of(self, req: PlacementRequest, allocs: Sequence[AllocState]) -> None:
        for a in allocs:
            for p in a.alloc.placements:
                hs = self.fleet.host_slice(p.host_id, req.gpu_model)
                if hs is not None and hs.reserved_at is None:
                    self.mark_reserved(hs, self.now, req.request_id)

    # ------------------------------------------------------------------ backfill

    def earliest_fit(self, req: PlacementRequest, hs: HostState) -> float:
        """When ``req`` could start on ``hs`` if running work ends as expected."""
        if self.fits_now(req, hs):
            return self.now
        # what ends here, and when: the snapshot's work, and the work this plan placed
        ends = [
            Ending(a.end, a.alloc.request_id, a.alloc.vcpus, a.alloc.memory_mib, a.alloc.placements, a.gpu_count)
            for a in hs.allocs
            if a.end < INF
        ]
        ends += hs.placed
        if not ends:
            return INF
        if req.gpus_per_node > 0 and hs.free + sum(e.gpus for e in ends) < req.gpus_per_node:
            return INF
        ends.sort(key=_end_order)
        # release the work in the order it ends until the request fits: one pass
        whole = hs.whole[:]
        milli = hs.milli[:]
        owner = hs.owner[:]
        vcpus = hs.res.free_vcpus
        mem = hs.res.free_mem
        for e in ends:
            vcpus += e.vcpus
            mem += e.memory_mib
            _release(hs, whole, milli, owner, e.placements)
            if self.fits_counts(req, hs, whole, milli, owner, vcpus, mem):
                return max(e.end, self.now)
        return INF

    def reserve(self, req: PlacementRequest, pools: Sequence[Pool]) -> None:
        """EASY backfill: hold the hosts where the blocked head starts earliest.

        Later work may use those hosts only if it ends before the reserved start
        (ReservationFilter). When no start time is known (open-ended work), the
        hosts closest to fitting are held outright so the head cannot starve.
        """
        if req.nodes > 1 and req.region is None:
            regions = sorted({p.region for p in pools})
            pools = [p for p in pools if p.region == regions[0]] if regions else []
        times: list[tuple[float, str, HostState]] = []
        for pool in pools:
            for hs in pool.hosts:
                if hs.reserved_at is not None or req.gpus_per_node > hs.total:
                    continue
                t = self.earliest_fit(req, hs)
                if t < INF:
                    times.append((t, hs.host_id, hs))
        times.sort(key=lambda x: (x[0], x[1]))
        if len(times) >= req.nodes:
            chosen = times[: req.nodes]
            at = max(t for t, _h, _hs in chosen)
            for _t, _h, hs in chosen:
                self.mark_reserved(hs, at, req.request_id)
            self.reservation[req.gpu_model] = at
            return
        # unknown end times: hold the hosts with the most free GPUs outright
        best = sorted(
            (hs for pool in pools for hs in pool.hosts if hs.reserved_at is None),
            key=lambda hs: (-hs.free, -(WHOLE * hs.total - sum(hs.milli)), hs.host_id),
        )[: req.nodes]
        for hs in best:
            self.mark_reserved(hs, self.now, req.request_id)
        self.reservation[req.gpu_model] = self.now

    # ------------------------------------------------------------------ dynamic mode

    def reclaim(self) -> None:
        """Dynamic classes: work whose GPUs all stayed below the utilisation
        threshold for ``reclaim_idle_s`` gets a Preempt with notice - only while
        requests for that GPU model wait, when ``reclaim_under_pressure``."""
        p = self.p
        demand = dict(self.waiting_milli)
        if p.reclaim_under_pressure and not any(v > 0 for v in demand.values()):
            return
        for rid in sorted(self.fleet.allocs):
            a = self.fleet.allocs[rid]
            al = a.alloc
            if a.doomed or p.mode_for(al.priority) != "dynamic":
                continue
            model = self.fleet.model_of(al)
            if p.reclaim_under_pressure and demand.get(model, 0) <= 0:
                continue
            # bounded blast radius: never reclaim more than the cap times what waits
            if p.reclaim_under_pressure and a.milli > p.preempt_cap * demand.get(model, 0):
                continue
            idle_for = INF
            any_gpu = False
            for pl in al.placements:
                for hs in self.fleet.slices.get(pl.host_id, ()):
                    for u in pl.gpus:
                        i = hs.pos.get(u)
                        if i is None:
                            continue
                        any_gpu = True
                        since = hs.idle_since[i]
                        if hs.util[i] >= p.reclaim_idle_util or since is None:
                            idle_for = -INF
                        else:
                            idle_for = min(idle_for, self.now - since)
            if not any_gpu or idle_for < p.reclaim_idle_s:
                continue
            a.doomed = True
            demand[model] = demand.get(model, 0) - a.milli
            self.decisions.append(
                Preempt(
                    rid,
                    None,
                    p.notice_s,
                    f"reclaimed: GPUs below {p.reclaim_idle_util:.0%} utilisation for "
                    f"{idle_for / 3600:.1f} h while others wait; stops in {p.notice_s:g} s",
                )
            )
            self.n["reclaimed"] += 1

    def defragment(self) -> None:
        """Suggest moving restartable single-host whole-GPU work that sits alone on
        a host onto a host that is already partly used, so whole hosts free up for
        large gangs. Capacity on the target is booked; the source is freed only
        when the move is applied."""
        done = 0
        for rid in sorted(self.fleet.allocs):
            if done >= self.p.max_migrations:
                break
            a = self.fleet.allocs[rid]
            al = a.alloc
            if (
                a.doomed
                or not al.restartable
                or al.pinned
                or len(al.placements) != 1
                or al.placements[0].milli != WHOLE
                or self.p.mode_for(al.priority) != "dynamic"
            ):
                continue
            src = al.placements[0]
            model = self.fleet.model_of(al)
            hs = self.fleet.host_slice(src.host_id, model)
            g = len(src.gpus)
            if hs is None or hs.pool is None or len(hs.allocs) != 1 or hs.total - hs.free != g:
                continue
            probe = PlacementRequest(
                request_id=rid,
                tenant_id=al.tenant_id,
                gpu_model=model,
                gpus_per_node=g,
                vcpus=al.vcpus,
                memory_mib=al.memory_mib,
                region=hs.region,
                expected_duration=None if al.expected_end is None else al.expected_end - self.now,
            )
            target = None
            for c in range(g, hs.pool.max_gpus):
                for cand in hs.pool.by_free[c]:
                    if cand is hs or cand.free == cand.total:
                        continue
                    if all(f.filter(probe, cand).ok for f in self.hot):
                        target = cand
                        break
                if target is not None:
                    break
            if target is None:
                continue
            idxs = pick_whole(target, g)
            assert idxs is not None
            target.pool.take_whole(target, idxs)  # type: ignore[union-attr]
            target.res.free_vcpus -= al.vcpus
            target.res.free_mem -= al.memory_mib
            target.scores = None
            a.doomed = True
            self.decisions.append(
                Migrate(
                    rid,
                    al.placements,
                    (HostPlacement(target.host_id, tuple(target.uuids[i] for i in idxs), WHOLE),),
                    f"defragment: frees host {hs.host_id} for larger requests",
                )
            )
            self.n["migrations"] += 1
            done += 1
