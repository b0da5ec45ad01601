"""``python -m agents.host install`` / ``uninstall`` into a scratch root.

The unit is checked by the real ``systemd-analyze verify --root=<scratch root>``. That needs
two things a real host has and an empty directory lacks: systemd's own units (the default
dependencies, sysinit.target and friends: copied from this machine's /lib/systemd/system),
and the ExecStart binary, which verify looks up inside the root: the tests install with
``--exec-start /usr/bin/gpucloud-agent`` and put an executable there, as a package would.
systemctl is not run (this machine's PID 1 is not systemd): ``--root`` never calls it, and
the live path's calls are recorded through the runner seam.
"""

from __future__ import annotations

import shutil
import stat
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from agents.host import install

ROOT = Path(__file__).resolve().parents[3]
AGENT = "/usr/bin/gpucloud-agent"


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    shutil.copytree("/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
    (root / "etc/systemd/system").mkdir(parents=True)  # as on any systemd host
    binary = root / AGENT.lstrip("/")
    binary.parent.mkdir(parents=True, exist_ok=True)
    binary.write_text("#!/bin/sh\nexit 0\n")
    binary.chmod(0o755)
    return root


def snapshot(root: Path, dir_mtimes: bool = True) -> dict[str, tuple[bytes, int, int]]:
    """Every path under ``root``: contents, mode, mtime (a directory's changes when an entry
    comes and goes, so uninstall's comparison leaves those out)."""
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        is_file = p.is_file() and not p.is_symlink()
        out[str(p.relative_to(root))] = (p.read_bytes() if is_file else b"", stat.S_IMODE(st.st_mode),
                                         st.st_mtime_ns if is_file or dir_mtimes else 0)
    return out


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agents.host", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)


def install_args(root: Path, *extra: str) -> list[str]:
    return ["install", "--root", str(root), "--server", "https://cp.example.com/",
            "--bootstrap-token", "bt_secret123", "--exec-start", AGENT, *extra]


def test_install_writes_a_unit_systemd_analyze_accepts(scratch):
    r = cli(*install_args(scratch, "--gateway-url", "wss://gw.example.com/tunnel"))
    assert r.returncode == 0, r.stderr
    unit = scratch / "etc/systemd/system/gpucloud-agent.service"
    v = subprocess.run(["systemd-analyze", "verify", f"--root={scratch}", "gpucloud-agent.service"],
                       capture_output=True, text=True, timeout=60, check=False)
    assert (v.returncode, v.stdout + v.stderr) == (0, "")
    text = unit.read_text()
    for line in ("NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=yes", "PrivateTmp=yes",
                 "ProtectKernelTunables=yes", "ProtectKernelModules=yes", "RestrictSUIDSGID=yes",
                 "LockPersonality=yes", "SystemCallArchitectures=native",
                 "CapabilityBoundingSet=CAP_NET_ADMIN CAP_NET_RAW", "StateDirectory=gpucloud-agent",
                 "Restart=on-failure", f"ExecStart={AGENT}", "EnvironmentFile=/etc/gpucloud-agent/agent.env"):
        assert line in text.splitlines(), line
    env = scratch / "etc/gpucloud-agent/agent.env"
    assert stat.S_IMODE(env.stat().st_mode) == 0o600
    assert stat.S_IMODE(env.parent.stat().st_mode) == 0o700
    assert env.read_text().splitlines()[1:] == [
        "GPUCLOUD_SERVER=https://cp.example.com",
        "GPUCLOUD_BOOTSTRAP_TOKEN=bt_secret123",
        "GPUCLOUD_GATEWAY_URL=wss://gw.example.com/tunnel",
        "GPUCLOUD_STATE_DIR=/var/lib/gpucloud-agent",
    ]


def test_systemd_analyze_verify_rejects_a_broken_unit(scratch):
    """The verify step the tests rely on does catch a unit whose command is missing."""
    assert cli(*install_args(scratch)).returncode == 0
    (scratch / AGENT.lstrip("/")).unlink()
    v = subprocess.run(["systemd-analyze", "verify", f"--root={scratch}", "gpucloud-agent.service"],
                       capture_output=True, text=True, timeout=60, check=False)
    assert v.returncode != 0
    assert "gpucloud-agent" in v.stderr


def test_install_twice_changes_nothing(scratch):
    assert cli(*install_args(scratch)).returncode == 0
    before = snapshot(scratch)
    r = cli(*install_args(scratch))
    assert r.returncode == 0
    assert snapshot(scratch) == before
    assert r.stdout.splitlines() == [
        "unchanged /etc/gpucloud-agent/agent.env (0600)",
        "unchanged /etc/systemd/system/gpucloud-agent.service",
    ]


def test_uninstall_removes_exactly_what_install_wrote(scratch):
    before = snapshot(scratch, dir_mtimes=False)
    assert cli(*install_args(scratch)).returncode == 0
    (scratch / "var/lib/gpucloud-agent").mkdir(parents=True)  # what systemd and the agent make
    (scratch / "var/lib/gpucloud-agent/host.json").write_text("{}")
    r = cli("uninstall", "--root", str(scratch))
    assert r.returncode == 0, r.stderr
    assert "kept /var/lib/gpucloud-agent" in r.stdout
    shutil.rmtree(scratch / "var")
    assert snapshot(scratch, dir_mtimes=False) == before
    again = cli("uninstall", "--root", str(scratch))
    assert (again.returncode, again.stdout) == (0, "nothing to do\n")


def test_bad_input_writes_nothing(scratch):
    before = snapshot(scratch)
    for args in (
        ["install", "--root", str(scratch), "--server", "ftp://x", "--bootstrap-token", "t"],
        ["install", "--root", str(scratch), "--server", "https://x", "--bootstrap-token", "t x"],
        ["install", "--root", str(scratch), "--server", "https://x", "--bootstrap-token", "t",
         "--gateway-url", "http://not-a-tunnel"],
        ["install", "--root", str(scratch), "--server", "https://x", "--bootstrap-token", "t",
         "--set", "PATH=/tmp"],
    ):
        r = cli(*args)
        assert r.returncode == 2, args
        assert r.stderr.startswith("install: ")
    assert snapshot(scratch) == before


def test_default_command_runs_this_checkout_and_refuses_hidden_homes():
    unit = install.unit_file(f"{sys.executable} -m agents.host", {"PYTHONPATH": str(ROOT)})
    assert f"ExecStart={sys.executable} -m agents.host" in unit.splitlines()
    assert f"Environment=PYTHONPATH={ROOT}" in unit.splitlines()
    with pytest.raises(install.InstallError, match="ProtectHome"):
        install.unit_file("/home/ops/venv/bin/gpucloud-agent", {})


def test_live_install_enables_starts_and_restarts_only_on_change(tmp_path):
    calls: list[list[str]] = []

    def systemctl(args: Sequence[str]) -> subprocess.CompletedProcess[str]:
        calls.append(list(args))
        return subprocess.CompletedProcess(list(args), 0, "", "")

    kw = {"root": tmp_path, "server": "https://cp", "bootstrap_token": "t", "exec_start": AGENT, "run": systemctl}
    install.install(**kw)  # type: ignore[arg-type]
    assert calls == [["systemctl", "daemon-reload"], ["systemctl", "enable", "--now", "gpucloud-agent.service"],
                     ["systemctl", "try-restart", "gpucloud-agent.service"]]
    calls.clear()
    install.install(**kw)  # type: ignore[arg-type]
    assert calls == [["systemctl", "enable", "--now", "gpucloud-agent.service"]]
    calls.clear()
    install.uninstall(root=tmp_path, run=systemctl)
    assert calls == [["systemctl", "disable", "--now", "gpucloud-agent.service"], ["systemctl", "daemon-reload"]]
    assert not (tmp_path / "etc/gpucloud-agent").exists()
