"""Notifications (issue 28, deliverable 7): what happened to a person's work, told once, on the
channels they chose, to them alone.

The facts are the real ones (transitions through the one transition function, a notice through
`workloads_notice`, a budget alert row, a host marked DOWN by the liveness check); the collector
and the delivery are the services the beat's task runs."""
from __future__ import annotations

import json
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from django.core import mail
from django.utils import timezone

from agents.choices import HostState
from agents.models import Host
from billing import notify
from billing.models import Budget, BudgetAlert
from gpucloud.tenancy.models import AuditEvent
from notifications import services
from notifications.choices import Delivery, Event
from notifications.models import Notification
from notifications.sources import classify
from scheduler.choices import State, WorkloadKind
from scheduler.models import ContainerEvent
from scheduler.services import Notice, workload_transition, workloads_notice
from tests.agents.test_agent_api import place
from tests.scheduler.fleet import make_hosts

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(("kind", "to", "reason", "event"), [
    ("instance", "running", "container running", Event.INSTANCE_RUNNING),
    ("instance", "stopped", "stopped by alice", Event.INSTANCE_STOPPED),
    ("instance", "stopped", "idle auto-stop: every GPU under 5 % utilisation for 30 min", Event.IDLE_STOPPED),
    ("instance", "failed", "image pull failed", Event.INSTANCE_FAILED),
    ("instance", "lost", "host down", Event.INSTANCE_FAILED),
    ("instance", "preempted", "preempted for critical work", Event.INSTANCE_STOPPED),
    ("instance", "starting", "placed", None),
    ("job", "failed", "container lost: it disappeared (docker rm)", Event.JOB_FAILED),
    ("job", "succeeded", "exited with code 0", Event.JOB_SUCCEEDED),
    ("job", "failed", "exited with code 3", Event.JOB_FAILED),
    ("job", "lost", "host down", Event.JOB_FAILED),
    ("job", "running", "container running", None),
    ("job", "pending", "retry 1 of 2", None),
])
def test_classify_names_the_event_of_a_transition(kind, to, reason, event):
    assert classify(kind=kind, from_state="running", to_state=to, reason=reason) == event


def collect(later_s: int = 60) -> int:
    """The collector as the beat runs it, a little later (past the settle time)."""
    return services.notifications_collect(now=timezone.now() + timedelta(seconds=later_s))


def run_to_failed(w):
    workload_transition(workload=w, to=State.STARTING, reason="container starting")
    workload_transition(workload=w, to=State.RUNNING, reason="container running")
    workload_transition(workload=w, to=State.FAILED, reason="container exited with code 137")


def test_a_failed_instance_is_told_once_to_whoever_hears_of_it_and_to_nobody_else(alice, bob, victor, charlie,
                                                                                 catalog):
    [host] = make_hosts(n=1)
    w = place(host, alice.tenant)
    w.created_by = bob.user
    w.save(update_fields=["created_by"])
    services.notifications_collect(now=timezone.now())  # the cursor starts here
    run_to_failed(w)
    assert collect() > 0
    assert collect() == 0  # a second scan of the same window tells nobody again
    got = {(n.user.email, n.event) for n in Notification.objects.select_related("user")}
    # bob launched it (his own work); alice is the owner (all of the tenant's work by default);
    # victor, a viewer, hears of his own work only; charlie is in another tenant
    assert got == {(bob.user.email, Event.INSTANCE_RUNNING), (bob.user.email, Event.INSTANCE_FAILED),
                   (alice.user.email, Event.INSTANCE_RUNNING), (alice.user.email, Event.INSTANCE_FAILED)}
    failed = Notification.objects.get(user=bob.user, event=Event.INSTANCE_FAILED)
    assert failed.email_status == Delivery.PENDING  # failures are e-mailed by default
    assert Notification.objects.get(user=bob.user, event=Event.INSTANCE_RUNNING).email_status == Delivery.NONE
    assert "exited with code 137" in failed.body and failed.link == f"/console/instances/{w.pk}/"

    assert services.notifications_deliver() == {"email": 2, "webhook": 0}
    assert sorted(m.to[0] for m in mail.outbox) == sorted([alice.user.email, bob.user.email])
    assert mail.outbox[0].subject.endswith(f"Instance {w.name} failed")
    assert services.notifications_deliver() == {"email": 0, "webhook": 0}  # sent once


def test_a_notice_budgets_and_a_low_balance_are_told(alice, bob, catalog):
    [host] = make_hosts(n=1)
    w = place(host, alice.tenant, kind=WorkloadKind.JOB)
    w.created_by = bob.user
    w.save(update_fields=["created_by"])
    services.notifications_collect(now=timezone.now())
    workloads_notice(notices=[Notice(workload_id=w.pk, notice_s=30, cause="preempted for critical work")],
                     now=timezone.now())
    budget = Budget.objects.create(tenant=alice.tenant, name="team", monthly_amount=100)
    BudgetAlert.objects.create(budget=budget, month=timezone.now().date().replace(day=1), threshold=80, spend=81)
    alice.tenant.billing_account.__class__.objects.filter(tenant=alice.tenant).update(
        low_balance_notified_at=timezone.now())
    collect()
    got = {(n.user.email, n.event) for n in Notification.objects.select_related("user")}
    assert (bob.user.email, Event.NOTICE) in got and (alice.user.email, Event.NOTICE) in got
    # budgets and balances: the owners and admins, not a member
    assert (alice.user.email, Event.BUDGET) in got and (bob.user.email, Event.BUDGET) not in got
    assert (alice.user.email, Event.LOW_BALANCE) in got and (bob.user.email, Event.LOW_BALANCE) not in got
    notice = Notification.objects.get(user=bob.user, event=Event.NOTICE)
    assert "preempted for critical work" in notice.body and notice.email_status == Delivery.PENDING


def test_a_container_lost_behind_the_agents_back_is_told_once(alice, catalog):
    [host] = make_hosts(n=1)
    services.notifications_collect(now=timezone.now())
    w = place(host, alice.tenant)
    ContainerEvent.objects.create(workload=w, kind=ContainerEvent.Kind.LOST, count=1,
                                  detail="gone from the engine (docker rm)")
    collect()
    collect()
    [n] = Notification.objects.filter(event=Event.CONTAINER_LOST)
    assert n.user == alice.user and "docker rm" in n.body and n.email_status == Delivery.PENDING


def test_operators_hear_of_a_host_down_and_tenants_do_not(alice, django_user_model, catalog):
    op = django_user_model.objects.create_user(username="op@example.test", email="op@example.test",
                                               password="x", is_staff=True)
    [host] = make_hosts(n=1)
    Host.objects.filter(pk=host.pk).update(state=HostState.DOWN, down_since=timezone.now(),
                                           last_heartbeat_at=timezone.now() - timedelta(minutes=1))
    collect()
    assert list(Notification.objects.values_list("user__email", "event", "tenant")) == [
        (op.email, Event.HOST_DOWN, None)]
    # past the grace its work is given up: that is told too, once
    collect(later_s=3600)
    collect(later_s=3600)
    assert sorted(Notification.objects.values_list("event", flat=True)) == [Event.HOST_DOWN, Event.HOST_LOST]


def test_email_is_rate_limited_per_person_and_the_rest_stay_in_the_inbox(alice, catalog, settings):
    settings.NOTIFY_EMAIL_PER_HOUR = 2
    [host] = make_hosts(n=1)
    services.notifications_collect(now=timezone.now())
    for _ in range(4):
        w = place(host, alice.tenant)
        run_to_failed(w)
    collect()
    assert services.notifications_deliver()["email"] == 2
    statuses = sorted(Notification.objects.filter(event=Event.INSTANCE_FAILED).values_list("email_status", flat=True))
    assert statuses == [Delivery.RATE_LIMITED, Delivery.RATE_LIMITED, Delivery.SENT, Delivery.SENT]
    assert Notification.objects.filter(event=Event.INSTANCE_FAILED, in_inbox=True).count() == 4
    assert len(mail.outbox) == 2


@pytest.fixture
def listener():
    got: list[tuple[dict, bytes]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            got.append((dict(self.headers), self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/hook", got
    server.shutdown()
    server.server_close()


def test_a_webhook_goes_through_the_ssrf_guard_signed_and_its_choice_is_audited(alice, catalog, listener,
                                                                                settings):
    url, got = listener
    # a private address is refused when set, as every outbound URL is
    r = alice.client().put("/api/v1/notification-settings", {"webhook_url": url}, format="json")
    assert r.status_code == 400 and "webhook_url" in r.json()["error"]["fields"]
    settings.WEBHOOK_ALLOW_PRIVATE = True  # a listener on 127.0.0.1 over http, as in a demo
    r = alice.client().put("/api/v1/notification-settings", {
        "webhook_url": url, "channels": {"instance.running": ["inbox", "webhook"]}}, format="json")
    assert r.status_code == 200, r.content
    secret = r.json()["webhook_secret"]
    assert secret.startswith("whsec_") and r.json()["channels"]["instance.running"] == ["inbox", "webhook"]
    assert "webhook_secret" not in alice.client().get("/api/v1/notification-settings").json()  # shown once
    audit = AuditEvent.objects.get(action="notifications.settings_update")
    assert secret not in json.dumps(audit.data)

    [host] = make_hosts(n=1)
    services.notifications_collect(now=timezone.now())
    w = place(host, alice.tenant)
    workload_transition(workload=w, to=State.STARTING, reason="container starting")
    workload_transition(workload=w, to=State.RUNNING, reason="container running")
    collect()
    assert services.notifications_deliver()["webhook"] == 1
    [(headers, body)] = got
    assert notify.verify(secret=secret, header=headers[notify.SIGNATURE_HEADER], body=body)
    assert json.loads(body)["event"] == "instance.running"
    assert headers["X-Gpucloud-Event"] == "notification.instance.running"


def test_bad_settings_are_refused_and_change_nothing(alice):
    for body in ({"channels": {"host.down": ["email"]}}, {"channels": {"instance.running": ["pager"]}},
                 {"scope": "everyone"}, {"channels": {"nope": ["inbox"]}}):
        r = alice.client().put("/api/v1/notification-settings", body, format="json")
        assert r.status_code == 400, (body, r.content)
        assert set(r.json()["error"]) >= {"code", "message", "fields"}
    assert not AuditEvent.objects.filter(action="notifications.settings_update").exists()


def test_the_inbox_api_shows_only_your_own_and_marks_read(alice, bob, charlie, catalog):
    [host] = make_hosts(n=1)
    services.notifications_collect(now=timezone.now())
    run_to_failed(place(host, alice.tenant))
    collect()
    mine = alice.client().get("/api/v1/notifications").json()["results"]
    assert {n["event"] for n in mine} == {"instance.running", "instance.failed"}
    assert all(not n["read"] for n in mine)
    assert bob.client().get("/api/v1/notifications").json()["results"] == []  # not his work; scope "mine"
    assert charlie.client().get(f"/api/v1/notifications/{mine[0]['id']}").status_code == 404
    assert bob.client().get(f"/api/v1/notifications/{mine[0]['id']}").status_code == 404
    r = bob.client().post("/api/v1/notifications/read", {"ids": [mine[0]["id"]]}, format="json")
    assert r.json() == {"marked": 0}  # not his to mark
    r = alice.client().post("/api/v1/notifications/read", {"ids": [mine[0]["id"]]}, format="json")
    assert r.json() == {"marked": 1}
    assert len(alice.client().get("/api/v1/notifications?unread=true").json()["results"]) == 1
    assert alice.client().post("/api/v1/notifications/read", {}, format="json").json() == {"marked": 1}
