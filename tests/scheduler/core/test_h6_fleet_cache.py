"""A fleet a PlanCache brings up to date between cycles is the fleet a fresh build
gives: same slices, pools, index buckets in the same (host id) order, and the
same fleet figures, over random sequences of hosts that come, leave, change, and
cycles that booked capacity, reserved hosts and doomed work."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from scheduler.core.model import (
    WHOLE,
    Allocation,
    ClusterSnapshot,
    GpuView,
    HostPlacement,
    HostView,
    Place,
)
from scheduler.core.state import Fleet, HostState, PlanCache, Pool

NOW = 1000.0
MODELS = ("A100", "H100")
REGIONS = ("eu", "us")
TENANTS = ("t1", "t2", None)


def make_view(rng: random.Random, hid: str) -> HostView:
    n = rng.choice((1, 2, 4, 8))
    two_models = rng.random() < 0.2
    gpus = []
    for i in range(n):
        used = 0
        whole = False
        roll = rng.random()
        if roll < 0.3:
            whole = True
        elif roll < 0.5:
            used = rng.choice((125, 250, 500, 750, 999))
        gpus.append(
            GpuView(
                uuid=f"{hid}-g{i}",
                index=i,
                model=MODELS[i % 2] if two_models else MODELS[int(hid[1:]) % 2],
                nvlink_island=i // 4,
                whole=whole,
                used_milli=used,
                share_tenant=rng.choice(TENANTS) if used else None,
                cross_tenant=used > 0 and rng.random() < 0.3,
            )
        )
    if rng.random() < 0.3:
        rng.shuffle(gpus)  # agents may list GPUs in any order
    vcpus = rng.choice((32, 64, 128))
    return HostView(
        host_id=hid,
        region=rng.choice(REGIONS),
        ready=rng.random() < 0.85,
        gpus=tuple(gpus),
        free_vcpus=rng.randrange(vcpus + 1),
        free_memory_mib=rng.randrange(1 << 16),
        total_vcpus=vcpus,
        total_memory_mib=rng.choice((0, 1 << 16, 1 << 17)),
    )


def make_allocs(rng: random.Random, views: dict[str, HostView]) -> list[Allocation]:
    out = []
    ids = sorted(views)
    for k in range(rng.randrange(12)):
        if not ids:
            break
        chosen = rng.sample(ids, min(len(ids), rng.choice((1, 1, 1, 2))))
        placements = []
        for hid in chosen:
            gpus = views[hid].gpus
            if gpus:
                g = rng.choice(gpus)
                placements.append(HostPlacement(hid, (g.uuid,), WHOLE))
        if not placements:
            continue
        preempting = rng.random() < 0.1
        out.append(
            Allocation(
                request_id=f"a{k}",
                tenant_id=rng.choice(("t1", "t2")),
                placements=tuple(placements),
                expected_end=rng.choice((None, NOW + 50)),
                preempting=preempting,
                stop_by=NOW + 5 if preempting else None,
            )
        )
    return out


def book(rng: random.Random, fleet: Fleet) -> list[Place]:
    """What a cycle does to the fleet it planned on: bookings, reservations, victims."""
    places: list[Place] = []
    slices = [hs for sl in fleet.slices.values() for hs in sl if hs.pool is not None]
    for hs in rng.sample(slices, min(len(slices), rng.randrange(4))):
        pool = hs.pool
        assert pool is not None
        free = [i for i in range(hs.total) if not hs.whole[i] and hs.milli[i] == 0]
        shared = [
            i
            for i in range(hs.total)
            if not hs.whole[i] and 0 < hs.milli[i] <= WHOLE - 125 and hs.owner[i] in (None, "t1")
        ]
        if shared and rng.random() < 0.5:
            pool.take_share(hs, rng.choice(shared), 125, "t1")
        elif free:
            pool.take_whole(hs, free[: rng.randrange(1, len(free) + 1)])
        elif free or shared:
            continue
        places.append(Place(f"p-{hs.host_id}", (HostPlacement(hs.host_id, (), 0),)))
    for hs in rng.sample(slices, min(len(slices), rng.randrange(2))):
        # work without GPUs: takes vCPUs and memory, books no GPU
        hs.res.free_vcpus -= 1
        hs.res.free_mem -= 1
        places.append(Place(f"cpu-{hs.host_id}", (HostPlacement(hs.host_id, (), 0),)))
    for hs in rng.sample(slices, min(len(slices), rng.randrange(3))):
        hs.reserved_at = NOW + 10
        hs.reserved_for = "head"
    for st in fleet.allocs.values():
        if rng.random() < 0.2:
            st.doomed = True
            st.end = NOW
    return places


def bucket_ids(bucket: dict[HostState, None]) -> list[str]:
    return [hs.host_id for hs in bucket]


def pool_picture(pool: Pool) -> object:
    shared = {
        owner: [[(hs.host_id, i) for hs, i in b] for b in buckets]
        for owner, buckets in pool.shared.items()
        if any(buckets)
    }
    return (
        pool.region,
        pool.model,
        pool.max_gpus,
        [hs.host_id for hs in pool.hosts],
        [bucket_ids(b) for b in pool.by_free],
        shared,
        dict(pool.sizes),
    )


def slice_picture(hs: HostState) -> object:
    res = hs.res
    return (
        hs.host_id,
        hs.region,
        hs.model,
        hs.ready,
        hs.uuids,
        hs.island,
        hs.whole,
        hs.milli,
        hs.owner,
        hs.open,
        hs.free,
        hs.island_free,
        (res.free_vcpus, res.free_mem, res.total_vcpus, res.total_mem),
        [st.alloc.request_id for st in hs.allocs],
        hs.placed,
        hs.reserved_at,
        hs.reserved_for,
        None if hs.pool is None else (hs.pool.region, hs.pool.model),
    )


def picture(fleet: Fleet) -> dict[str, object]:
    return {
        "slices": {hid: [slice_picture(hs) for hs in sl] for hid, sl in fleet.slices.items()},
        "pools": {key: pool_picture(pool) for key, pool in fleet.pools.items()},
        "pools_by_model": {
            m: [(p.region, p.model) for p in pools] for m, pools in fleet.pools_by_model.items()
        },
        "max_gpus": fleet.max_gpus,
        "max": (fleet.max_vcpus, fleet.max_mem),
        "cap": (fleet.cap_milli, fleet.cap_vcpus, fleet.cap_mem),
        "allocs": {
            rid: (st.doomed, st.end, st.gpu_count, st.milli) for rid, st in fleet.allocs.items()
        },
        "hosts_with": [
            fleet.hosts_with(m, r, c) for m in MODELS for r in (*REGIONS, None) for c in (1, 3, 8)
        ],
    }


@pytest.mark.parametrize("seed", range(40))
def test_an_updated_fleet_is_the_fleet_a_fresh_build_gives(seed: int) -> None:
    rng = random.Random(seed)
    views = {f"h{i:02d}": make_view(rng, f"h{i:02d}") for i in rng.sample(range(40), 12)}
    allocs = make_allocs(rng, views)
    cache = PlanCache()
    updated = 0
    for _step in range(30):
        hosts = list(views.values())
        if rng.random() < 0.5:
            rng.shuffle(hosts)
        snapshot = ClusterSnapshot(hosts=tuple(hosts), allocations=tuple(allocs))
        updating = cache.fleet is not None
        seen = cache.hits + cache.misses
        fleet = Fleet(snapshot, NOW, cache)
        assert picture(fleet) == picture(Fleet(snapshot, NOW))
        assert cache.hits + cache.misses == seen + len(hosts)  # each host reused or built
        updated += updating
        places = book(rng, fleet)
        cache.keep(fleet, places, reserved=True)
        # the next snapshot: some hosts change (booked ones mostly), leave or come
        # back (their old view object: the cache's state for it is reused), new ones
        for hid in sorted(views):
            roll = rng.random()
            if roll < 0.1:
                del views[hid]
            elif roll < 0.25 or (hid in fleet.touched and roll < 0.6):
                views[hid] = make_view(rng, hid)
        for _ in range(rng.randrange(4)):
            hid = f"h{rng.randrange(40):02d}"
            if hid not in views:
                old = cache.hosts.get(hid)
                views[hid] = old[0] if old is not None and rng.random() < 0.5 else make_view(rng, hid)
        # running work: all new, or most of it stays (the same objects), some ends,
        # some starts anywhere in the order, some changes; rarely the order changes
        roll = rng.random()
        if roll < 0.15:
            allocs = make_allocs(rng, views)
        else:
            allocs = [
                a
                for a in allocs
                if all(p.host_id in views for p in a.placements) and rng.random() < 0.9
            ]
            allocs = [replace(a, preempting=False) if rng.random() < 0.05 else a for a in allocs]
            for a in make_allocs(rng, views)[: rng.randrange(4)]:
                allocs.insert(rng.randrange(len(allocs) + 1), replace(a, request_id=f"n{_step}-{a.request_id}"))
            if roll > 0.9:
                rng.shuffle(allocs)
    assert updated == 29  # every step after the first took over the last fleet


def test_a_cache_after_a_failed_or_foreign_cycle_builds_afresh() -> None:
    rng = random.Random(7)
    views = [make_view(rng, f"h{i:02d}") for i in range(6)]
    cache = PlanCache()
    fleet = Fleet(ClusterSnapshot(hosts=tuple(views)), NOW, cache)
    cache.keep(fleet, (), reserved=False)
    cache.clear()  # what plan() does when a cycle raised
    assert cache.fleet is None
    # two views of one host: built as given, and not kept for an update
    twice = ClusterSnapshot(hosts=(*views, replace(views[0], free_vcpus=1)))
    fleet = Fleet(twice, NOW, cache)
    assert picture(fleet) == picture(Fleet(twice, NOW))
    cache.keep(fleet, (), reserved=False)
    assert cache.fleet is None
