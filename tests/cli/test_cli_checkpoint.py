"""Checkpoint-aware preemption from the terminal: `gpucloud jobs submit --checkpoint-signal/--checkpoint-grace`."""
from __future__ import annotations

import json

from scheduler.models import Workload
from tests.cli.test_cli import cli  # noqa: F401 (fixture)
from tests.scheduler.fleet import make_hosts
from tests.scheduler.test_job_arrays import catalog  # noqa: F401 (fixture)


def test_a_job_is_submitted_with_its_checkpoint_and_a_bad_one_is_refused(cli, alice, catalog):  # noqa: F811
    make_hosts(n=1, gpus=8)
    env = {"GPUCLOUD_URL": cli.url, "GPUCLOUD_API_KEY": alice.key}
    sub = cli("jobs", "submit", "-t", "h100.1x", "-i", "busybox", "--region", "us-east-1", "--name", "trainer",
              "--checkpoint-signal", "SIGUSR1", "--checkpoint-grace", "60", "--json", "--", "python", "train.py", **env)
    assert sub.returncode == 0, sub.both
    job = json.loads(sub.stdout)
    assert job["checkpoint"] == {"signal": "SIGUSR1", "grace_s": 60}
    assert Workload.objects.get(pk=job["id"]).checkpoint_signal == "SIGUSR1"
    show = cli("jobs", "show", job["id"], **env)
    assert show.returncode == 0 and "SIGUSR1, then 60 s to save before a preemption stops it" in show.both, show.both
    bad = cli("jobs", "submit", "-t", "h100.1x", "-i", "busybox", "--region", "us-east-1", "--name", "kill",
              "--checkpoint-signal", "SIGKILL", "--checkpoint-grace", "60", "--", "true", **env)
    assert bad.returncode == 1 and "checkpoint.signal" in bad.both, bad.both
    assert Workload.objects.count() == 1
