"""Job arrays from the terminal: `gpucloud jobs submit --array N`, `jobs ls`, `jobs stop-array`."""
from __future__ import annotations

import json

from scheduler.models import Workload
from tests.cli.test_cli import cli  # noqa: F401 (fixture)
from tests.scheduler.fleet import make_hosts
from tests.scheduler.test_job_arrays import catalog  # noqa: F401 (fixture)


def test_an_array_is_submitted_listed_as_one_and_stopped_whole(cli, alice, catalog):  # noqa: F811
    make_hosts(n=1)  # a host that could run a task (an array no host could ever run is refused)
    env = {"GPUCLOUD_URL": cli.url, "GPUCLOUD_API_KEY": alice.key}
    sub = cli("jobs", "submit", "-t", "h100.1x", "-i", "busybox", "--region", "us-east-1", "--name", "sweep",
              "--array", "4", "--json", "--", "sh", "-c", "echo $GPUCLOUD_ARRAY_INDEX", **env)
    assert sub.returncode == 0, sub.both
    array = json.loads(sub.stdout)
    assert (array["count"], [t["index"] for t in array["tasks"]]) == (4, [0, 1, 2, 3])
    assert sorted(Workload.objects.values_list("env__GPUCLOUD_ARRAY_INDEX", flat=True)) == ["0", "1", "2", "3"]
    # one row for the array, not four jobs
    ls = cli("jobs", "ls", **env)
    assert ls.returncode == 0 and "sweep" in ls.stdout and "4 pending" in ls.stdout, ls.both
    assert ls.stdout.count("sweep") == 1
    tasks = cli("jobs", "ls", "--array", array["id"], **env)
    assert tasks.returncode == 0 and tasks.stdout.count("pending") == 4, tasks.both
    stop = cli("jobs", "stop-array", array["id"], **env)
    assert stop.returncode == 0 and "4 stopped" in stop.stdout, stop.both
    assert set(Workload.objects.values_list("state", flat=True)) == {"stopped"}
