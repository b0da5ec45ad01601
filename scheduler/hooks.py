"""How the scheduler tells the apps above it what happened, without importing them.

The scheduler sits below the agents' control plane, billing and the console
(docs/architecture.md, "Layers"). When a workload's hold on hosts changes, or work waits
for a cycle, those layers must react (the fast path drops its cached heartbeat answers and
wakes the hosts; a cycle is queued), but the scheduler may not import them. Instead each
app registers its reaction here in its `AppConfig.ready()`, and the scheduler publishes:

- `holding_changed(workload_ids, hosts)`: inside the transaction, before the allocations
  are released (the fast path reads which hosts they hold, unless the caller knows them:
  `hosts`, else None; it defers its own wake-ups to after commit). Registered by agents.
- `cycle_wanted(region_id)`: after commit. Registered by the scheduler's own tasks module
  (its Celery side), so services need not import the cycle that imports them.
- `queue_confinement(keys)`: asked by the snapshot for the (tenant id, queue) pairs of its
  pending jobs; answers which of them belong to a batch pool, with the pool's name and the
  hosts its members run on. Registered by autoscaling (the pools live there).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from uuid import UUID

from django.db import transaction

_holding_changed: list[Callable[[list[UUID | str], list[UUID | str] | None], None]] = []
_cycle_wanted: list[Callable[[int], None]] = []
#: (tenant id, queue) -> (pool name, host ids of its running members)
Confinement = dict[tuple[str, str], tuple[str, frozenset[str]]]
_queue_confinement: list[Callable[[set[tuple[str, str]]], Confinement]] = []


def on_holding_changed(fn: Callable[[list[UUID | str], list[UUID | str] | None], None]) -> None:
    """Call `fn(workload_ids, hosts)` when workloads start or stop holding GPUs (in the
    transaction); `hosts`: the hosts they hold, when the caller knew them, else None."""
    if fn not in _holding_changed:
        _holding_changed.append(fn)


def on_cycle_wanted(fn: Callable[[int], None]) -> None:
    """Call `fn(region_id)` after commit when a region has work to place or capacity freed."""
    if fn not in _cycle_wanted:
        _cycle_wanted.append(fn)


def holding_changed(workload_ids: Iterable[UUID | str], hosts: Iterable[UUID | str] | None = None) -> None:
    ids = list(workload_ids)
    known = None if hosts is None else list(hosts)
    for fn in _holding_changed:
        fn(ids, known)


def cycle_wanted(region_id: int) -> None:
    for fn in _cycle_wanted:
        transaction.on_commit(lambda fn=fn: fn(region_id))


def on_queue_confinement(fn: Callable[[set[tuple[str, str]]], Confinement]) -> None:
    """Call `fn(keys)` for the (tenant id, queue) pairs of pending jobs; it returns those that
    are confined to a batch pool (Azure Batch's semantics: a pool's jobs run on its members)."""
    if fn not in _queue_confinement:
        _queue_confinement.append(fn)


def queue_confinement(keys: set[tuple[str, str]]) -> Confinement:
    out: Confinement = {}
    if keys:
        for fn in _queue_confinement:
            out.update(fn(keys))
    return out
