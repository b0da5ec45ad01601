"""Alarms against real PostgreSQL: the API (CRUD, validation, history), evaluation of due alarms once per
period with two evaluators at once, sampled tenant gauges, and the actions (e-mail, stop)."""
from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.core import mail
from django.db import connection

from agents.models import GpuSample
from alarms import runner, services
from alarms.choices import ActionStatus
from alarms.models import Alarm, AlarmAction, AlarmHistory
from alarms.registry import ActionType, action_types, register_action
from gpucloud.lib.secretbox import open_sealed
from scheduler.choices import State
from scheduler.models import ContainerEvent, Workload
from tests.agents.test_agent_api import (  # noqa: F401 (fixtures)
    place,
    region,
    registered,
    triggered,
)

pytestmark = pytest.mark.django_db

URL = "/api/v1/alarms"
T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)  # a minute boundary: periods are aligned to them


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def queue_alarm(tenant, **kw):
    values = {"name": "queue", "target_kind": "tenant", "metric": "queued_gpus", "threshold": 1,
              "comparison": "ge", **kw}
    return services.alarm_create(tenant=tenant, **values)[0]


@pytest.fixture
def instance(registered, alice):
    from agents.models import Host

    w = place(Host.objects.get(), alice.tenant)
    w.allocations.update(created_at=T0 - timedelta(hours=1))
    return w


def feed(workload, seconds_and_utils):
    gpu = workload.allocations.get().gpu_id
    GpuSample.objects.bulk_create(GpuSample(gpu_id=gpu, time=at(s), gpu_util=u) for s, u in seconds_and_utils)


# --- the API -------------------------------------------------------------------------------------------

def test_create_shows_the_webhook_secret_once_and_stores_it_encrypted(alice, instance, settings):
    settings.WEBHOOK_ALLOW_PRIVATE = True
    body = {"name": "hot", "target_kind": "workload", "target_id": str(instance.pk), "metric": "gpu_util",
            "statistic": "max", "threshold": 80, "comparison": "gt", "evaluation_periods": 2,
            "datapoints_to_alarm": 2, "actions": {"alarm": [{"type": "webhook", "url": "http://127.0.0.1:9/h"},
                                                            {"type": "email"}], "ok": [{"type": "email"}]}}
    resp = alice.client().post(URL, body, format="json")
    assert resp.status_code == 201, resp.content
    created = resp.json()
    secret = created["webhook_secret"]
    assert secret.startswith("whsec_") and created["state"] == "INSUFFICIENT_DATA"
    alarm = Alarm.objects.get()
    assert secret not in alarm.webhook_secret_sealed and open_sealed(alarm.webhook_secret_sealed) == secret
    shown = alice.client().get(f"{URL}/{alarm.pk}").json()
    assert "webhook_secret" not in shown and shown["actions"]["alarm"][0]["url"] == "http://127.0.0.1:9/h"
    assert [a["id"] for a in alice.client().get(URL).json()["results"]] == [str(alarm.pk)]
    resp = alice.client().patch(f"{URL}/{alarm.pk}", {"threshold": 90}, format="json")
    assert resp.status_code == 200 and resp.json()["threshold"] == 90
    assert alice.client().delete(f"{URL}/{alarm.pk}").status_code == 204
    assert not Alarm.objects.exists()


@pytest.mark.parametrize(("change", "field"), [
    ({"metric": "queued_gpus"}, "metric"),  # a tenant metric on a workload
    ({"target_kind": "planet"}, "target_kind"),
    ({"target_id": "00000000-0000-0000-0000-000000000000"}, "target_id"),
    ({"target_id": "not-an-id"}, "target_id"),
    ({"period": 90}, "period"),
    ({"period": 30}, "period"),
    ({"evaluation_periods": 2, "datapoints_to_alarm": 3}, "datapoints_to_alarm"),
    ({"comparison": "eq"}, "comparison"),
    ({"statistic": "median"}, "statistic"),
    ({"treat_missing_data": "maybe"}, "treat_missing_data"),
    ({"actions": {"alarm": [{"type": "webhook", "url": "http://169.254.169.254/latest"}]}}, "actions"),
    ({"actions": {"alarm": [{"type": "webhook", "url": "https://10.0.0.1/h"}]}}, "actions"),
    ({"actions": {"alarm": [{"type": "email", "to": ["stranger@elsewhere.test"]}]}}, "actions"),
    ({"actions": {"alarm": [{"type": "launch_rocket"}]}}, "actions"),  # no app registered it
    ({"actions": {"alarm": [{"type": "webhook", "url": "https://x.test", "headers": {}}]}}, "actions"),
    ({"threshold": "high"}, "threshold"),
])
def test_bad_settings_are_refused_naming_the_field(alice, instance, change, field):
    body = {"name": "hot", "target_kind": "workload", "target_id": str(instance.pk), "metric": "gpu_util",
            "threshold": 80, "comparison": "gt", **change}
    resp = alice.client().post(URL, body, format="json")
    assert resp.status_code == 400, resp.content
    assert field in resp.json()["error"]["fields"]
    assert not Alarm.objects.exists()


def test_stop_workload_needs_a_workload_target(alice):
    resp = alice.client().post(URL, {"name": "q", "target_kind": "tenant", "metric": "queue_wait", "threshold": 60,
                                     "comparison": "gt", "actions": {"alarm": [{"type": "stop_workload"}]}},
                               format="json")
    assert resp.status_code == 400 and "actions" in resp.json()["error"]["fields"]


def test_names_are_unique_per_tenant(alice, charlie):
    queue_alarm(alice.tenant)
    queue_alarm(charlie.tenant)
    resp = alice.client().post(URL, {"name": "queue", "target_kind": "tenant", "metric": "queue_wait",
                                     "threshold": 60, "comparison": "gt"}, format="json")
    assert resp.status_code == 409


def test_a_viewer_reads_but_cannot_create(alice, victor):
    queue_alarm(alice.tenant)
    assert victor.client().get(URL).status_code == 200
    resp = victor.client().post(URL, {"name": "v", "target_kind": "tenant", "metric": "queue_wait",
                                      "threshold": 60, "comparison": "gt"}, format="json")
    assert resp.status_code == 403


# --- evaluation ----------------------------------------------------------------------------------------

def test_an_alarm_is_evaluated_once_per_period_by_two_evaluators_at_once(alice, instance, transactional_db):
    """Evaluator A claims the alarm and stops inside its transaction (a gate); evaluator B runs meanwhile
    in another connection and skips it; after A commits neither evaluates it again in that period."""
    alarm = services.alarm_create(tenant=alice.tenant, name="hot", target_kind="workload",
                                  target_id=str(instance.pk), metric="gpu_util", threshold=80,
                                  comparison="gt")[0]
    feed(instance, [(-50, 95.0)])
    now = at(20)  # the 12:00 minute is evaluated (20 s > the 15 s delay)
    claimed, release = threading.Event(), threading.Event()
    result: dict[str, list] = {}

    def gate(_alarm):
        claimed.set()
        assert release.wait(30)

    def evaluator_a():
        try:
            result["a"] = services.alarms_evaluate_due(now=now, on_claim=gate)
        finally:
            connection.close()

    a = threading.Thread(target=evaluator_a)
    a.start()
    try:
        assert claimed.wait(30), "evaluator A never claimed the alarm"
        result["b_during"] = services.alarms_evaluate_due(now=now)  # row locked: skipped, not waited for
    finally:
        release.set()
        a.join(30)
    result["b_after"] = services.alarms_evaluate_due(now=now)  # committed: no longer due
    assert result == {"a": [alarm.pk], "b_during": [], "b_after": []}
    alarm.refresh_from_db()
    assert alarm.state == "ALARM" and AlarmHistory.objects.count() == 1
    assert alarm.next_eval_at == at(60 + 15)  # the next minute, once it has settled
    assert services.alarms_evaluate_due(now=at(74)) == []
    assert services.alarms_evaluate_due(now=at(75)) == [alarm.pk]


def test_a_tenant_gauge_is_sampled_at_each_evaluation(alice, instance):
    """queued_gpus: 0 at first, then a pending instance asks for one GPU; 2 of 2 periods at >= 1 alarm."""
    from gpucloud.catalogue.models import InstanceType

    alarm = queue_alarm(alice.tenant, evaluation_periods=2, datapoints_to_alarm=2)
    services.alarms_evaluate_due(now=at(20))
    alarm.refresh_from_db()
    assert alarm.state == "OK" and [d["value"] for d in alarm.datapoints] == [None, 0.0]
    Workload.objects.create(tenant=alice.tenant, kind="instance", name="waiting", image="busybox",
                            instance_type=InstanceType.objects.get(code="h100.2x"), region=instance.region)
    services.alarms_evaluate_due(now=at(80))
    alarm.refresh_from_db()
    assert alarm.state == "OK" and [d["value"] for d in alarm.datapoints] == [0.0, 2.0]
    services.alarms_evaluate_due(now=at(140))
    alarm.refresh_from_db()
    assert alarm.state == "ALARM" and [d["value"] for d in alarm.datapoints] == [2.0, 2.0]
    history = alice.client().get(f"{URL}/{alarm.pk}/history").json()["results"]
    assert [(h["old_state"], h["new_state"]) for h in history] == [("OK", "ALARM"), ("INSUFFICIENT_DATA", "OK")]


def test_a_deleted_workload_is_missing_data(alice, instance):
    alarm = services.alarm_create(tenant=alice.tenant, name="hot", target_kind="workload",
                                  target_id=str(instance.pk), metric="gpu_util", threshold=80,
                                  comparison="gt")[0]
    feed(instance, [(-50, 10.0)])
    services.alarms_evaluate_due(now=at(20))
    assert Alarm.objects.get().state == "OK"
    Workload.objects.filter(pk=instance.pk).update(deleted_at=at(30))
    services.alarms_evaluate_due(now=at(80))
    alarm.refresh_from_db()
    assert alarm.state == "INSUFFICIENT_DATA" and alarm.datapoints[0]["value"] is None


# --- actions -------------------------------------------------------------------------------------------

def test_email_and_stop_actions_run_once_after_the_change(alice, bob, instance, django_capture_on_commit_callbacks):
    Workload.objects.filter(pk=instance.pk).update(state=State.RUNNING)
    alarm = services.alarm_create(tenant=alice.tenant, name="hot", target_kind="workload",
                                  target_id=str(instance.pk), metric="gpu_util", threshold=80, comparison="gt",
                                  actions={"alarm": [{"type": "email", "to": ["bob@acme.test"]},
                                                     {"type": "stop_workload"}]})[0]
    feed(instance, [(-50, 99.0)])
    with django_capture_on_commit_callbacks(execute=False) as queued:
        services.alarms_evaluate_due(now=at(20))
    assert len(queued) == 2 and not mail.outbox  # nothing runs inside the evaluator's transaction
    for run_id in AlarmAction.objects.values_list("pk", flat=True):
        assert runner.alarm_action_run(run_id=run_id, now=at(21)) == ActionStatus.DONE
        assert runner.alarm_action_run(run_id=run_id, now=at(22)) is None  # once
    [message] = mail.outbox
    assert message.to == ["bob@acme.test"] and "ALARM" in message.subject and alarm.name in message.subject
    # the instance by its name (issue 28), the period in minutes; its id whole, never cut short
    assert f"(avg over 1 min) of instance {instance.name} (id {instance.pk})." in message.body, message.body
    instance.refresh_from_db()
    assert instance.state == State.STOPPING and "hot" in instance.reason


def test_another_app_registers_an_action_type(alice, instance):
    """The interface an autoscaling app uses: register in AppConfig.ready(), configure by type."""
    calls = []

    def validate(*, tenant, action, target):
        if not action.get("policy"):
            raise ValueError("which policy?")
        return {"type": "scaling_policy", "policy": action["policy"]}

    def run(ctx):
        calls.append((ctx.alarm.pk, ctx.action["policy"], ctx.payload["state"]))
        return "scaled 2 -> 4"

    before = action_types().get("scaling_policy")  # the autoscaling app's own, once it is there
    register_action(ActionType("scaling_policy", validate=validate, run=run))
    try:
        alarm = services.alarm_create(tenant=alice.tenant, name="scale", target_kind="workload",
                                      target_id=str(instance.pk), metric="gpu_util", threshold=80,
                                      comparison="gt",
                                      actions={"alarm": [{"type": "scaling_policy", "policy": "p-1"}]})[0]
        feed(instance, [(-50, 99.0)])
        services.alarms_evaluate_due(now=at(20))
        [run_row] = AlarmAction.objects.all()
        assert runner.alarm_action_run(run_id=run_row.pk, now=at(21)) == ActionStatus.DONE
        assert calls == [(alarm.pk, "p-1", "ALARM")]
        assert AlarmAction.objects.get().outcome == "scaled 2 -> 4"
    finally:
        if before is not None:
            register_action(before)
        else:
            del action_types()["scaling_policy"]  # type: ignore[attr-defined]


def test_a_failing_webhook_backs_off_then_gives_up_and_a_refused_url_is_never_retried(alice, instance, settings):
    settings.WEBHOOK_ALLOW_PRIVATE = True
    settings.ALARM_ACTION_MAX_ATTEMPTS = 2
    assert [runner.backoff_s(n) for n in range(1, 10)] == [30, 60, 120, 240, 480, 960, 1920, 3600, 3600]
    services.alarm_create(tenant=alice.tenant, name="hot", target_kind="workload", target_id=str(instance.pk),
                          metric="gpu_util", threshold=80, comparison="gt",
                          actions={"alarm": [{"type": "webhook", "url": "http://127.0.0.1:9/nobody-listens"}],
                                   "ok": [{"type": "webhook", "url": "http://127.0.0.1:9/nobody-listens"}]})
    feed(instance, [(-50, 99.0), (10, 5.0)])
    services.alarms_evaluate_due(now=at(20))
    [run] = AlarmAction.objects.all()
    assert runner.alarm_action_run(run_id=run.pk, now=at(21)) == ActionStatus.PENDING
    run.refresh_from_db()
    assert run.attempts == 1 and run.next_attempt_at == at(51) and run.last_error
    assert runner.alarm_action_run(run_id=run.pk, now=at(51)) == ActionStatus.FAILED
    run.refresh_from_db()
    assert run.attempts == 2 and runner.alarm_actions_due(now=at(10_000)) == []
    # the operator no longer allows private addresses: the OK webhook is refused, once, without retries
    settings.WEBHOOK_ALLOW_PRIVATE = False
    services.alarms_evaluate_due(now=at(80))
    ok_run = AlarmAction.objects.get(history__new_state="OK")
    assert runner.alarm_action_run(run_id=ok_run.pk, now=at(81)) == ActionStatus.FAILED
    ok_run.refresh_from_db()
    assert ok_run.attempts == 1 and "https" in ok_run.last_error


def test_a_sealed_secret_opens_only_under_its_secret_key(settings):
    from gpucloud.lib.secretbox import SealedError, seal

    sealed = seal("whsec_abc")
    assert "whsec_abc" not in sealed and open_sealed(sealed) == "whsec_abc"
    settings.SECRET_KEY = "another-key"
    with pytest.raises(SealedError):
        open_sealed(sealed)


def test_alarms_name_their_targets_on_the_console_and_in_the_payload(alice, instance):
    """Issue 28: "instance nb", not a truncated UUID; many alarms in one read per kind of target."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from alarms import selectors

    on_it = services.alarm_create(tenant=alice.tenant, name="hot", target_kind="workload",
                                  target_id=str(instance.pk), metric="gpu_util", threshold=80, comparison="gt")[0]
    queue_alarm(alice.tenant)
    alarms = list(selectors.alarm_list(tenant=alice.tenant))
    with CaptureQueriesContext(connection) as q:
        labels = selectors.alarm_target_labels(tenant=alice.tenant, alarms=alarms)
    assert len(q.captured_queries) == 1  # the workloads' names; the tenant's is at hand
    assert labels[str(on_it.pk)] == f"instance {instance.name}" and set(labels.values()) == {
        f"instance {instance.name}", "tenant Acme"}
    payload = services.payload_of(on_it, old="OK", new="ALARM", reason="r", datapoints=[], now=at(0))
    assert payload["target"] == {"kind": "workload", "id": str(instance.pk), "name": f"instance {instance.name}"}
    from django.test import Client
    from django.urls import reverse

    web = Client()
    web.force_login(alice.user)
    page = web.get(reverse("console:alarms")).content.decode()
    assert f"instance {instance.name}" in page and f"{str(instance.pk)[:12]}…" not in page
    detail = web.get(reverse("console:alarm", args=[on_it.pk])).content.decode()
    assert f">instance {instance.name}</a>" in detail


def test_an_alarm_on_container_events_fires_when_a_container_is_lost(alice, instance):
    """The workload source's `container_events` metric (alarms/sources.py): the container events
    recorded in each period, 0 in one without any."""
    alarm = services.alarm_create(tenant=alice.tenant, name="lost", target_kind="workload",
                                  target_id=str(instance.pk), metric="container_events", statistic="sum",
                                  threshold=1, comparison="ge")[0]
    services.alarms_evaluate_due(now=at(20))
    alarm.refresh_from_db()
    assert alarm.state == "OK" and alarm.datapoints[0]["value"] == 0.0
    ContainerEvent.objects.create(workload=instance, kind=ContainerEvent.Kind.LOST, count=1,
                                  detail="container 0123456789ab is gone", created_at=at(70))
    services.alarms_evaluate_due(now=at(140))
    alarm.refresh_from_db()
    assert alarm.state == "ALARM" and alarm.datapoints[0]["value"] == 1.0
