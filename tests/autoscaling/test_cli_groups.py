# ruff: noqa: F811 - fixtures imported from other test modules are used as arguments
"""`gpucloud groups …` against a live server, run in process (the CLI's `main`, real HTTP):
create with a target tracking policy, scale, show (members, policies, activity), delete."""
from __future__ import annotations

import json

import pytest
from gpucloud_sdk.cli import main

from autoscaling.models import AutoscalingGroup, ScalingPolicy
from autoscaling.reconcile import reconcile_group
from tests.agents.test_agent_api import region, triggered  # noqa: F401 (fixtures)
from tests.autoscaling.test_groups import prices  # noqa: F401 (fixture)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def gpucloud(live_server, alice, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("GPUCLOUD_URL", live_server.url)
    monkeypatch.setenv("GPUCLOUD_API_KEY", alice.key)
    monkeypatch.setenv("COLUMNS", "200")

    def run(*args: str):
        with pytest.raises(SystemExit) as done:
            main(list(args))
        captured = capsys.readouterr()
        return done.value.code, captured.out, captured.err

    return run


def test_groups_from_the_terminal(gpucloud, prices, alice):
    from tests.scheduler.fleet import make_hosts

    make_hosts(n=1)  # members no host could ever run are refused (unsatisfiable)
    code, out, err = gpucloud("groups", "create", "web", "--type", "h100.1x", "--region", "us-east-1", "--max", "3",
                              "--desired", "1", "--target-gpu-util", "60", "-e", "MODE=serve")
    assert code == 0, err
    group = AutoscalingGroup.objects.get(tenant=alice.tenant)
    assert "Created group web" in out and group.env == {"MODE": "serve"}
    assert ScalingPolicy.objects.get(group=group).target == 60
    code, out, err = gpucloud("groups", "scale", "web", "--desired", "2")
    assert code == 0 and "desired 2" in out, err
    reconcile_group(group.pk)
    code, out, err = gpucloud("groups", "show", "web", "--json")
    shown = json.loads(out)
    assert shown["desired"] == 2 and len(shown["members"]) == 2
    assert [p["name"] for p in shown["policies"]] == ["gpu-util"]
    assert any("desired 1 → 2 set by hand" in a["cause"] for a in shown["activities"])
    code, out, err = gpucloud("groups", "rm", "web")
    assert code == 0 and not AutoscalingGroup.objects.exists(), err
    code, out, err = gpucloud("groups", "show", "web")
    assert code == 3 and "No autoscaling group 'web'" in err
