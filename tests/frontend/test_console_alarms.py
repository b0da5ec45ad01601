"""The console's alarm pages in a browser: create an alarm on an instance with the form (a refused webhook
first, then the secret shown once), open it, and see its metric drawn with the threshold line."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from agents.models import GpuSample, Host
from alarms.models import Alarm
from tests.agents.test_agent_api import (  # noqa: F401 (fixtures)
    place,
    region,
    registered,
    triggered,
)
from tests.frontend.conftest import sign_in

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_alarm_is_created_in_the_console_and_drawn_with_its_threshold(page, live_server, alice, registered,
                                                                         settings):
    settings.WEBHOOK_ALLOW_PRIVATE = True
    w = place(Host.objects.get(), alice.tenant)
    now = timezone.now()
    w.allocations.update(created_at=now - timedelta(hours=1))
    gpu = w.allocations.get().gpu_id
    GpuSample.objects.bulk_create(GpuSample(gpu_id=gpu, time=now - timedelta(minutes=m), gpu_util=50 + m)
                                  for m in range(1, 30))
    sign_in(page, alice.user, live_server.url)
    page.goto("/console/alarms/")
    expect(page.get_by_text("No alarms yet.")).to_be_visible()
    page.get_by_label("Name").fill("gpu hot")
    page.get_by_label("Watch").select_option(f"workload:{w.pk}")
    page.get_by_label("Metric").select_option("gpu_util")
    page.get_by_label("Threshold").fill("80")
    page.get_by_label("Evaluation periods (N)").fill("2")
    page.get_by_label("Datapoints to alarm (M of N)").fill("2")
    # the SSRF guard refuses the metadata address, in the form, and nothing is saved
    page.get_by_label("Webhook URL (ALARM and OK)").fill("https://169.254.169.254/latest/meta-data")
    page.get_by_role("button", name="Create alarm").click()
    expect(page.locator("#field-webhook_url.has-error")).to_contain_text("169.254.169.254")
    assert not Alarm.objects.exists()
    page.get_by_label("Webhook URL (ALARM and OK)").fill("http://127.0.0.1:9/hook")
    page.get_by_role("button", name="Create alarm").click()
    expect(page.locator("#new-secret")).to_contain_text("whsec_")
    alarm = Alarm.objects.get()
    assert alarm.target_id == str(w.pk) and alarm.evaluation_periods == 2 and alarm.actions["ok"]
    page.get_by_role("link", name="gpu hot").click()
    expect(page.locator("main h1")).to_contain_text("INSUFFICIENT_DATA")
    expect(page.locator("[data-alarm-chart][data-drawn='1']")).to_be_attached()
    expect(page.locator("[data-alarm-chart] .u-legend")).to_contain_text("threshold")
    expect(page.get_by_text("No state changes yet.")).to_be_visible()

