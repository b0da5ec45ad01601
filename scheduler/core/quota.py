"""Admission by quota: per tenant, optionally narrowed to a GPU model and/or region.

Usage starts from the snapshot (running allocations, or the rule's explicit
``used_*`` numbers) and grows with every placement of the cycle, so a burst of
requests can never take a tenant past its limit within one plan.
"""

from __future__ import annotations

from dataclasses import dataclass

from .blockers import Blocker, quota_exceeded, quota_full, words
from .model import WHOLE, ClusterSnapshot, PlacementRequest, QuotaRule
from .state import Fleet

# The quota rules, written once: the planner (below), the apply's re-check under the
# tenants' locks (scheduler/apply.py), the launch service's refusal (scheduler/services.py)
# and the snapshot's usage counts (scheduler/snapshot.py).


def quota_applies(rule: QuotaRule, gpu_model: str | None, region: str | None) -> bool:
    """Whether ``rule`` counts work of ``gpu_model`` in ``region`` (a rule narrowed to a
    region does not apply where the region is not known yet: ``region`` None)."""
    return (rule.gpu_model is None or rule.gpu_model == gpu_model) and (
        rule.region is None or rule.region == region
    )


def quota_fits_gpus(rule: QuotaRule, used_milli: int, need_milli: int) -> bool:
    """Whether ``need_milli`` more GPU (thousandths) fit beside the ``used_milli`` the rule counts."""
    return rule.max_gpus is None or used_milli + need_milli <= rule.max_gpus * WHOLE


def quota_fits_instances(rule: QuotaRule, used_instances: int) -> bool:
    """Whether one more workload fits beside the ``used_instances`` the rule counts."""
    return rule.max_instances is None or used_instances + 1 <= rule.max_instances


def quota_fits(rule: QuotaRule, used_milli: int, used_instances: int, need_milli: int) -> bool:
    """Whether one more workload of ``need_milli`` fits beside what the rule counts now."""
    return quota_fits_gpus(rule, used_milli, need_milli) and quota_fits_instances(rule, used_instances)


def quota_never_fits_gpus(rule: QuotaRule, need_milli: int) -> bool:
    """More GPUs than the rule allows at all: no amount of waiting admits it."""
    return rule.max_gpus is not None and need_milli > rule.max_gpus * WHOLE


def quota_never_fits_instances(rule: QuotaRule) -> bool:
    """The rule allows no workload at all."""
    return rule.max_instances is not None and rule.max_instances < 1


def quota_blocker(rule: QuotaRule, used_milli: int, used_instances: int, need_milli: int) -> Blocker | None:
    """Why ``rule`` keeps a workload of ``need_milli`` out (None when it admits it), beside the
    ``used_*`` it counts now: refused when it could never fit, else waiting for quota."""
    model, region = rule.gpu_model, rule.region
    if quota_never_fits_gpus(rule, need_milli):
        assert rule.max_gpus is not None
        return quota_exceeded(need_milli=need_milli, limit=rule.max_gpus, gpu_model=model, region=region)
    if not quota_fits_gpus(rule, used_milli, need_milli):
        assert rule.max_gpus is not None
        return quota_full(used=used_milli, need=need_milli, limit=rule.max_gpus, unit="gpus", gpu_model=model,
                          region=region)
    if quota_never_fits_instances(rule):
        return quota_exceeded(need_milli=need_milli, limit=0, unit="instances", gpu_model=model, region=region)
    if not quota_fits_instances(rule, used_instances):
        assert rule.max_instances is not None
        return quota_full(used=used_instances, need=1, limit=rule.max_instances, unit="instances", gpu_model=model,
                          region=region)
    return None


@dataclass(slots=True)
class _Rule:
    rule: QuotaRule
    used_milli: int
    used_instances: int

    def applies(self, req: PlacementRequest, region: str | None) -> bool:
        return quota_applies(self.rule, req.gpu_model, region)


class QuotaBook:
    def __init__(self, fleet: Fleet, snapshot: ClusterSnapshot) -> None:
        self.rules: dict[str, list[_Rule]] = {}
        for t in snapshot.tenants:
            if t.quotas:
                self.rules[t.tenant_id] = [_Rule(q, 0, 0) for q in t.quotas]
        if not self.rules:
            return
        for st in fleet.allocs.values():
            a = st.alloc
            rules = self.rules.get(a.tenant_id)
            if not rules:
                continue
            model = fleet.model_of(a)
            region = fleet.region_of(a)
            milli = sum(len(p.gpus) * p.milli for p in a.placements)
            for r in rules:
                if quota_applies(r.rule, model, region):
                    r.used_milli += milli
                    r.used_instances += 1
        for rules in self.rules.values():
            for r in rules:
                if r.rule.used_gpu_milli is not None:
                    r.used_milli = r.rule.used_gpu_milli
                if r.rule.used_instances is not None:
                    r.used_instances = r.rule.used_instances

    def has_rules(self, tenant: str) -> bool:
        return tenant in self.rules

    def check(self, req: PlacementRequest, region: str | None) -> tuple[bool, str] | None:
        """None when admitted in ``region``; else (reject?, reason).

        With ``region`` None only rules not narrowed to a region are checked; the
        planner checks region-narrowed rules per candidate region.
        """
        rules = self.rules.get(req.tenant_id)
        if not rules:
            return None
        need = req.total_milli
        for r in rules:
            if not r.applies(req, region):
                continue
            blocker = quota_blocker(r.rule, r.used_milli, r.used_instances, need)
            if blocker is not None:
                return blocker.refused, words(blocker)
        return None

    def charge(self, req: PlacementRequest, region: str) -> None:
        for r in self.rules.get(req.tenant_id, ()):
            if r.applies(req, region):
                r.used_milli += req.total_milli
                r.used_instances += 1
