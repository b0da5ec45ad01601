"""`gpucloud alarms ls|create|show|rm`: the real console script against a live server."""
from __future__ import annotations

import json

from alarms.models import Alarm
from tests.cli.test_cli import cli  # noqa: F401 (fixture)


def test_alarms_from_the_terminal(cli, alice, settings):
    settings.WEBHOOK_ALLOW_PRIVATE = True
    env = {"GPUCLOUD_URL": cli.url, "GPUCLOUD_API_KEY": alice.key}
    made = cli("alarms", "create", "queue", "--tenant", "--metric", "queued_gpus", "--threshold", "4",
               "--comparison", ">=", "--periods", "3", "--datapoints", "2", "--webhook", "http://127.0.0.1:9/h",
               "--email", **env)
    assert made.returncode == 0, made.both
    assert "max(queued_gpus)" not in made.stdout and "avg(queued_gpus) >= 4 for 2 of 3 x 1 min" in made.stdout
    alarm = Alarm.objects.get(tenant=alice.tenant)
    assert [a["type"] for a in alarm.actions["alarm"]] == ["webhook", "email"] and alarm.comparison == "ge"
    assert "Webhook signing secret (shown once): whsec_" in made.stdout
    listed = json.loads(cli("alarms", "ls", "--json", **env).stdout)
    assert [a["name"] for a in listed] == ["queue"] and "webhook_secret" not in listed[0]
    shown = cli("alarms", "show", "queue", **env)
    assert shown.returncode == 0 and "INSUFFICIENT_DATA" in shown.stdout and "No state changes yet." in shown.stdout
    bad = cli("alarms", "create", "q2", "--tenant", "--metric", "gpu_util", "--threshold", "1", **env)
    assert bad.returncode == 1 and "metric" in bad.stderr
    assert cli("alarms", "rm", "queue", **env).returncode == 0 and not Alarm.objects.exists()


def test_an_alarm_period_is_given_as_5m_or_300s_and_shown_in_minutes(cli, alice):
    env = {"GPUCLOUD_URL": cli.url, "GPUCLOUD_API_KEY": alice.key}
    for name, period in (("five", "5m"), ("secs", "300s")):
        made = cli("alarms", "create", name, "--tenant", "--metric", "queued_gpus", "--threshold", "4",
                   "--period", period, **env)
        assert made.returncode == 0 and "for 1 of 1 x 5 min" in made.stdout, made.both
    assert set(Alarm.objects.values_list("period", flat=True)) == {300}
    bad = cli("alarms", "create", "bad", "--tenant", "--metric", "queued_gpus", "--threshold", "4",
              "--period", "5 minutes", **env)
    assert bad.returncode == 2 and "5m, 300s or 1h" in bad.both and not Alarm.objects.filter(name="bad").exists()
