"""``python -m agents.host install`` / ``uninstall``: the agent as a hardened systemd service.

``install --server URL --bootstrap-token T [--gateway-url URL] [--root DIR] [--no-start]``
writes two files and, on a live system, enables and starts the service:

    /etc/gpucloud-agent/agent.env             GPUCLOUD_* settings, mode 0600 (the token)
    /etc/systemd/system/gpucloud-agent.service

Both are compared byte for byte before writing, so running install twice changes nothing
(and restarts nothing). ``uninstall`` stops and disables the service and removes exactly
those files (and /etc/gpucloud-agent when it is left empty); the state directory
(/var/lib/gpucloud-agent, the host's identity, created by systemd's ``StateDirectory=``)
stays unless ``--purge``. ``--root DIR`` writes under a scratch root (packaging, tests) and
never calls systemctl; ``--no-start`` writes without calling it.

The unit runs the agent as root, because the egress rules need iptables (CAP_NET_ADMIN,
CAP_NET_RAW) and MIG management reads root-only NVML capability files, and then takes away
everything else it can: no other capability, a read-only system (the state directory and
the xtables lock aside), no /home, private /tmp, no kernel tunables or modules, native
system calls of the @system-service set only. Docker's socket (root:docker 0660) stays
reachable: root owns it, and connecting to a socket works on a read-only mount. Nothing
here makes the Docker socket itself less than root-equivalent: that is why the agent gives
containers no privileges (agents/host/docker.py).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

from agents.host.config import AgentConfig, ConfigError

UNIT_NAME: Final = "gpucloud-agent.service"
UNIT_PATH: Final = Path("etc/systemd/system") / UNIT_NAME
CONFIG_DIR: Final = Path("etc/gpucloud-agent")
ENV_PATH: Final = CONFIG_DIR / "agent.env"
STATE_DIR: Final = Path("var/lib/gpucloud-agent")  # systemd's StateDirectory=gpucloud-agent
# What ProtectHome=yes hides from the service: an agent installed there could not start.
_HIDDEN: Final = ("/home", "/root", "/run/user")
_SAFE_VALUE: Final = re.compile(r"^[^\s\"'\\$`]*$")  # EnvironmentFile needs no quoting then

Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]

UNIT_TEMPLATE: Final = """\
# Written by `python -m agents.host install`; `uninstall` removes it. See docs/agent.md.
[Unit]
Description=gpucloud host agent
After=network-online.target docker.service
Wants=network-online.target docker.service

[Service]
Type=simple
EnvironmentFile=/etc/gpucloud-agent/agent.env
{environment}ExecStart={exec_start}
Restart=on-failure
RestartSec=5s
# SIGTERM: the agent finishes its iteration; containers keep running across a restart.
KillMode=mixed
TimeoutStopSec=30s
StateDirectory=gpucloud-agent
StateDirectoryMode=0700
UMask=0077
NoNewPrivileges=yes
CapabilityBoundingSet=CAP_NET_ADMIN CAP_NET_RAW
ProtectSystem=strict
ReadWritePaths=-/run/xtables.lock -/run/lock
ProtectHome=yes
PrivateTmp=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
RestrictSUIDSGID=yes
RestrictRealtime=yes
RestrictNamespaces=yes
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK
LockPersonality=yes
SystemCallArchitectures=native
SystemCallFilter=@system-service
SystemCallErrorNumber=EPERM

[Install]
WantedBy=multi-user.target
"""


class InstallError(ValueError):
    pass


def _run(args: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=60, check=False)


def source_root() -> Path:
    """The directory holding the ``agents`` package this agent runs from."""
    return Path(__file__).resolve().parents[2]


def default_exec_start() -> tuple[str, dict[str, str]]:
    """(ExecStart, extra environment): the installed ``gpucloud-agent`` command if there is
    one, else this interpreter running ``-m agents.host`` from this checkout."""
    command = shutil.which("gpucloud-agent")
    if command:
        return command, {}
    return f"{sys.executable} -m agents.host", {"PYTHONPATH": str(source_root())}


def env_file(server: str, bootstrap_token: str, gateway_url: str, extra: Sequence[str]) -> str:
    """The EnvironmentFile (pure). Values are checked to need no quoting."""
    pairs = [("GPUCLOUD_SERVER", server), ("GPUCLOUD_BOOTSTRAP_TOKEN", bootstrap_token)]
    if gateway_url:
        pairs.append(("GPUCLOUD_GATEWAY_URL", gateway_url))
    pairs.append(("GPUCLOUD_STATE_DIR", "/" + str(STATE_DIR)))
    for item in extra:
        key, sep, value = item.partition("=")
        if not sep or not re.fullmatch(r"GPUCLOUD_[A-Z0-9_]+", key):
            raise InstallError(f"--set {item!r}: expected GPUCLOUD_<NAME>=<value>")
        pairs.append((key, value))
    for key, value in pairs:
        if not _SAFE_VALUE.match(value):
            raise InstallError(f"{key}: whitespace, quotes, '$', '`' and '\\' are not allowed")
    body = "".join(f"{k}={v}\n" for k, v in pairs)
    return "# Written by `python -m agents.host install` (mode 0600: it holds a token).\n" + body


def unit_file(exec_start: str, environment: dict[str, str]) -> str:
    """The systemd unit (pure)."""
    for path in shlex.split(exec_start)[:1] + list(environment.values()):
        if path.startswith(_HIDDEN):
            raise InstallError(f"{path} is under {', '.join(_HIDDEN)}, which ProtectHome= hides "
                               "from the service: install the agent elsewhere (e.g. /opt/gpucloud)")
    env = "".join(f"Environment={k}={v}\n" for k, v in sorted(environment.items()))
    return UNIT_TEMPLATE.format(exec_start=exec_start, environment=env)


def _write(path: Path, text: str, mode: int) -> bool:
    """Write ``text`` unless the file already holds exactly it; True when something changed."""
    data = text.encode()
    changed = False
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    if not path.exists() or path.read_bytes() != data:
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        changed = True
    if (path.stat().st_mode & 0o777) != mode:
        path.chmod(mode)
        changed = True
    return changed


def _systemctl(run: Runner, *args: str) -> None:
    r = run(["systemctl", *args])
    if r.returncode != 0:
        raise InstallError(f"systemctl {' '.join(args)}: {(r.stderr or r.stdout).strip()}")


def install(*, root: Path, server: str, bootstrap_token: str, gateway_url: str = "",
            exec_start: str = "", extra_env: Sequence[str] = (), start: bool = True,
            run: Runner = _run) -> list[str]:
    """Write the env file and the unit under ``root``; start unless told not to. Returns
    what it did, one line each."""
    try:
        AgentConfig(server=server, bootstrap_token=bootstrap_token, gateway_url=gateway_url,
                    hostname="install").validated()
    except ConfigError as e:
        raise InstallError(str(e)) from None
    if not bootstrap_token:
        raise InstallError("--bootstrap-token is required (the control plane's one-time token)")
    environment: dict[str, str] = {}
    if not exec_start:
        exec_start, environment = default_exec_start()
    env_text = env_file(server.rstrip("/"), bootstrap_token, gateway_url, extra_env)
    unit_text = unit_file(exec_start, environment)

    done = []
    config_dir = root / CONFIG_DIR
    config_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    changed_env = _write(root / ENV_PATH, env_text, 0o600)
    changed_unit = _write(root / UNIT_PATH, unit_text, 0o644)
    done.append(f"{'wrote' if changed_env else 'unchanged'} /{ENV_PATH} (0600)")
    done.append(f"{'wrote' if changed_unit else 'unchanged'} /{UNIT_PATH}")
    if start:
        if changed_unit:
            _systemctl(run, "daemon-reload")
        _systemctl(run, "enable", "--now", UNIT_NAME)
        if changed_env or changed_unit:
            _systemctl(run, "try-restart", UNIT_NAME)  # a running agent picks up the change
        done.append(f"enabled and started {UNIT_NAME}")
    return done


def uninstall(*, root: Path, start: bool = True, purge: bool = False, run: Runner = _run) -> list[str]:
    """Stop and disable the service, remove what install wrote. Idempotent."""
    done = []
    unit = root / UNIT_PATH
    if start and unit.exists():
        _systemctl(run, "disable", "--now", UNIT_NAME)
        done.append(f"stopped and disabled {UNIT_NAME}")
    for path in (unit, root / ENV_PATH):
        if path.exists():
            path.unlink()
            done.append(f"removed /{path.relative_to(root)}")
    config_dir = root / CONFIG_DIR
    if config_dir.is_dir() and not any(config_dir.iterdir()):
        config_dir.rmdir()
        done.append(f"removed /{CONFIG_DIR}")
    if start and done:
        _systemctl(run, "daemon-reload")
    state = root / STATE_DIR
    if state.exists():
        if purge:
            shutil.rmtree(state)
            done.append(f"removed /{STATE_DIR} (this host's identity: it registers anew)")
        else:
            done.append(f"kept /{STATE_DIR} (this host's identity; --purge removes it)")
    return done


def main(argv: Sequence[str], run: Runner = _run) -> int:
    p = argparse.ArgumentParser(prog="python -m agents.host", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    i = sub.add_parser("install", help="write the config and systemd unit; enable and start it")
    i.add_argument("--server", required=True, help="control plane URL")
    i.add_argument("--bootstrap-token", required=True, help="one-time registration token")
    i.add_argument("--gateway-url", default="", help="gateway tunnel URL(s), ws(s)://…")
    i.add_argument("--set", action="append", default=[], metavar="GPUCLOUD_NAME=VALUE",
                   help="another agent setting for the env file (repeatable)")
    i.add_argument("--exec-start", default="", help="the agent command (default: gpucloud-agent, "
                   "else this Python with -m agents.host)")
    u = sub.add_parser("uninstall", help="stop, disable and remove what install wrote")
    u.add_argument("--purge", action="store_true", help="also remove the state dir (the host's identity)")
    for sp in (i, u):
        sp.add_argument("--root", type=Path, help="install under this scratch root; never calls systemctl")
        sp.add_argument("--no-start", action="store_true", help="write files only; no systemctl")
    ns = p.parse_args(list(argv))
    root = ns.root or Path("/")
    start = ns.root is None and not ns.no_start
    try:
        if ns.command == "install":
            done = install(root=root, server=ns.server, bootstrap_token=ns.bootstrap_token,
                           gateway_url=ns.gateway_url, exec_start=ns.exec_start, extra_env=ns.set,
                           start=start, run=run)
        else:
            done = uninstall(root=root, start=start, purge=ns.purge, run=run)
    except (InstallError, OSError) as e:
        print(f"{ns.command}: {e}", file=sys.stderr)
        return 2
    for line in done or ["nothing to do"]:
        print(line)
    return 0
