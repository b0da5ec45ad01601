"""Step scaling from alarms: the `scaling_policy` alarm action (alarms.registry), registered in
`AutoscalingConfig.ready()`. An alarm's action `{"type": "scaling_policy", "policy": "<id>"}`
runs the group's step policy when the alarm goes ALARM (docs/autoscaling.md, docs/alarms.md)."""
from __future__ import annotations

from typing import Any
from uuid import UUID

from alarms.registry import ActionContext, ActionType, register_action
from autoscaling.choices import PolicyKind
from autoscaling.selectors import policy_list
from autoscaling.services import scaling_policy_execute


def _validate(*, tenant: Any, action: dict[str, Any], target: tuple[str, str]) -> dict[str, Any]:
    """The policy must be one of the tenant's step policies (tenant-scoped: another tenant's
    id reads as unknown)."""
    policy = policy_list(tenant=tenant).filter(pk=str(action.get("policy") or "")).first() \
        if _is_uuid(action.get("policy")) else None
    if policy is None:
        raise ValueError("No such scaling policy.")
    if policy.kind != PolicyKind.STEP:
        raise ValueError("Alarms run step scaling policies; target tracking keeps its own metric.")
    return {"type": "scaling_policy", "policy": str(policy.pk)}


def _is_uuid(value: object) -> bool:
    try:
        UUID(str(value))
    except (TypeError, ValueError):
        return False
    return True


def _run(ctx: ActionContext) -> str:
    datapoints = [d.get("value") for d in ctx.payload.get("datapoints") or [] if isinstance(d, dict)]
    latest = next((v for v in reversed(datapoints) if v is not None), None)
    return scaling_policy_execute(
        policy_id=ctx.action["policy"], alarm_state=ctx.payload["state"], reason=ctx.payload.get("reason", ""),
        metric_value=latest, threshold=ctx.payload.get("threshold"), tenant_id=ctx.alarm.tenant_id)


def register() -> None:
    register_action(ActionType("scaling_policy", validate=_validate, run=_run))
