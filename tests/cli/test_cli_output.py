"""What the terminal shows (issue 28): the server's text printed literally, whole names and ids
in listings, `ssh -i`, alarm periods in one unit, and help examples that keep their lines."""
from __future__ import annotations

import inspect
import json
import re
import subprocess

import pytest
from gpucloud_sdk import cli as gcli
from typer.testing import CliRunner

from scheduler.models import Workload
from tests.cli.test_cli import cli  # noqa: F401 (fixture)
from tests.frontend.conftest import celery_stack, fast_metering, sim_host  # noqa: F401 (fixtures)


def _commands(app, prefix=()):
    for info in app.registered_commands:
        name = info.name or info.callback.__name__.replace("_", "-")
        yield (*prefix, name), info
    for group in app.registered_groups:
        yield from _commands(group.typer_instance, (*prefix, group.name))


def test_every_help_example_keeps_its_own_line():
    """Walks every command: each example line of its docstring is one line of its --help."""
    runner = CliRunner()
    checked = 0
    for path, info in _commands(gcli.app):
        doc = inspect.getdoc(info.callback) or ""
        examples = [ln.strip() for ln in doc.splitlines() if ln.startswith("    ") and ln.strip()]
        if not examples:
            continue
        shown = runner.invoke(gcli.app, [*path, "--help"], env={"COLUMNS": "250", "NO_COLOR": "1"})
        assert shown.exit_code == 0, (path, shown.output)
        lines = {ln.strip() for ln in shown.output.splitlines()}
        for ex in examples:
            assert ex in lines, f"gpucloud {' '.join(path)} --help ran {ex!r} into other lines:\n{shown.output}"
        checked += 1
    assert checked >= 6  # login, launch, ssh, jobs submit, groups create, offers ...


def test_alarm_periods_are_read_as_a_person_writes_them():
    assert [gcli.period_seconds(x) for x in ("5m", "300s", "300", "1h", "2 min")] == [300, 300, 300, 3600, 120]
    assert [gcli.period_words(s) for s in (60, 300, 3600, 90)] == ["1 min", "5 min", "60 min", "90 s"]
    with pytest.raises(Exception, match="5m, 300s or 1h"):
        gcli.period_seconds("five minutes")


def test_ssh_identity_is_checked_before_anything_is_asked(cli, tmp_path):
    env = {"GPUCLOUD_URL": cli.url, "GPUCLOUD_API_KEY": "gpc_not_asked"}
    missing = cli("ssh", "nb", "-i", str(tmp_path / "nope"), "--dry-run", **env)
    assert missing.returncode == 2 and "no such key file" in missing.stderr, missing.both
    (tmp_path / "k.pub").write_text("ssh-ed25519 AAAA x\n")
    pub = cli("ssh", "nb", "--identity", str(tmp_path / "k.pub"), "--dry-run", **env)
    assert pub.returncode == 2 and "wants the private key" in pub.stderr, pub.both


def test_server_text_is_literal_and_listings_show_whole_names_and_ids(fast_metering, cli, sim_host, alice,
                                                                      tmp_path, settings):
    settings.GATEWAY_HOST_KEY_PATH = tmp_path / "gateway_host_key"  # no gateway ran: no fingerprint to pin
    sim_host(name="sim-h100-1", model="H100", gpus=8)
    env = {"GPUCLOUD_URL": cli.url, "GPUCLOUD_API_KEY": alice.key}
    name = "a-rather-long-instance-name-for-a-narrow-terminal"
    launched = cli("launch", "h100.1x", "--name", name, "--region", "us-east-1", "--wait", "--timeout", "60", **env)
    assert launched.returncode == 0, launched.both
    w = Workload.objects.get(name=name)

    # ssh -i: that key, offered alone
    key = tmp_path / "id_test"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    dry = cli("ssh", name, "-i", str(key), "--dry-run", **env)
    assert dry.returncode == 0, dry.both
    argv = dry.stdout.split()
    at = argv.index("-i")
    assert argv[at:at + 4] == ["-i", str(key), "-o", "IdentitiesOnly=yes"], dry.stdout
    assert argv[-1] == f"{w.pk}@127.0.0.1" and "StrictHostKeyChecking=yes" in argv, dry.stdout

    # the server's words, byte for byte: no emoji from `:zzz:`, no markup eaten from `[x]`
    reason = "pull of registry.example.com/x/y@sha256:zzz: failed [bold]x[/bold] :smile:"
    Workload.objects.filter(pk=w.pk).update(reason=reason)
    shown = cli("show", name, **env)
    assert shown.returncode == 0 and reason in shown.stdout, shown.stdout

    # a narrow terminal: the name and the id stay whole (other columns wrap)
    narrow = cli("ls", **env, COLUMNS="60")
    assert narrow.returncode == 0, narrow.both
    assert re.search(rf"^{re.escape(name)}\s", narrow.stdout, re.M) and str(w.pk) in narrow.stdout, narrow.stdout
    wide = cli("ls", "--wide", **env, COLUMNS="60")
    [row] = [ln for ln in wide.stdout.splitlines() if ln.startswith(name)]
    assert str(w.pk) in row and "running" in row and "us-east-1" in row  # one line per row
    assert json.loads(cli("ls", "--json", **env).stdout)[0]["id"] == str(w.pk)
