"""gpucloud scheduler core: pure Python, no Django, Celery or network.

    plan(snapshot, queue, policy, *, now, cache=None) -> Plan

See docs/scheduler.md.
"""

from __future__ import annotations

from .framework import (
    FILTERS,
    MAX_SCORE,
    OK,
    PLACEMENTS,
    SCORES,
    Code,
    CycleContext,
    Filter,
    PlacementSpec,
    Score,
    Status,
    register_filter,
    register_placement,
    register_score,
)
from .model import (
    CLASS_RANK,
    CLASSES,
    WHOLE,
    Allocation,
    Billing,
    ClusterSnapshot,
    Decision,
    GpuView,
    HostPlacement,
    HostView,
    Kind,
    Migrate,
    Place,
    PlacementRequest,
    Plan,
    PlanCounters,
    Preempt,
    Priority,
    QuotaRule,
    Reject,
    TenantView,
    Wait,
)
from .planner import derive_mix, derive_workload, plan
from .policy import POLICIES, Policy, get_policy, register_policy
from .state import PlanCache

__all__ = [
    "CLASSES",
    "CLASS_RANK",
    "FILTERS",
    "MAX_SCORE",
    "OK",
    "PLACEMENTS",
    "POLICIES",
    "SCORES",
    "WHOLE",
    "Allocation",
    "Billing",
    "ClusterSnapshot",
    "Code",
    "CycleContext",
    "Decision",
    "Filter",
    "GpuView",
    "HostPlacement",
    "HostView",
    "Kind",
    "Migrate",
    "Place",
    "PlacementRequest",
    "PlacementSpec",
    "Plan",
    "PlanCache",
    "PlanCounters",
    "Policy",
    "Preempt",
    "Priority",
    "QuotaRule",
    "Reject",
    "Score",
    "Status",
    "TenantView",
    "Wait",
    "derive_mix",
    "derive_workload",
    "get_policy",
    "plan",
    "register_filter",
    "register_placement",
    "register_policy",
    "register_score",
]
