"""Preemption: when nothing fits, make room by giving lower-class work notice
(kube-scheduler's PostFilter, Nomad's preemption).

    may_preempt? ─▶ victims already under notice for it? ─▶ wait for them
        └▶ find_victims: hosts holding work it may evict (preemptible_hosts,
           an index pruned as it goes) ─▶ host_victims per host (greedy, cheapest
           first, within the blast-radius cap) ─▶ the fewest, cheapest hosts
           ─▶ give_notice + the hosts reserved for it

Who may evict whom (``can_evict``): a higher class evicts lower classes whose
mode is dynamic; inside a class, time slicing (las, srtf) evicts checkpointing
batch work that ran its quantum. The cost of a victim set is spot first, then
the work it throws away (``lost_work``), then the number of victims.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import partial

from ..model import CLASS_RANK, WHOLE, PlacementRequest, Preempt
from ..queue import las_level, las_queue, remaining_time
from ..state import INF, AllocState, HostState, Pool
from .backfill import mark_reserved
from .cycle import CycleState, VictimShape
from .fit import fits_now, fits_with


class BlastRadius:
    """The blast radius of one preemption (``Policy.preempt_cap``): the victims may
    hold at most ``multiple`` times what the request needs - GPU-seconds of remaining
    expected work when the request and every victim have estimates, else GPUs.
    ``smallest_refused`` keeps the smallest eviction that would have made room but
    was refused, for the request's wait reason."""

    __slots__ = (
        "multiple",
        "need_milli",
        "need_gpu_s",
        "now",
        "smallest_refused",
        "max_victim_milli",
        "max_victim_gpu_s",
    )

    def __init__(self, req: PlacementRequest, multiple: float, now: float) -> None:
        self.multiple = multiple
        self.need_milli = req.milli_per_node  # per node: victims are chosen host by host
        duration = req.expected_duration
        self.need_gpu_s = None if duration is None else self.need_milli / WHOLE * duration
        self.now = now
        self.smallest_refused: tuple[float, bool] | None = None
        # what one victim may hold at most, in each measure (+ rounding slack)
        self.max_victim_milli = multiple * self.need_milli + 1e-6
        self.max_victim_gpu_s = (
            INF if self.need_gpu_s is None else multiple * self.need_gpu_s * WHOLE + 1e-3
        )

    def allows_alone(self, a: AllocState) -> bool:
        """May ``a`` be a victim at all (alone within the cap)? The hot filter."""
        end = a.alloc.expected_end
        if end is None or self.need_gpu_s is None:
            return a.milli <= self.max_victim_milli
        return a.milli * max(0.0, end - self.now) <= self.max_victim_gpu_s

    @property
    def bounded(self) -> bool:
        return self.multiple != INF

    def cost(self, victims: Iterable[AllocState]) -> tuple[float, bool]:
        """What evicting ``victims`` costs: (GPU-seconds of remaining work, True) or (GPUs, False)."""
        vs = list(victims)
        now = self.now
        if self.need_gpu_s is not None:
            ends = [a.alloc.expected_end for a in vs]
            if None not in ends:
                return (
                    sum(a.milli / WHOLE * max(0.0, e - now) for a, e in zip(vs, ends, strict=True) if e is not None),
                    True,
                )
        return sum(a.milli for a in vs) / WHOLE, False

    def allows(self, victims: Iterable[AllocState], nodes: int = 1) -> bool:
        """Is evicting ``victims`` (for ``nodes`` nodes of the request) within the cap?"""
        if self.multiple == INF:
            return True
        cost, in_seconds = self.cost(victims)
        need = self.need_gpu_s if in_seconds else self.need_milli / WHOLE
        return cost <= self.multiple * nodes * need + 1e-9  # type: ignore[operator]

    def refuse(self, victims: Iterable[AllocState]) -> None:
        """Remember an eviction that would have made room but is over the cap."""
        cost = self.cost(victims)
        if self.smallest_refused is None or cost < self.smallest_refused:
            self.smallest_refused = cost

    def words(self, req: PlacementRequest) -> str:
        """Why preemption did not make room: "" unless the cap refused some."""
        if self.smallest_refused is None:
            return ""
        cost, in_seconds = self.smallest_refused
        if in_seconds:
            need = (self.need_gpu_s or 0.0) * req.nodes / 3600
            return (
                f"preempting for it would evict {cost / 3600:.1f} GPU-hours of remaining work, "
                f"over the cap of {self.multiple:g}x its {need:.1f} GPU-hours"
            )
        need_gpus = self.need_milli * req.nodes / WHOLE
        return (
            f"preempting for it would evict {cost:g} GPUs of running work, "
            f"over the cap of {self.multiple:g}x the {need_gpus:g} GPU{'s' if need_gpus != 1 else ''} "
            f"it asks for"
        )


def may_preempt(cycle: CycleState) -> bool:
    """Does the policy let a request that found no room preempt at all?"""
    policy = cycle.policy
    return policy.preemption and policy.mode != "static"


def victim_words(victims: Sequence[AllocState]) -> str:
    kinds = {a.alloc.kind for a in victims}
    noun = "instance" if kinds == {"instance"} else "job" if kinds == {"job"} else "workload"
    return f"{len(victims)} preempted {noun}{'s' if len(victims) != 1 else ''}"


def time_slice_key(cycle: CycleState, req: PlacementRequest) -> float:
    """The requester's time-slice key: its attained-service queue (las) or its
    expected remaining time (srtf); INF when it may preempt nothing of its class."""
    policy = cycle.policy
    time_slice = policy.time_slice
    if not time_slice:
        return INF
    got = cycle.time_slice_keys.get(req.request_id)
    if got is None:
        if time_slice == "las":
            got = float(las_level(policy, req, cycle.now))
        else:
            got = remaining_time(req)
        cycle.time_slice_keys[req.request_id] = got
    return got


def service_queue(cycle: CycleState, a: AllocState) -> int:
    """The attained-service queue running work is in now."""
    al = a.alloc
    got = cycle.service_queues.get(al.request_id)
    if got is None:
        got = cycle.service_queues[al.request_id] = las_queue(
            attained_now(a, cycle.now), cycle.policy.las_thresholds
        )
    return got


def attained_now(a: AllocState, now: float) -> float:
    """GPU-seconds running work ``a`` has received by ``now``, this run included."""
    al = a.alloc
    return al.attained_service + max(0.0, now - al.started_at) * a.milli / WHOLE


def can_evict(cycle: CycleState, a: AllocState, rank: int, mine: float) -> bool:
    """May a request of class ``rank`` with time-slice key ``mine`` preempt ``a``?

    By class: ``a`` is of a lower class whose mode is dynamic. Inside a class
    (``time_slice``): ``a`` is checkpointing batch work (kind job) that ran at
    least its class's quantum (``slice_quantum``, else ``min_run_s``) and sits
    in a lower attained-service queue (las) or is expected to run longer than
    the request (srtf). Instances are never time-sliced."""
    if a.doomed or not cycle.dynamic.get(a.alloc.priority, False):
        return False
    if a.rank > rank:
        return True
    if a.rank < rank or mine == INF:
        return False
    return slice_key(cycle, a) > mine


def slice_key(cycle: CycleState, a: AllocState) -> float:
    """Running work's side of ``can_evict`` inside its class: a request of the
    same class whose time-slice key is below it may evict ``a``; -INF for work
    that is never time-sliced (yet). Depends on the clock only, so it is
    worked out once per cycle (``CycleState.slice_keys``)."""
    keys = cycle.slice_keys
    got = keys.get(a)
    if got is not None:
        return got
    al = a.alloc
    policy = cycle.policy
    now = cycle.now
    if (
        al.kind != "job"
        or not al.restartable
        or not al.checkpointable
        or now - al.started_at < cycle.slice_quantum.get(al.priority, policy.min_run_s)
    ):
        got = -INF
    elif policy.time_slice == "las":
        # service_queue's rule without its memo: this runs once per work and cycle
        got = float(las_queue(attained_now(a, now), policy.las_thresholds))
    elif al.expected_end is not None:
        got = al.expected_end - now
    else:
        got = -INF
    keys[a] = got
    return got


def evictable(
    cycle: CycleState, allocs: Iterable[AllocState], rank: int, mine: float, first: bool = False
) -> list[AllocState]:
    """The work of ``allocs`` a request of class ``rank`` with time-slice key
    ``mine`` may preempt (``first``: only the first such): ``can_evict`` over a
    host's work, written out (it runs for every host a victim search looks at)."""
    dynamic = cycle.dynamic
    keys = cycle.slice_keys
    out = []
    for a in allocs:
        if a.doomed:
            continue
        ar = a.rank
        if ar < rank or not dynamic.get(a.alloc.priority, False):
            continue
        if ar == rank:
            if mine == INF:
                continue
            k = keys.get(a)
            if k is None:
                k = slice_key(cycle, a)
            if k <= mine:
                continue
        out.append(a)
        if first:
            break
    return out


def known_no_victims(cycle: CycleState, key: tuple[object, ...], shape: VictimShape) -> str | None:
    """None, or the remembered outcome of a failed victim search this shape
    repeats: "" (no victims, for it or any shape at least as large whose
    time-slice key is at least as late) or the cap's words (remembered for the
    same GPUs, duration and key only: a larger request is allowed more).

    The key may only grow: a later key (a higher attained-service queue under
    las, more remaining time under srtf, INF for none) may evict a subset of
    what an earlier one may (``can_evict``), so under srtf, where every
    request has its own key, one failed search answers the requests after it.

    "" is remembered whatever the duration: a search fails with "" only when on
    every host it looked at all the work it may evict would not make room
    (``host_victims`` states the cap's words as soon as some set would), and
    the duration sets only the cap (``BlastRadius``). Under srtf the durations
    of the queue's order are mixed, so a duration in the test would have sent
    most requests after a failure on the same search again."""
    for failed, words in cycle.no_victims.get(key, ()):
        if words:
            # the same GPUs, duration (so the same cap) and key: more vCPUs,
            # memory or nodes find no victims within it either
            if (
                shape[0] == failed[0]
                and shape[4] == failed[4]
                and shape[5] == failed[5]
                and shape[1] >= failed[1]
                and shape[2] >= failed[2]
                and shape[3] >= failed[3]
            ):
                return words
        elif (
            shape[0] >= failed[0]
            and shape[1] >= failed[1]
            and shape[2] >= failed[2]
            and shape[3] >= failed[3]
            and shape[5] >= failed[5]
        ):
            return ""
    return None


def lost_work(now: float, a: AllocState) -> float:
    """GPU-seconds a preemption throws away: the run so far, or none for work
    that saves its progress on the signal (its notice is the time to save)."""
    if a.alloc.checkpointable:
        return 0.0
    return a.milli / WHOLE * max(0.0, now - a.alloc.started_at)


def victim_key(now: float, a: AllocState) -> tuple[bool, float, float, float, str]:
    """Spot first, then the least work lost, then the work expected (by its learned
    duration) to hold its GPUs longest: stopping work about to end frees little
    for long (issue 33); then the shortest running. Without estimates the third
    key is 0.0 for all, the order it always had; work that outran its estimate is
    likely a long one (heavy tail), as in ``learned_service``, and goes first."""
    al = a.alloc
    end = al.estimated_end
    return (
        al.billing != "spot",
        lost_work(now, a),
        0.0 if end is None else (now - end if end > now else -INF),
        now - al.started_at,
        al.request_id,
    )


def host_victims(
    cycle: CycleState,
    req: PlacementRequest,
    hs: HostState,
    cap: BlastRadius,
    stale: list[HostState] | None = None,
) -> list[AllocState] | None:
    """The victims on ``hs`` that make ``req`` fit, or None. A host with nothing
    left to preempt for this class goes on ``stale``: the caller drops it from
    the preemptible index once it stopped iterating that index."""
    rank = CLASS_RANK.get(req.priority, 1)
    mine = time_slice_key(cycle, req)
    elig = evictable(cycle, hs.allocs, rank, mine)
    if not elig:
        if stale is not None:
            stale.append(hs)
        return None
    if req.gpus_per_node > 0:
        # cheap bound before the exact check
        if hs.free + sum(a.gpu_count for a in elig) < req.gpus_per_node:
            return None
    key = partial(victim_key, cycle.now)
    if not cap.bounded:
        elig.sort(key=key)
        return greedy(cycle, req, hs, elig)
    # bounded blast radius: no victim that alone evicts more than the cap
    within = [a for a in elig if cap.allows_alone(a)]
    g = req.gpus_per_node
    if len(within) < len(elig) and (
        not within or (g > 0 and hs.free + sum(a.gpu_count for a in within) < g)
    ):
        if cap.smallest_refused is None:  # the first host that would need more says why, once
            elig.sort(key=key)
            full = greedy(cycle, req, hs, elig)
            if full is not None:
                cap.refuse(full)
        return None
    within.sort(key=key)
    chosen = greedy(cycle, req, hs, within)
    if chosen is not None and not cap.allows(chosen):
        # the least-lost-work set evicts too much: try the smallest victims first
        over = chosen
        chosen = greedy(cycle, req, hs, sorted(within, key=lambda a: (a.milli, key(a))))
        if chosen is None or not cap.allows(chosen):
            cap.refuse(over)
            return None
    if chosen is None and len(within) < len(elig) and cap.smallest_refused is None:
        elig.sort(key=key)
        full = greedy(cycle, req, hs, elig)
        if full is not None:
            cap.refuse(full)  # room only past the cap: the reason says so
    return chosen


def greedy(
    cycle: CycleState, req: PlacementRequest, hs: HostState, elig: Sequence[AllocState]
) -> list[AllocState] | None:
    """Take ``elig`` in order until ``req`` fits on ``hs``, then drop the ones
    that turned out unnecessary; None when all of them do not make room."""
    require_island = cycle.require_island
    chosen: list[AllocState] = []
    for a in elig:
        chosen.append(a)
        if fits_with(req, hs, chosen, require_island):
            break
    else:
        return None
    # drop victims that turned out unnecessary (greedy over-picks small ones)
    for a in list(reversed(chosen[:-1])):
        trial = [x for x in chosen if x is not a]
        if fits_with(req, hs, trial, require_island):
            chosen = trial
    return chosen


def find_victims(
    cycle: CycleState, req: PlacementRequest, pools: Sequence[Pool], cap: BlastRadius
) -> list[AllocState]:
    """The cheapest victims - spot first, then least work lost - on the fewest
    hosts that make ``req`` fit; [] when no set of lower-class work would."""
    if req.nodes > 1 and req.region is None:
        for region in sorted({p.region for p in pools}):
            got = victims_in(cycle, req, [p for p in pools if p.region == region], cap)
            if got:
                return got
        return []
    return victims_in(cycle, req, pools, cap)


def victims_in(
    cycle: CycleState, req: PlacementRequest, pools: Sequence[Pool], cap: BlastRadius
) -> list[AllocState]:
    """``find_victims`` within pools of one region (or of any region for one node);
    the hosts chosen are reserved for ``req``."""
    now = cycle.now
    require_island = cycle.require_island
    options: list[tuple[tuple[int, float, int], str, HostState, list[AllocState]]] = []
    want = max(cycle.policy.preempt_candidates, req.nodes)
    rank = CLASS_RANK.get(req.priority, 1)
    mine = time_slice_key(cycle, req)
    srtf = cycle.policy.time_slice == "srtf"
    # hosts found to hold nothing to evict, dropped from the index after the loop
    # (no copy of it is walked); none under srtf, which walks no index (below)
    stale: list[HostState] | None = None if srtf else []
    gang = req.nodes > 1
    g = req.gpus_per_node
    rid = req.request_id
    for pool in pools:
        hosts: Iterable[HostState]
        if gang or srtf:
            # under srtf the index would keep every host with work some remaining
            # time may evict, for the whole cycle: the pool's hosts, less those that
            # hold no such work, which host_victims passes over as fast. A cycle
            # makes about one search, so the index costs more than it saves
            hosts = pool.hosts
        else:
            hosts = preemptible_hosts(cycle, pool, rank, mine)
        for hs in hosts:
            if hs.reserved_at is not None and hs.reserved_for != rid:
                continue
            if g > hs.total:
                continue
            if gang and fits_now(req, hs, require_island):
                # a gang may combine free hosts with hosts that need victims
                options.append(((0, 0.0, 0), hs.host_id, hs, []))
            elif g > 0 and hs.free + hs.alloc_gpus < g:
                # host_victims' cheap bound before its walk: evicting all the work
                # here would not free enough (the host stays in the index)
                continue
            else:
                vs = host_victims(cycle, req, hs, cap, stale)
                if vs is None:
                    continue
                cost = (
                    sum(a.alloc.billing != "spot" for a in vs),
                    sum(lost_work(now, a) for a in vs),
                    len(vs),
                )
                options.append((cost, hs.host_id, hs, vs))
            if len(options) >= want:
                break
        else:
            continue
        break
    for hs in stale or ():
        home = hs.pool
        if home is not None:
            index = cycle.victim_hosts.get((home.region, home.model, rank, mine))
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
    if victims and gang and not cap.allows(victims.values(), req.nodes):
        cap.refuse(victims.values())  # host by host within the cap, together over it
        return []
    if victims:
        for _c, _h, hs, _vs in picked:
            mark_reserved(cycle, hs, now, req.request_id)
    return [victims[k] for k in sorted(victims)]


def preemptible_hosts(cycle: CycleState, pool: Pool, rank: int, mine: float) -> dict[HostState, None]:
    """Hosts of ``pool`` holding work a request of class ``rank`` (and
    time-slice key ``mine``) could preempt, built once per cycle and pruned
    as victims get chosen. Not under srtf (``victims_in``): every request has a
    key of its own there."""
    key = (pool.region, pool.model, rank, mine)
    hosts = cycle.victim_hosts.get(key)
    if hosts is None:
        hosts = {}
        for hs in pool.hosts:
            if evictable(cycle, hs.allocs, rank, mine, first=True):
                hosts[hs] = None
        cycle.victim_hosts[key] = hosts
    return hosts


def reserve_hosts_of(cycle: CycleState, req: PlacementRequest, allocs: Sequence[AllocState]) -> None:
    """Hold for ``req`` the hosts its victims under notice will free."""
    for a in allocs:
        for p in a.alloc.placements:
            hs = cycle.fleet.host_slice(p.host_id, req.gpu_model)
            if hs is not None and hs.reserved_at is None:
                mark_reserved(cycle, hs, cycle.now, req.request_id)


def give_notice(cycle: CycleState, req: PlacementRequest, victims: Sequence[AllocState]) -> None:
    """Give ``victims`` notice to make room for ``req`` (which then waits for them)."""
    notice_s = cycle.policy.notice_s
    for a in victims:
        a.doomed = True
        # a checkpointing victim gets its declared grace to save its progress
        notice = max(notice_s, a.alloc.grace_s)
        cycle.decisions.append(
            Preempt(
                a.alloc.request_id,
                req.request_id,
                notice,
                f"preempted to make room for {req.priority}-class work",
            )
        )
        cycle.counts["preempted"] += 1
