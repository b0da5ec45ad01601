"""What the layers above the scheduler show on its instance and job resources, without being imported.

An instance's resource (`/api/v1/instances/{id}`, and the jobs') shows what higher layers know
of the workload: its cost (billing), how to connect to it (the gateway), its GPUs' metrics and
its container's log tail (agents). The scheduler's API sits below them (docs/architecture.md,
"Layers") and may not import them: each registers its part here in its `AppConfig.ready()`, as
the lifecycle hooks are registered (scheduler/hooks.py), and the serializers and views ask here.

Each part has one contributor. A resource asked for before its contributor registered is a
wiring error (the app is missing from INSTALLED_APPS), raised at first use.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any, Protocol


class Cost(Protocol):
    hourly: Decimal | None  # what an hour costs now (all nodes); None when no price is in force
    so_far: Decimal


_parts: dict[str, Callable[..., Any]] = {}


def _register(part: str, fn: Callable[..., Any]) -> None:
    _parts[part] = fn  # a second registration (ready() run again) replaces the first


def _part(part: str) -> Callable[..., Any]:
    try:
        return _parts[part]
    except KeyError:
        raise LookupError(f"no installed app contributes the workloads' {part}") from None


def on_costs(*, listed: Callable[..., dict[Any, Cost]], launched: Callable[..., Cost]) -> None:
    """`listed(workloads=)`: each workload's cost by its id, in a fixed number of queries for a
    whole page; `launched(workload=, per_hour=)`: a workload just launched, from the price its
    launch read (no query)."""
    _register("costs", listed)
    _register("launch cost", launched)


def on_connect(fn: Callable[[Any], dict[str, Any]]) -> None:
    """`fn(workload)`: how to reach an instance now (the `connect` object of its resource)."""
    _register("connect hints", fn)


def on_gpu_metrics(fn: Callable[..., dict[str, Any]]) -> None:
    """`fn(workload=, query=)`: its GPUs' metrics for the query string (`.../metrics`); raises
    DRF's ValidationError for a bad query."""
    _register("GPU metrics", fn)


def on_logs(fn: Callable[..., Any]) -> None:
    """`fn(workload=, query=)`: its container's log tail for the query string (`.../logs`): an
    object with `text`, `captured_at` and `pending`."""
    _register("logs", fn)


def costs(*, workloads: Sequence[Any]) -> dict[Any, Cost]:
    return _part("costs")(workloads=workloads)


def launch_cost(*, workload: Any, per_hour: Decimal | None) -> Cost:
    return _part("launch cost")(workload=workload, per_hour=per_hour)


def connect_hints(workload: Any) -> dict[str, Any]:
    return _part("connect hints")(workload)


def gpu_metrics(*, workload: Any, query: dict[str, Any]) -> dict[str, Any]:
    return _part("GPU metrics")(workload=workload, query=query)


def logs(*, workload: Any, query: dict[str, Any]) -> Any:
    return _part("logs")(workload=workload, query=query)
