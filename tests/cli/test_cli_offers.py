"""`gpucloud offers` tells available, busy and never apart and hides "never here" unless asked
(the real console script against a live server, as tests/cli/test_cli.py runs it)."""
from __future__ import annotations

import json

from scheduler.cycle import run_cycle
from scheduler.services import WorkloadSpec, workload_launch
from tests.cli.test_cli import cli  # noqa: F401 (fixture)
from tests.scheduler.fleet import make_hosts


def test_offers_show_now_and_hide_what_never_runs_here_and_launch_goes_where_it_runs(cli, alice, charlie, catalog):
    host = make_hosts(region="us-east-1", n=1)[0]  # 8 H100s
    workload_launch(tenant=charlie.tenant, spec=WorkloadSpec(
        kind="instance", name="half", instance_type="h100.4x", region="us-east-1", image="ubuntu:24.04"))
    run_cycle(region_id=host.region_id)  # 4 of them taken
    assert cli("login", "--url", cli.url, "--api-key", alice.key).returncode == 0

    rows = json.loads(cli("offers", "--gpu", "H100", "--json").stdout)
    now = {(r["instance_type"], r["region"]): r["availability"] for r in rows}
    assert now == {("h100.1x", "us-east-1"): "available", ("h100.2x", "us-east-1"): "available",
                   ("h100.4x", "us-east-1"): "available", ("h100.8x", "us-east-1"): "busy"}
    assert [r["availability"] for r in rows] == ["available"] * 3 + ["busy"]  # runnable first

    everything = json.loads(cli("offers", "--gpu", "H100", "--all", "--json").stdout)
    never = [r for r in everything if r["availability"] == "never"]
    assert never and {r["region"] for r in never} == {"us-west-2", "eu-central-1", "eu-north-1", "ap-northeast-1"}
    assert [r["availability"] for r in everything][len(rows):] == ["never"] * len(never)  # last

    table = cli("offers", "--gpu", "H100")
    assert table.returncode == 0 and "NOW" in table.stdout, table.both
    line = next(ln for ln in table.stdout.splitlines() if ln.startswith("h100.8x"))
    assert line.split()[-1] == "busy" and "never" not in table.stdout
    assert "never" in cli("offers", "--gpu", "H100", "--all").stdout

    # launch without --region: where the type would start now, not the cheapest region (us-east-1
    # prices L40S lowest, but no host there has one)
    make_hosts(region="eu-north-1", n=1, model="L40S", gpus=4)
    launched = cli("launch", "l40s.1x", "--name", "auto", "--json")
    assert launched.returncode == 0 and json.loads(launched.stdout)["region"] == "eu-north-1", launched.both
