"""Alarm writes: create/update/delete, the evaluator, and the action runner.

Evaluation (`alarms_evaluate_due`, the beat's `alarms_tick_task`): every alarm whose
`next_eval_at` has come is taken under its row lock (`SELECT ... FOR UPDATE SKIP LOCKED`, re-checking
that it is still due), evaluated over its last `evaluation_periods` whole periods (those that ended
at least ALARM_EVAL_DELAY_S ago, so that their samples have arrived), and moved on to the next
period, all in one transaction. A second evaluator skips the locked row and, once it is committed,
finds it no longer due: each alarm is evaluated once per period however many workers tick, and an
evaluator that dies mid-way rolls back, leaving the period to the next tick.

A state change writes an `AlarmHistory` row and one `AlarmAction` row per configured action in the
same transaction; the actions run after commit (`alarm_action_task`), outside any transaction, by
alarms/runner.py (below this module, so that it is queued with a plain import).
"""
from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from alarms import evaluate as rules
from alarms import selectors
from alarms.choices import ACTION_KEYS, AlarmState
from alarms.models import Alarm, AlarmAction, AlarmHistory
from alarms.registry import action_types, sources
from alarms.runner import alarm_action_task
from alarms.sources import aggregate, at
from gpucloud.lib.errors import Conflict, InvalidInput, NotFoundError
from gpucloud.lib.secretbox import seal
from gpucloud.tenancy.audit import audit_record
from gpucloud.tenancy.models import Tenant

logger = logging.getLogger(__name__)

CONFIG_FIELDS = ("name", "description", "target_kind", "target_id", "metric", "statistic", "period",
                 "evaluation_periods", "datapoints_to_alarm", "threshold", "comparison", "treat_missing_data",
                 "actions", "enabled")


# --- configuration ---------------------------------------------------------------------------------

def _clean(*, tenant: Tenant, values: dict[str, Any]) -> dict[str, Any]:
    """Check a whole configuration against the registries; InvalidInput names the field at fault."""
    def bad(field: str, message: str) -> InvalidInput:
        return InvalidInput(message, fields={field: [message]})

    source = sources().get(values["target_kind"])
    if source is None:
        raise bad("target_kind", f"Unknown target kind; one of: {', '.join(sorted(sources()))}.")
    if values["metric"] not in source.metrics:
        raise bad("metric", f"A {source.kind} has the metrics {', '.join(source.metrics)}.")
    if values["statistic"] not in source.statistics:
        raise bad("statistic", f"A {source.kind} metric takes the statistics {', '.join(sorted(source.statistics))}.")
    try:
        values["target_id"] = source.resolve(tenant=tenant, target_id=values.get("target_id") or "")
    except (NotFoundError, ValueError):
        raise bad("target_id", f"No such {source.kind} among yours.") from None
    if values["period"] % 60:
        raise bad("period", "A period is a whole number of minutes (60, 120, ... 86400 seconds).")
    if values["datapoints_to_alarm"] > values["evaluation_periods"]:
        raise bad("datapoints_to_alarm", "At most evaluation_periods.")
    cleaned: dict[str, list[dict[str, Any]]] = {}
    for key in ACTION_KEYS.values():
        cleaned[key] = []
        for action in values["actions"].get(key) or []:
            kind = action.get("type") if isinstance(action, dict) else None
            handler = action_types().get(kind) if isinstance(kind, str) else None
            if handler is None:
                raise bad("actions", f"Unknown action type {kind!r} in actions.{key}; one of: "
                                     f"{', '.join(sorted(action_types()))}.")
            try:
                cleaned[key].append(handler.validate(tenant=tenant, action=action,
                                                     target=(source.kind, values["target_id"])))
            except (ValueError, NotFoundError) as exc:
                raise bad("actions", f"actions.{key}: {exc}") from None
    values["actions"] = cleaned
    return values


def _new_secret() -> str:
    return "whsec_" + secrets.token_urlsafe(24)


@transaction.atomic
def alarm_create(*, tenant: Tenant, **values: Any) -> tuple[Alarm, str]:
    """A new alarm, due at once; returns it and its webhook signing secret (shown this once)."""
    defaults = {f.name: f.get_default() for f in Alarm._meta.get_fields()
                if f.name in CONFIG_FIELDS and f.concrete and f.has_default()}
    values = _clean(tenant=tenant, values={**defaults, "target_id": "", "description": "", **values})
    secret = _new_secret()
    try:
        with transaction.atomic():
            alarm = Alarm.objects.create(tenant=tenant, webhook_secret_sealed=seal(secret), **values)
    except IntegrityError:
        raise Conflict("An alarm of that name exists.", fields={"name": ["An alarm of that name exists."]}) from None
    audit_record(tenant=tenant, action="alarm.create", obj=alarm, object_repr=alarm.name,
                 data={"metric": alarm.metric, "target_kind": alarm.target_kind})
    return alarm, secret


@transaction.atomic
def alarm_update(*, alarm: Alarm, **changes: Any) -> Alarm:
    """Change an alarm's settings; a changed rule or metric is evaluated at the next tick."""
    alarm = Alarm.objects.select_for_update().get(pk=alarm.pk)
    values = _clean(tenant=alarm.tenant, values={**{f: getattr(alarm, f) for f in CONFIG_FIELDS}, **changes})
    for key, value in values.items():
        setattr(alarm, key, value)
    alarm.next_eval_at = timezone.now()
    try:
        with transaction.atomic():
            alarm.save()
    except IntegrityError:
        raise Conflict("An alarm of that name exists.", fields={"name": ["An alarm of that name exists."]}) from None
    audit_record(tenant=alarm.tenant, action="alarm.update", obj=alarm, object_repr=alarm.name,
                 data={"fields": sorted(changes)})
    return alarm


@transaction.atomic
def alarm_delete(*, alarm: Alarm) -> None:
    audit_record(tenant=alarm.tenant, action="alarm.delete", obj=alarm, object_repr=alarm.name)
    alarm.delete()


# --- evaluation ------------------------------------------------------------------------------------

def _datapoints(alarm: Alarm, *, start: int, end: int, now: datetime) -> list[float | None]:
    source = sources().get(alarm.target_kind)
    n, period = alarm.evaluation_periods, alarm.period
    values: dict[int, float] = {}
    if source is None:  # the app that registered the kind is gone: no data
        pass
    elif source.series is not None:
        try:
            values = source.series(tenant=alarm.tenant, target_id=alarm.target_id, metric=alarm.metric,
                                   stat=alarm.statistic, start=at(start), end=at(end), period=period, now=now)
        except NotFoundError:  # the workload was deleted: its data is missing
            values = {}
    else:
        assert source.sample is not None
        # A gauge read now stands for the period that just ended; kept on the alarm for the next N.
        value = source.sample(tenant=alarm.tenant, target_id=alarm.target_id, metric=alarm.metric, now=now)
        kept = [s for s in alarm.samples if start <= s[0] < end - period]
        if value is not None:
            kept.append([end - period, value])
        alarm.samples = kept
        by: dict[int, list[float]] = {}
        for t, v in kept:
            by.setdefault(t, []).append(v)
        values = {t: v for t, vs in by.items() if (v := aggregate(vs, alarm.statistic)) is not None}
    return [values.get(start + i * period) for i in range(n)]


def payload_of(alarm: Alarm, *, old: str, new: str, reason: str, datapoints: list, now: datetime) -> dict:
    """The event an action carries (the webhook's JSON body)."""
    return {
        "event": "alarm.state_change", "alarm": str(alarm.pk), "name": alarm.name, "tenant": alarm.tenant.slug,
        "state": new, "previous_state": old, "reason": reason, "time": now.isoformat(),
        "target": {"kind": alarm.target_kind, "id": alarm.target_id,
                   "name": selectors.alarm_target_labels(tenant=alarm.tenant, alarms=[alarm])[str(alarm.pk)]},
        "metric": alarm.metric,
        "statistic": alarm.statistic, "period": alarm.period, "threshold": alarm.threshold,
        "comparison": alarm.comparison, "evaluation_periods": alarm.evaluation_periods,
        "datapoints_to_alarm": alarm.datapoints_to_alarm, "datapoints": datapoints,
    }


def _evaluate(alarm: Alarm, *, now: datetime) -> list[int]:
    """Evaluate a claimed alarm (its row locked) and save it; returns the action runs it created."""
    delay = settings.ALARM_EVAL_DELAY_S
    start, end = rules.period_bounds(now.timestamp(), period=alarm.period, delay=delay,
                                     n=alarm.evaluation_periods)
    values = _datapoints(alarm, start=start, end=end, now=now)
    rule = rules.Rule(threshold=alarm.threshold, comparison=alarm.comparison,
                      evaluation_periods=alarm.evaluation_periods, datapoints_to_alarm=alarm.datapoints_to_alarm,
                      treat_missing_data=alarm.treat_missing_data)
    decision = rules.evaluate(values, rule, current=alarm.state)
    alarm.datapoints = [{"t": at(start + i * alarm.period).isoformat(), "value": v} for i, v in enumerate(values)]
    alarm.last_evaluated_at = now
    alarm.next_eval_at = at(rules.next_evaluation(now.timestamp(), period=alarm.period, delay=delay))
    runs: list[int] = []
    if decision.state != alarm.state:
        old = alarm.state
        history = AlarmHistory.objects.create(alarm=alarm, created_at=now, old_state=old, new_state=decision.state,
                                              reason=decision.reason[:1000], datapoints=alarm.datapoints)
        payload = payload_of(alarm, old=old, new=decision.state, reason=decision.reason,
                             datapoints=alarm.datapoints, now=now)
        for action in alarm.actions.get(ACTION_KEYS[AlarmState(decision.state)]) or []:
            runs.append(AlarmAction.objects.create(alarm=alarm, history=history, type=action["type"], action=action,
                                                   payload=payload, created_at=now, next_attempt_at=now).pk)
        alarm.state, alarm.state_reason, alarm.state_changed_at = decision.state, decision.reason[:1000], now
        logger.info("alarm state alarm=%s tenant=%s %s -> %s actions=%s", alarm.pk, alarm.tenant_id, old,
                    decision.state, len(runs))
    alarm.save(update_fields=["state", "state_reason", "state_changed_at", "datapoints", "samples",
                              "last_evaluated_at", "next_eval_at", "updated_at"])
    return runs


def alarms_evaluate_due(*, now: datetime | None = None, limit: int = 1000,
                        on_claim: Callable[[Alarm], None] | None = None) -> list[Any]:
    """Evaluate every due alarm once; returns the ids this call evaluated.

    `on_claim(alarm)` runs while this call holds the alarm's row lock (tests use it as a gate)."""
    now = now or timezone.now()
    due = list(Alarm.objects.filter(enabled=True, next_eval_at__lte=now).order_by("next_eval_at")
               .values_list("pk", flat=True)[:limit])
    done = []
    for pk in due:
        with transaction.atomic():
            alarm = (Alarm.objects.select_for_update(skip_locked=True, of=("self",)).select_related("tenant")
                     .filter(pk=pk, enabled=True, next_eval_at__lte=now).first())
            if alarm is None:  # another evaluator holds it, or has already done this period
                continue
            if on_claim is not None:
                on_claim(alarm)
            runs = _evaluate(alarm, now=now)
            for run_id in runs:
                transaction.on_commit(lambda run_id=run_id: alarm_action_task.delay(run_id))
        done.append(pk)
    return done
