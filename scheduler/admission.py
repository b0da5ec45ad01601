"""Can this launch start now, and if not, why: the facts for the one rule (`scheduler.core.blockers`).

    launch_admission(tenant, type, region[, available_now]) ─▶ Blocker | None
        facts: billing's verdict (pushed down onto the tenant row: `Tenant.launch_blocked_*`)
               the tenant's quota rules beside what it holds now (one query)
               whether the region's fleet could ever run it (`feasibility`, one query)
               what the scheduler would start now (`available_now`, given by callers that
               have it: the console counts it with `agents.selectors.availability`)
        rule:  `blockers.admission`

    launch_admit(...)  the launch services' entrance (launch, job arrays, start again): raises
                       the refusals as the API's 4xx, returns the words of a waiting cause (the
                       new workload's first `reason`) or "".

The console's box (`frontend.views`), the API's error and the workload's reason all come from
here and print `blockers.words`; the scheduler core's own `Wait` reasons for budget, quota and
capacity use the same blockers (`core.quota.quota_blocker`, `TenantView.blocker`).
"""
from __future__ import annotations

import functools

from django.conf import settings
from django.db import connection

from gpucloud.catalogue.models import GpuModel, InstanceType, Quota, Region
from gpucloud.lib.errors import Conflict, InvalidInput, PaymentRequired, ServiceError
from gpucloud.tenancy.models import Tenant
from scheduler.choices import HOLDING
from scheduler.core import blockers
from scheduler.core.blockers import Blocker
from scheduler.core.model import QuotaRule
from scheduler.core.quota import quota_applies, quota_blocker
from scheduler.feasibility import launch_unsatisfiable
from scheduler.models import Workload


def launch_admission(*, tenant: Tenant, instance_type: InstanceType, region: Region, nodes: int = 1,
                     available_now: int | None = None, tenant_fresh: bool = False) -> Blocker | None:
    """Why `nodes` nodes of `instance_type` in `region` cannot start now for `tenant` (None: nothing
    stands in the way). `tenant_fresh`: `tenant` was read moments ago (by the request's
    authentication), so billing's flag on it is as fresh as a read here would be."""
    return blockers.admission(
        billing=billing_blocker(tenant=tenant, fresh=tenant_fresh),
        quota=quota_blocker_for(tenant=tenant, instance_type=instance_type, region=region, nodes=nodes),
        never=_never(instance_type, region, nodes),
        available_now=available_now,
        capacity=blockers.no_capacity(
            region=region.code, gpu_model=instance_type.gpu_model.code,
            gpus=instance_type.gpu_count if instance_type.gpu_share_milli >= 1000 else 0,
            share_milli=instance_type.gpu_share_milli, nodes=nodes),
    )


def launch_admit(*, tenant: Tenant, instance_type: InstanceType, region: Region, nodes: int = 1,
                 tenant_fresh: bool = False) -> str:
    """Refuse what cannot be admitted (the error of `admission_error`); return the words of a
    cause it will wait for (its first waiting reason), or "" when the scheduler decides."""
    blocker = launch_admission(tenant=tenant, instance_type=instance_type, region=region, nodes=nodes,
                               tenant_fresh=tenant_fresh)
    if blocker is None:
        return ""
    if blocker.refused:
        raise admission_error(blocker)
    return blockers.words(blocker)


def admission_error(blocker: Blocker) -> ServiceError:
    """The API's error for a refusal: its code is the cause's, its message the words."""
    message = blockers.words(blocker)
    if blocker.status == 402:
        return PaymentRequired(message, code=blocker.code)
    if blocker.code == blockers.UNSATISFIABLE:
        p = blocker.params
        return Conflict(message, code=blocker.code,
                        fields={"instance_type": [f"Cannot run in {p['region']}: {p['why']}."]})
    return InvalidInput(message, code=blocker.code, fields={"instance_type": [message]})


def billing_blocker(*, tenant: Tenant, fresh: bool = False) -> Blocker | None:
    """Billing's verdict on new launches, pushed down onto the tenant row (billing.accounts)."""
    if fresh:
        blocked, why, budget = tenant.launch_blocked, tenant.launch_blocked_reason, tenant.launch_blocked_budget
    else:
        blocked, why, budget = Tenant.objects.filter(pk=tenant.pk).values_list(
            "launch_blocked", "launch_blocked_reason", "launch_blocked_budget").get()
    return blockers.billing_blocker(blocked=blocked, code=why, budget=budget)


def quota_blocker_for(*, tenant: Tenant, instance_type: InstanceType, region: Region, nodes: int = 1) -> Blocker | None:
    """The first quota rule of the tenant that keeps this launch out (refused when it could never
    fit, else waiting), beside what the tenant holds now. One query: the rules and the usage.

    The rules as the scheduler reads them (snapshot.tenant_views): the tenant's rows, and its
    plan's default where it has no tenant-wide row; which work a rule counts is the core's."""
    need = instance_type.gpu_milli_total * nodes
    model, where = instance_type.gpu_model.code, region.code
    rules: list[QuotaRule] = []
    usage: list[tuple[str, str, int, int]] = []
    with connection.cursor() as cur:  # the ORM's query cost more CPU to build than to run
        pk = Tenant._meta.pk.get_db_prep_value(tenant.pk, connection)
        cur.execute(_quota_facts_sql(), [pk, pk, *HOLDING])
        for row, gpu_model, quota_region, a, b in cur.fetchall():
            if row == "q":
                rules.append(QuotaRule(max_gpus=a, max_instances=b, gpu_model=gpu_model, region=quota_region))
            else:
                usage.append((gpu_model, quota_region, int(a or 0), int(b or 0)))
    if not any(r.gpu_model is None and r.region is None for r in rules):
        plan = settings.PLAN_QUOTAS.get(tenant.plan, {})
        rules.append(QuotaRule(max_gpus=plan.get("max_gpus"), max_instances=plan.get("max_instances")))
    found = []
    for rule in rules:
        if not quota_applies(rule, model, where):
            continue
        counted = [(m, n) for gm, r, m, n in usage if quota_applies(rule, gm, r)]
        blocker = quota_blocker(rule, sum(m for m, _ in counted), sum(n for _, n in counted), need)
        if blocker is not None:
            found.append(blocker)
    # a rule it can never fit outranks one that is full now: waiting would not help
    return next((b for b in found if b.refused), found[0] if found else None)


def _never(instance_type: InstanceType, region: Region, nodes: int) -> Blocker | None:
    why = launch_unsatisfiable(instance_type=instance_type, region=region, nodes=nodes)
    return blockers.unsatisfiable(instance_type=instance_type.code, region=region.code, why=why) if why else None


@functools.cache
def _quota_facts_sql() -> str:
    """A tenant's quota rows ('q', GPU model code or NULL, region code or NULL, max GPUs, max
    instances), then what it holds now ('u', model, region, GPU milli, workloads)."""
    q, gm, r = (m._meta.db_table for m in (Quota, GpuModel, Region))
    w, it = Workload._meta.db_table, InstanceType._meta.db_table
    states = ", ".join(["%s"] * len(HOLDING))
    return (f'SELECT \'q\', gm."code", r."code", q."max_gpus", q."max_instances" FROM "{q}" q '
            f'LEFT JOIN "{gm}" gm ON gm."id" = q."gpu_model_id" LEFT JOIN "{r}" r ON r."id" = q."region_id" '
            f'WHERE q."tenant_id" = %s '
            f'UNION ALL '
            f'SELECT \'u\', gm."code", r."code", SUM(it."gpu_count" * it."gpu_share_milli" * w."nodes"), COUNT(*) '
            f'FROM "{w}" w JOIN "{it}" it ON it."id" = w."instance_type_id" '
            f'JOIN "{gm}" gm ON gm."id" = it."gpu_model_id" JOIN "{r}" r ON r."id" = w."region_id" '
            f'WHERE w."tenant_id" = %s AND w."state" IN ({states}) GROUP BY gm."code", r."code"')

