"""What an alarm can watch and what it can do: two registries other apps add to in `AppConfig.ready()`.

An autoscaling app wires its policies to alarms without editing this app:

    # groups/apps.py
    def ready(self):
        from alarms.registry import ActionType, ActionRetry, register_action

        def validate(*, tenant, action, target):      # at create/update: the cleaned action or ValueError
            policy = policy_get(tenant=tenant, pk=action.get("policy"))   # tenant-scoped
            return {"type": "scaling_policy", "policy": str(policy.pk)}

        def run(ctx):                                  # after the state change committed
            policy_execute(tenant=ctx.alarm.tenant, pk=ctx.action["policy"], cause=ctx.payload)
            return "scaled"                            # the delivery log's outcome text
            # raise ActionRetry("...") to be retried with backoff; any other error fails the run

        register_action(ActionType("scaling_policy", validate=validate, run=run))

The action is then configured as `{"type": "scaling_policy", "policy": "<id>"}` in an alarm's
`actions.alarm` / `actions.ok` / `actions.insufficient_data` list. Until some app registers
`scaling_policy`, alarms refuse it (400). A metric source works the same way
(`register_source(MetricSource("group", ...))`), so an alarm can watch a group's average.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


class ActionRetry(Exception):
    """Raised by an action's `run` when trying again later may work (a receiver answered 500)."""


@dataclass(frozen=True)
class ActionContext:
    alarm: Any  # alarms.models.Alarm (its tenant: alarm.tenant)
    action: dict[str, Any]  # the configured action, as `validate` cleaned it
    payload: dict[str, Any]  # the state change: alarm, name, state, previous_state, reason, datapoints, time
    run_id: int  # the AlarmAction row (idempotency key for receivers)


@dataclass(frozen=True)
class ActionType:
    name: str
    # (*, tenant, action, target) -> cleaned action dict; raise ValueError with a sentence to refuse it.
    # `target` is (target_kind, target_id) of the alarm it is on.
    validate: Callable[..., dict[str, Any]]
    # (ctx: ActionContext) -> outcome text; ActionRetry to be retried, any other exception fails the run.
    run: Callable[[ActionContext], str]


@dataclass(frozen=True)
class MetricSource:
    """A kind of target and the metrics it has.

    Exactly one of `series` and `sample`:
    * `series(*, tenant, target_id, metric, stat, start, end, period, now) -> {period start (epoch s): value}`
      reads stored history (the GPU samples, as GET /api/v1/metrics does);
    * `sample(*, tenant, target_id, metric, now) -> float | None` is a gauge read at each evaluation and kept
      on the alarm (`Alarm.samples`) for its periods.
    `resolve(*, tenant, target_id) -> str` checks the target is the tenant's (tenant-scoped selector) and
    returns its canonical id, or raises `gpucloud.lib.errors.NotFoundError`.
    `labels(*, tenant, target_ids) -> {target id: words}` names targets for people ("instance nb"),
    many in one read (a page of alarms); an id it cannot name is left out.
    """

    kind: str
    metrics: Mapping[str, str]  # metric -> unit
    resolve: Callable[..., str]
    series: Callable[..., dict[int, float]] | None = None
    sample: Callable[..., float | None] | None = None
    labels: Callable[..., dict[str, str]] | None = None
    statistics: frozenset[str] = field(default=frozenset({"avg", "max", "min", "p95", "sum"}))


_ACTIONS: dict[str, ActionType] = {}
_SOURCES: dict[str, MetricSource] = {}


def register_action(action: ActionType) -> None:
    _ACTIONS[action.name] = action


def register_source(source: MetricSource) -> None:
    assert (source.series is None) != (source.sample is None), source.kind
    _SOURCES[source.kind] = source


def action_types() -> Mapping[str, ActionType]:
    return _ACTIONS


def sources() -> Mapping[str, MetricSource]:
    return _SOURCES
