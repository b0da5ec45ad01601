# ruff: noqa: F811 - the agent API tests' fixtures are imported and then used as arguments
"""The issue's acceptance case, end to end: a real sim agent over HTTP runs an instance whose container
asks for 95 % GPU load (GPUCLOUD_SIM_GPU_UTIL); an alarm on its GPU utilisation > 80 % for 2 of 2
one-minute periods goes ALARM and delivers one signed webhook to a listener on 127.0.0.1 (retried
after the listener's first 500), then goes OK once the load drops; the history shows both.

The samples are the agent's own (heartbeats, flushed to PostgreSQL as in production), stamped with
explicit times: the test clock that stands in for minutes of real time."""
from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, HTTPServer
from uuid import UUID

import pytest
from django.utils import timezone

from agents import fastpath
from agents.models import GpuSample, Host
from alarms import runner, services
from alarms.choices import ActionStatus
from alarms.models import AlarmAction
from billing import notify
from gpucloud.celery import app
from scheduler.choices import State
from tests.agents.test_agent_api import (  # noqa: F401 (fixtures)
    make_sim_host,
    new_token,
    place,
    region,
    triggered,
)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def listener():
    """A webhook receiver on 127.0.0.1: answers the statuses in `answers` in turn (then 204), records all."""
    got: list[tuple[dict, bytes, int]] = []
    answers = [500]

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            code = answers.pop(0) if answers else 204
            got.append((dict(self.headers), body, code))
            self.send_response(code)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/alarms", got
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def test_gpu_utilisation_alarm_goes_alarm_with_one_signed_webhook_then_ok(make_sim_host, alice, listener,
                                                                          settings, monkeypatch):
    settings.WEBHOOK_ALLOW_PRIVATE = True  # the listener is on 127.0.0.1 over http, as in a demo
    monkeypatch.setattr(app.conf, "task_always_eager", True)  # no worker: after-commit tasks run inline
    url, got = listener
    sim = make_sim_host("sim-a", count=2)
    sim.beat()
    w = place(Host.objects.get(), alice.tenant, env={"GPUCLOUD_SIM_GPU_UTIL": "95"})
    sim.beat(3)  # the start, then samples
    fastpath.heartbeats_flush()
    w.refresh_from_db()
    assert w.state == State.RUNNING

    resp = alice.client().post("/api/v1/alarms", {
        "name": "gpu hot", "target_kind": "workload", "target_id": str(w.pk), "metric": "gpu_util",
        "statistic": "avg", "period": 60, "threshold": 80, "comparison": "gt", "evaluation_periods": 2,
        "datapoints_to_alarm": 2, "actions": {"alarm": [{"type": "webhook", "url": url}]},
    }, format="json")
    assert resp.status_code == 201, resp.content
    alarm_id, secret = resp.json()["id"], resp.json()["webhook_secret"]

    # the test clock: minute boundaries after the instance started
    t0 = datetime.fromtimestamp((int(timezone.now().timestamp()) // 60 + 2) * 60, tz=UTC)

    def beat_at(seconds: int) -> None:
        """One heartbeat of the agent, its samples stamped t0 + seconds."""
        last = GpuSample.objects.order_by("-id").values_list("id", flat=True).first() or 0
        sim.beat()
        fastpath.heartbeats_flush()
        assert GpuSample.objects.filter(id__gt=last).update(time=t0 + timedelta(seconds=seconds))

    def evaluate(seconds: int) -> dict:
        assert services.alarms_evaluate_due(now=t0 + timedelta(seconds=seconds)) == [UUID(alarm_id)]
        return alice.client().get(f"/api/v1/alarms/{alarm_id}").json()

    beat_at(10)  # the minute t0 .. t0+60
    beat_at(70)  # the minute t0+60 .. t0+120
    alarm = evaluate(135)  # both minutes ended 15 s ago
    assert alarm["state"] == "ALARM", alarm
    assert all(d["value"] > 80 for d in alarm["datapoints"]) and len(alarm["datapoints"]) == 2
    assert "2 of the last 2" in alarm["state_reason"]

    # the webhook: its first attempt meets a 500, the retry after the backoff is delivered
    [run] = AlarmAction.objects.all()
    assert got == []  # the eager after-commit attempt ran at real time, before the test clock's due time
    assert runner.alarm_action_run(run_id=run.pk, now=t0 + timedelta(seconds=136)) == ActionStatus.PENDING
    assert [code for _, _, code in got] == [500]
    assert runner.alarm_actions_due(now=t0 + timedelta(seconds=150)) == []  # backing off
    assert runner.alarm_actions_due(now=t0 + timedelta(seconds=166)) == [run.pk]
    assert runner.alarm_action_run(run_id=run.pk, now=t0 + timedelta(seconds=166)) == ActionStatus.DONE
    assert runner.alarm_actions_due(now=t0 + timedelta(days=1)) == []
    assert [code for _, _, code in got] == [500, 204]  # one delivered
    headers, body, _ = got[-1]
    assert notify.verify(secret=secret, header=headers[notify.SIGNATURE_HEADER], body=body)
    assert not notify.verify(secret="whsec_wrong", header=headers[notify.SIGNATURE_HEADER], body=body)
    event = json.loads(body)
    assert event["alarm"] == alarm_id and event["state"] == "ALARM" and event["previous_state"] == "INSUFFICIENT_DATA"
    assert headers["X-Gpucloud-Event"] == "alarm.state_change" and headers["X-Gpucloud-Delivery"] == str(run.pk)

    # the load drops: the next two minutes are under the threshold
    for c in sim.runtime._containers.values():  # the simulated GPU load of the running container
        c.load = 0.10
    beat_at(130)
    beat_at(190)
    alarm = evaluate(255)
    assert alarm["state"] == "OK", alarm
    assert all(d["value"] < 80 for d in alarm["datapoints"])

    history = alice.client().get(f"/api/v1/alarms/{alarm_id}/history").json()["results"]
    assert [(h["old_state"], h["new_state"]) for h in history] == [("ALARM", "OK"), ("INSUFFICIENT_DATA", "ALARM")]
    [delivery] = history[1]["actions"]
    assert delivery["type"] == "webhook" and delivery["status"] == "done" and delivery["attempts"] == 2
    assert history[0]["actions"] == [] and len(got) == 2  # no webhook on OK: none was configured
