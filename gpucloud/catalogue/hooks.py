"""What the catalogue asks of the apps above it, without importing them (docs/architecture.md).

Quotas live here, the work that uses them in the scheduler. The scheduler registers its
count in `SchedulerConfig.ready()`: `usage(tenant)` answers (GPU milli, workloads), each
keyed by (GPU model code, region code). Nothing registered: nothing is used.

What the fleet could start now is the agents' (the hosts) and the scheduler's (the plan):
agents register `availability(instance_types=, prices=)` in `AgentsConfig.ready()`, and the
instance types' API shows it. Nothing registered: no availability rows.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

Counts = dict[tuple[str, str], int]
_usage: list[Callable[..., tuple[Counts, Counts]]] = []


def on_usage(fn: Callable[..., tuple[Counts, Counts]]) -> None:
    """`fn(tenant=...)` returns what the tenant holds now: (GPU milli, workloads) per scope."""
    if fn not in _usage:
        _usage.append(fn)


def usage(*, tenant: Any) -> tuple[Counts, Counts]:
    gpu_milli: Counts = {}
    instances: Counts = {}
    for fn in _usage:
        g, n = fn(tenant=tenant)
        for k, v in g.items():
            gpu_milli[k] = gpu_milli.get(k, 0) + v
        for k, v in n.items():
            instances[k] = instances.get(k, 0) + v
    return gpu_milli, instances


_availability: list[Callable[..., list[Any]]] = []


def on_availability(fn: Callable[..., list[Any]]) -> None:
    """`fn(instance_types=..., prices=...)` returns availability rows (each with `instance_type`)."""
    if fn not in _availability:
        _availability.append(fn)


def availability(*, instance_types: list[Any], prices: Any) -> list[Any]:
    return [row for fn in _availability for row in fn(instance_types=instance_types, prices=prices)]
