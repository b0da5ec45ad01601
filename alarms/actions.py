"""The built-in alarm actions (alarms/registry.py): e-mail, signed webhook, stop the workload.

* `{"type": "email"}`: to the tenant's owners and admins; `"to": [...]` narrows it to some of the
  tenant's members (never an address outside the tenant: an alarm is no mail relay).
* `{"type": "webhook", "url": "https://..."}`: the state change as JSON, signed like every gpucloud
  webhook (`X-Gpucloud-Signature: t=<unix>,v1=HMAC-SHA256(secret, "<t>." + body)`, billing/notify.py)
  with the alarm's own secret, shown once when the alarm is created. Through the SSRF guard
  (gpucloud/lib/outbound.py) at save and at every attempt; a 5xx, timeout or refused connection is
  retried with backoff, a refused URL is not.
* `{"type": "stop_workload"}`: stops the alarm's own workload (workload targets only) through the
  ordinary stop (billing ends, the agent stops the container), with the alarm in the reason.
"""
from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.mail import send_mail
from django.core.validators import validate_email

from alarms.evaluate import period_words
from alarms.registry import ActionContext, ActionRetry, ActionType, register_action
from billing.notify import DeliveryError, tenant_admin_emails, webhook_post
from gpucloud.lib.outbound import OutboundError, OutboundRefused, outbound_check
from gpucloud.lib.secretbox import open_sealed
from gpucloud.tenancy.models import Membership, Tenant
from scheduler.selectors import workload_get
from scheduler.services import workload_stop

EVENT = "alarm.state_change"


def _email_validate(*, tenant: Tenant, action: dict[str, Any], target: tuple[str, str]) -> dict[str, Any]:
    to = action.get("to")
    if to is None:
        return {"type": "email"}
    if not isinstance(to, list) or not to or len(to) > 20 or not all(isinstance(a, str) for a in to):
        raise ValueError("`to` is a list of 1 to 20 e-mail addresses of the tenant's members.")
    members = {e.lower() for e in Membership.objects.filter(tenant=tenant).values_list("user__email", flat=True)}
    for address in to:
        try:
            validate_email(address)
        except ValidationError:
            raise ValueError(f"{address!r} is not an e-mail address.") from None
        if address.lower() not in members:
            raise ValueError(f"{address} is not a member of this tenant: alarms mail only the tenant's members.")
    return {"type": "email", "to": sorted({a.lower() for a in to})}


def _email_run(ctx: ActionContext) -> str:
    p = ctx.payload
    to = ctx.action.get("to") or tenant_admin_emails(tenant=ctx.alarm.tenant)
    if not to:
        return "nobody to mail"
    subject = f'{p["state"]}: alarm "{p["name"]}" in {ctx.alarm.tenant.name}'
    body = (f'Alarm "{p["name"]}" went from {p["previous_state"]} to {p["state"]} at {p["time"]}.\n\n'
            f'{p["reason"]}\n\nMetric: {p["metric"]} ({p["statistic"]} over {period_words(p["period"])}) of '
            f'{p["target"].get("name") or p["target"]["kind"]}'
            f'{" (id " + p["target"]["id"] + ")" if p["target"]["id"] else ""}.\n')
    send_mail(subject, body, settings.DEFAULT_FROM_EMAIL, to)
    return f"mailed {len(to)}"


def _webhook_validate(*, tenant: Tenant, action: dict[str, Any], target: tuple[str, str]) -> dict[str, Any]:
    url = action.get("url")
    if not isinstance(url, str) or not url or len(url) > 500:
        raise ValueError("A webhook action needs a `url` (https, at most 500 characters).")
    try:
        outbound_check(url)
    except (OutboundRefused, OutboundError) as exc:
        raise ValueError(str(exc)) from None
    return {"type": "webhook", "url": url}


def _webhook_run(ctx: ActionContext) -> str:
    secret = open_sealed(ctx.alarm.webhook_secret_sealed)
    try:
        webhook_post(url=ctx.action["url"], secret=secret, payload=ctx.payload,
                     headers={"X-Gpucloud-Event": EVENT, "X-Gpucloud-Delivery": str(ctx.run_id)})
    except DeliveryError as exc:
        raise ActionRetry(str(exc)) from exc
    return "delivered"  # OutboundRefused propagates: the URL may no longer be called, no retry


def _stop_validate(*, tenant: Tenant, action: dict[str, Any], target: tuple[str, str]) -> dict[str, Any]:
    if target[0] != "workload":
        raise ValueError("stop_workload stops the alarm's own workload: the alarm must watch a workload.")
    return {"type": "stop_workload"}


def _stop_run(ctx: ActionContext) -> str:
    workload = workload_get(tenant=ctx.alarm.tenant, pk=ctx.alarm.target_id)
    done = workload_stop(workload=workload, reason=f'alarm "{ctx.alarm.name}" went {ctx.payload["state"]}')
    return f"{done.kind} {done.state}"


def register_builtin() -> None:
    register_action(ActionType("email", validate=_email_validate, run=_email_run))
    register_action(ActionType("webhook", validate=_webhook_validate, run=_webhook_run))
    register_action(ActionType("stop_workload", validate=_stop_validate, run=_stop_run))
