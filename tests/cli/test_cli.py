"""The real `gpucloud` console script, run as a subprocess against a live server on the test database.

The journey: login (a bad key first), whoami, offers, launch --wait to RUNNING on a simulated host
(a real agent process; a real Celery worker and beat schedule it), ls/show --json, logs, the
start refused while it runs, a volume attached at launch,
a job to SUCCEEDED, stop, start again, rm, usage, keys; the exit codes of the error paths (1 API error,
2 usage error, 3 not found, 4 --wait timeout).
"""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.agents.test_agent_api import make_sim_host, region, triggered  # noqa: F401 (fixtures)
from tests.frontend.conftest import celery_stack, fast_metering, sim_host  # noqa: F401 (fixtures)
from tests.gateway.test_gateway_ssh import keypair, running  # noqa: F401 (running: a fixture)

ROOT = Path(__file__).resolve().parents[2]
GPUCLOUD = Path(sys.executable).parent / "gpucloud"  # the console script `make` installs


@pytest.fixture
def cli(tmp_path, live_server):
    assert GPUCLOUD.exists(), f"{GPUCLOUD} is missing: `make test` installs it (pip install -e ./sdk)"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUCLOUD_", "XDG_CONFIG"))}
    env.update(HOME=str(tmp_path), PYTHONPATH=str(ROOT / "sdk"), COLUMNS="200", NO_COLOR="1")

    def run(*args: str, stdin: str | None = None, timeout: float = 90, **extra: str):
        t0 = time.monotonic()
        done = subprocess.run([str(GPUCLOUD), *args], env={**env, **extra}, input=stdin, capture_output=True,
                              text=True, timeout=timeout, cwd=tmp_path)
        print(f"gpucloud {' '.join(args)[:60]}: rc {done.returncode} in {time.monotonic() - t0:.1f} s")
        done.both = done.stdout + done.stderr
        return done

    run.config = tmp_path / ".config" / "gpucloud" / "config.toml"
    run.url = live_server.url
    return run


def test_a_user_rents_a_gpu_and_runs_a_job_from_the_terminal(fast_metering, cli, sim_host, alice, tmp_path, settings):
    settings.GATEWAY_HOST_KEY_PATH = tmp_path / "gateway_host_key"  # no gateway ran: no fingerprint to pin
    sim_host(name="sim-h100-1", model="H100", gpus=8)

    # a bad key: exit 1 with the API's message, nothing saved, the key not echoed
    bad = cli("login", "--url", cli.url, "--api-key", "gpc_wrong_key_123")
    assert bad.returncode == 1, bad.both
    assert "This API key is unknown, revoked or expired." in bad.stderr
    assert "gpc_wrong_key_123" not in bad.both and not cli.config.exists()
    assert cli("ls").returncode == 2  # not logged in: a usage error

    ok = cli("login", "--url", cli.url, "--api-key", alice.key)
    assert ok.returncode == 0, ok.both
    assert "Acme" in ok.stdout and alice.key not in ok.both
    assert stat.S_IMODE(cli.config.stat().st_mode) == 0o600
    me = json.loads(cli("whoami", "--json").stdout)
    assert me["tenant"]["name"] == "Acme" and me["url"] == cli.url and alice.key not in json.dumps(me)

    offers = json.loads(cli("offers", "--gpu", "H100", "--region", "us-east-1", "--json").stdout)
    assert {o["instance_type"] for o in offers} == {"h100.1x", "h100.2x", "h100.4x", "h100.8x"}
    assert [float(o["per_hour"]) for o in offers] == sorted(float(o["per_hour"]) for o in offers)
    assert all(isinstance(o["available"], int) for o in offers), offers  # FREE: the availability API
    table = cli("offers", "--gpu", "H100")
    assert table.returncode == 0 and "h100.8x" in table.stdout and "PER TFLOPS-H" in table.stdout
    free = json.loads(cli("offers", "--available", "--json").stdout)
    assert free and all(o["available"] > 0 for o in free)

    made = cli("volumes", "create", "data", "--size", "10", "--region", "us-east-1")
    assert made.returncode == 0 and "Created volume data" in made.stdout, made.both
    launched = cli("launch", "h100.1x", "--name", "nb", "--region", "us-east-1", "--port", "8888", "--wait",
                   "--timeout", "60", "--volume", "data:/workspace")
    assert launched.returncode == 0, launched.both
    assert "nb is running on sim-h100-1" in launched.stdout
    assert "pending" in launched.stderr  # the progress line went through pending
    listed = json.loads(cli("ls", "--json").stdout)
    assert [(w["name"], w["state"], w["host"]) for w in listed] == [("nb", "running", "sim-h100-1")]
    shown = json.loads(cli("show", "nb", "--json").stdout)
    assert shown["id"] == listed[0]["id"] and shown["ports"] == [8888]
    assert [e["to_state"] for e in shown["events"]][-1] == "running"
    logs = cli("logs", "nb")
    assert logs.returncode == 0 and "started ubuntu:24.04" in logs.stdout, logs.both
    assert "at /workspace" in logs.stdout, logs.both  # the sim runtime mounted the volume
    vol = cli("volumes", "show", "data")
    assert vol.returncode == 0 and "instance nb at /workspace" in vol.stdout and "sim-h100-1" in vol.stdout, vol.both
    busy = cli("volumes", "rm", "data")  # attached: refused, exit 1 with the API's words
    assert busy.returncode == 1 and "is attached to instance 'nb'" in busy.stderr, busy.both

    # what this server does not have yet answers clearly (exit 1), not with a traceback
    # ssh: the command line it execs comes from the instance's `connect` (the gateway itself is tested
    # end to end in tests/gateway/; none runs here): the gateway's port, the instance id as user, strict keys
    shown_id = shown["id"]
    dry = cli("ssh", "nb", "--dry-run", "--", "echo", "hi")
    assert dry.returncode == 0, dry.both
    argv = dry.stdout.split()
    assert argv[:3] == ["ssh", "-p", "2222"] and "StrictHostKeyChecking=yes" in argv, dry.both
    assert f"{shown_id}@127.0.0.1" in argv and argv[-2:] == ["echo", "hi"], dry.both
    for args, said in ((["start", "nb"], "Only a stopped instance can start; nb is running."),):
        done = cli(*args)
        assert done.returncode == 1 and said in done.stderr, (args, done.both)

    job = cli("jobs", "submit", "--type", "h100.1x", "--image", "alpine", "--region", "us-east-1", "--name", "j1",
              "--env", "GPUCLOUD_SIM_DURATION_S=1", "--wait", "--timeout", "60", "--json", "--", "echo", "hi")
    assert job.returncode == 0, job.both
    assert json.loads(job.stdout)["state"] == "succeeded"
    assert [j["name"] for j in json.loads(cli("jobs", "ls", "--json").stdout)] == ["j1"]

    stopped = cli("stop", "nb", "--wait", "--timeout", "60", "--json")
    assert stopped.returncode == 0 and json.loads(stopped.stdout)["state"] == "stopped", stopped.both
    started = cli("start", "nb", "--json")  # back through the queue with the same configuration
    assert started.returncode == 0, started.both
    again = json.loads(started.stdout)
    assert again["state"] in ("pending", "scheduled", "starting", "running") and again["ports"] == [8888]
    # a volume stays attached until its instance has stopped (rm only asks the agent to stop it)
    assert cli("stop", "nb", "--wait", "--timeout", "60").returncode == 0
    assert cli("rm", "nb").returncode == 0
    assert cli("volumes", "rm", "data").returncode == 0  # detached by the stop: deleted
    assert json.loads(cli("ls", "--json").stdout) == []

    usage = json.loads(cli("usage", "--json").stdout)
    assert usage["group_by"] == "instance_type" and "total" in usage and isinstance(usage["rows"], list)
    assert cli("usage", "--month", "2025-13").returncode == 2

    created = cli("keys", "create", "ci", "--scope", "read")
    assert created.returncode == 0 and created.stdout.strip().splitlines()[-1].startswith("gpc_")
    assert "ci" in [k["name"] for k in json.loads(cli("keys", "ls", "--json").stdout)]
    assert cli("keys", "revoke", "ci").returncode == 0

    # SSH keys: the file's key is added with the fingerprint ssh-keygen gives it, then removed.
    keyfile = tmp_path / "laptop"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keyfile)], check=True)
    fingerprint = subprocess.run(["ssh-keygen", "-lf", f"{keyfile}.pub"], capture_output=True, text=True,
                                 check=True).stdout.split()[1]
    added = cli("ssh-keys", "add", f"{keyfile}.pub", "--name", "laptop", "--json")
    assert added.returncode == 0 and json.loads(added.stdout)["fingerprint"] == fingerprint, added.both
    assert [k["name"] for k in json.loads(cli("ssh-keys", "ls", "--json").stdout)] == ["laptop"]
    assert cli("ssh-keys", "rm", fingerprint).returncode == 0
    assert json.loads(cli("ssh-keys", "ls", "--json").stdout) == []


def test_exit_codes_of_the_error_paths(cli, alice, catalog):
    env = {"GPUCLOUD_URL": cli.url, "GPUCLOUD_API_KEY": alice.key}  # the environment instead of a profile
    missing = cli("show", "no-such-instance", **env)
    assert missing.returncode == 3 and "No instance named 'no-such-instance'" in missing.stderr
    # no host could ever run it: refused at once (409 unsatisfiable), exit 1, the reason said
    refused = cli("launch", "h100.1x", "--name", "never", "--region", "eu-central-1", **env)
    assert refused.returncode == 1 and "the fleet has no H100 GPUs in eu-central-1" in refused.stderr, refused.both
    # nothing can place it now (its only host is down, and may come back): --wait gives up with exit 4
    from tests.scheduler.fleet import make_hosts

    [host] = make_hosts(region="eu-central-1", n=1)
    type(host).objects.filter(pk=host.pk).update(state="down")
    waited = cli("launch", "h100.1x", "--name", "stuck", "--region", "eu-central-1", "--wait", "--timeout", "2",
                 **env)
    assert waited.returncode == 4, waited.both
    assert "still pending after 2 s" in waited.stderr
    # two instances of one name: naming it is a usage error that lists both
    assert cli("launch", "h100.1x", "--name", "stuck", "--region", "eu-central-1", **env).returncode == 0
    ambiguous = cli("stop", "stuck", **env)
    assert ambiguous.returncode == 2 and "2 instances are named 'stuck'" in ambiguous.stderr
    ids = [w["id"] for w in json.loads(cli("ls", "--json", **env).stdout)]
    assert len(ids) == 2 and all(cli("rm", i, **env).returncode == 0 for i in ids)
    # the API's validation message and its fields, exit 1
    bad = cli("launch", "h100.1x", "--region", "us-east-1", "--image", "NOT AN IMAGE", **env)
    assert bad.returncode == 1 and "image: Not a container image reference." in bad.stderr, bad.both
    # usage errors: exit 2
    assert cli("launch", **env).returncode == 2
    assert cli("launch", "h100.1x", "--max-price", "1", **env).returncode == 2
    assert cli("no-such-command").returncode == 2
    assert cli("--help").returncode == 0 and "gpucloud launch" in cli("launch", "--help").stdout
    # a key given on the command line is never echoed, not even in an error
    bad_key = cli("ls", GPUCLOUD_URL=cli.url, GPUCLOUD_API_KEY="gpc_leak_me")
    assert bad_key.returncode == 1 and "gpc_leak_me" not in bad_key.both


def test_ssh_and_forward_exec_ssh_through_the_gateway_with_a_pinned_host_key(tmp_path, monkeypatch):
    """The command lines `gpucloud ssh` / `forward` exec, from an instance's `connect` object
    (the gateway's contract); the host key pinned by its fingerprint, checked strictly."""
    from gpucloud_sdk import cli as gcli

    monkeypatch.setenv("GPUCLOUD_CONFIG", str(tmp_path / "config.toml"))
    keyfile = tmp_path / "gw"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keyfile)], check=True)
    pub = (tmp_path / "gw.pub").read_text().strip()
    listed = subprocess.run(["ssh-keygen", "-lf", str(tmp_path / "gw.pub")], capture_output=True, text=True,
                            check=True).stdout.split()[1]
    assert gcli.fingerprint(pub) == listed  # the same fingerprint OpenSSH prints
    connect = {"ssh": "ssh -p 2222 abc@gw.example", "ssh_host": "gw.example", "ssh_port": 2222,
               "ssh_user": "abc", "host_key_fingerprint": listed, "urls": {}}
    known = gcli.pin_host_key(connect, keyscan=lambda host, port: ["ssh-rsa AAAAB3NzaC1yc2EAAAADAQAB", pub])
    assert known.read_text() == f"[gw.example]:2222 {' '.join(pub.split()[:2])}\n"
    assert stat.S_IMODE(known.stat().st_mode) == 0o600
    assert gcli.ssh_argv(connect, known, command=["echo", "hi"]) == [
        "ssh", "-p", "2222", "-o", f"UserKnownHostsFile={known}", "-o", "StrictHostKeyChecking=yes",
        "abc@gw.example", "--", "echo", "hi"]
    assert gcli.ssh_argv(connect, known, extra=["-N", "-L", "127.0.0.1:8888:127.0.0.1:8888"])[-4:] == [
        "-N", "-L", "127.0.0.1:8888:127.0.0.1:8888", "abc@gw.example"]
    # a gateway showing another key is refused
    with pytest.raises(gcli.Exit) as e:
        gcli.pin_host_key(connect, keyscan=lambda host, port: ["ssh-rsa AAAAB3NzaC1yc2EAAAADAQAB"])
    assert e.value.code == 1 and "refusing to connect" in e.value.message


def test_gpucloud_ssh_runs_a_command_through_a_real_gateway(cli, running, alice, tmp_path, settings):  # noqa: F811
    """Issue 16's acceptance: `gpucloud ssh NAME -- 'echo hi'` end to end. The gateway, its agent
    tunnel and the instance are tests/gateway's (`running`: the simulated runtime's fake shell);
    the key is offered by an ssh-agent (OpenSSH reads ~/.ssh from the passwd entry, not $HOME)."""
    sim, w, gw = running
    settings.GATEWAY_PUBLIC_SSH_PORT = gw.gw.ssh_port
    settings.GATEWAY_HOST_KEY_PATH = gw.config.host_key_path  # the fingerprint the CLI pins
    key, pub = keypair(tmp_path, "laptop")
    agent_sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(agent_sock)], stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not agent_sock.exists():
            assert time.monotonic() < deadline, "ssh-agent did not start"
            time.sleep(0.02)
        subprocess.run(["ssh-add", "-q", str(key)], env={**os.environ, "SSH_AUTH_SOCK": str(agent_sock)},
                       check=True, timeout=10)
        env = {"GPUCLOUD_URL": cli.url, "GPUCLOUD_API_KEY": alice.key, "SSH_AUTH_SOCK": str(agent_sock)}
        assert cli("ssh-keys", "add", str(tmp_path / "laptop.pub"), "--name", "laptop", **env).returncode == 0
        done = cli("ssh", w.name, "--", "echo hi-$((6*7)); exit 3", **env)
        assert (done.stdout, done.returncode) == ("hi-42\n", 3), done.both
        assert (tmp_path / ".config" / "gpucloud" / "known_hosts").read_text().count("ssh-ed25519") == 1
    finally:
        agent.terminate()
        agent.wait(5)
