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
    assert "max(queued_gpus)" not in made.stdout and "avg(queued_gpus) >= 4 for 2 of 3 x 60 s" in made.stdout
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
