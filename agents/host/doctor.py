"""``python -m agents.host doctor``: is this machine fit to take tenants' work?

Each check is a small function ``(ctx) -> Check`` returning pass / warn / fail, what it saw
and what to do. The checks take the agent's own flags (``--server``, ``--gpu-backend``,
``--runtime`` ...) so they check what that agent would use: with ``--gpu-backend sim`` the
GPU checks pass as simulated, with ``--runtime sim`` the Docker checks are not needed.

Output: a table, or with ``--json`` exactly ``{"checks": [{"name", "status", "detail",
"fix"}]}``. Exit 0 when every check passes, 1 when any warns, 2 when any fails (and 2 for
bad flags).

Everything a check touches is reached through ``Probes`` (the NVML / AMD SMI modules, the
Docker client, subprocesses, file locations) so tests hand in fakes only for the hardware
this machine lacks and use the real Docker engine, iptables, sysfs and sockets otherwise.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib
import json
import re
import shutil
import socket
import ssl
import subprocess
import sys
import tomllib
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Final, Literal
from urllib.parse import urlsplit

from agents.host import gpucheck
from agents.host.amdsmi import AmdSmiBackend
from agents.host.config import AgentConfig, ConfigError, docker_gpu_mode, parse_args
from agents.host.docker import disk_quota_support
from agents.host.nvml import NvmlBackend

Status = Literal["pass", "warn", "fail"]
EXIT_CODES: Final[dict[str, int]] = {"pass": 0, "warn": 1, "fail": 2}

# CVE-2025-23266 ("NVIDIAScape", NVIDIA security bulletin of July 2025): the toolkit's
# enable-cuda-compat createContainer hook ran with the container's environment, so an image
# setting LD_PRELOAD ran code as root on the host. Fixed in 1.17.8 (GPU Operator 25.3.1); the
# bulletin's stop-gap for older versions (features.disable-cuda-compat-lib-hook) was found
# bypassable (NVIDIA/nvidia-container-toolkit#1208), so every version up to 1.17.7 fails.
TOOLKIT_FIXED: Final = (1, 17, 8)
TOOLKIT_CONFIG: Final = Path("/etc/nvidia-container-runtime/config.toml")
DOCKER_MIN: Final = (19, 3)  # DeviceRequests (GPUs by UUID) arrived in API 1.40 / 19.03
DOCKER_WARN_BELOW: Final = (20, 10)  # cgroup v2 support
GIB: Final = 1024**3
DISK_FAIL_GIB: Final = 10  # below this a single CUDA image does not fit
DISK_WARN_GIB: Final = 50
# NVIDIA PCI vendor id and the PCI class NVSwitches report (bridge, "other": 0x0680xx).
_NVIDIA_VENDOR: Final = "0x10de"
_NVSWITCH_CLASS: Final = "0x0680"
FABRIC_MANAGER_UNIT: Final = "nvidia-fabricmanager"

# adjtimex(2): clock state TIME_ERROR and status bit STA_UNSYNC mean "not disciplined by NTP".
_TIME_ERROR: Final = 5
_STA_UNSYNC: Final = 0x0040


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    fix: str = ""


def _run(args: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=15, check=False)


class _Timeval(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_usec", ctypes.c_long)]


class _Timex(ctypes.Structure):
    """Linux ``struct timex`` (include/uapi/linux/timex.h): 208 bytes on 64-bit."""

    _fields_ = [
        ("modes", ctypes.c_uint),
        ("offset", ctypes.c_long),
        ("freq", ctypes.c_long),
        ("maxerror", ctypes.c_long),
        ("esterror", ctypes.c_long),
        ("status", ctypes.c_int),
        ("constant", ctypes.c_long),
        ("precision", ctypes.c_long),
        ("tolerance", ctypes.c_long),
        ("time", _Timeval),
        ("tick", ctypes.c_long),
        ("ppsfreq", ctypes.c_long),
        ("jitter", ctypes.c_long),
        ("shift", ctypes.c_int),
        ("stabil", ctypes.c_long),
        ("jitcnt", ctypes.c_long),
        ("calcnt", ctypes.c_long),
        ("errcnt", ctypes.c_long),
        ("stbcnt", ctypes.c_long),
        ("tai", ctypes.c_int),
        ("_pad", ctypes.c_int * 11),
    ]


def adjtimex() -> tuple[int, int, int]:
    """(clock state, status bits, max error in µs) from the kernel; modes=0 only reads."""
    t = _Timex()
    state = int(ctypes.CDLL(None, use_errno=True).adjtimex(ctypes.byref(t)))
    if state < 0:
        raise OSError(ctypes.get_errno(), "adjtimex failed")
    return state, int(t.status), int(t.maxerror)


def _docker_client() -> Any:
    return importlib.import_module("docker").from_env(timeout=15)


@dataclass
class Probes:
    """Where the checks look. The defaults are this machine's."""

    nvml: Callable[[], Any] = lambda: importlib.import_module("pynvml")
    amdsmi: Callable[[], Any] = lambda: importlib.import_module("amdsmi")
    docker: Callable[[], Any] = _docker_client
    run: Callable[[Sequence[str]], subprocess.CompletedProcess[str]] = _run
    which: Callable[[str], str | None] = shutil.which
    toolkit_config: Path = TOOLKIT_CONFIG
    sysfs: Path = Path("/sys")
    dev: Path = Path("/dev")
    clock: Callable[[], tuple[int, int, int]] = adjtimex
    disk_gib: tuple[int, int] = (DISK_FAIL_GIB, DISK_WARN_GIB)  # (fail below, warn below)
    timeout_s: float = 5.0


@dataclass
class Options:
    """Doctor-only flags (the rest are the agent's own)."""

    gvisor: bool = False
    as_json: bool = False


class Context:
    """What the checks share: the config, the probes, and each expensive probe done once."""

    def __init__(self, cfg: AgentConfig, probes: Probes, options: Options) -> None:
        self.cfg = cfg
        self.probes = probes
        self.options = options

    @property
    def gpu_mode(self) -> str:
        """The docker runtime's GPU mode for this config (``config.docker_gpu_mode``, as the agent uses)."""
        return docker_gpu_mode(self.cfg) if self.cfg.runtime == "docker" else "none"

    @cached_property
    def nvml(self) -> tuple[Any, Any, str | None]:
        """(pynvml module, NvmlBackend, None) or (None, None, why NVML cannot be used)."""
        try:
            module = self.probes.nvml()
        except ImportError as e:
            return None, None, f"pynvml not installed ({e})"
        try:
            backend = NvmlBackend(module)
        except module.NVMLError_LibraryNotFound:
            return module, None, "NVML library not found / no NVIDIA driver"
        except module.NVMLError_DriverNotLoaded:
            return module, None, "NVML library found but the NVIDIA driver is not loaded"
        except module.NVMLError as e:
            return module, None, f"NVML failed to initialise: {e}"
        return module, backend, None

    @cached_property
    def nvml_inventory(self) -> list[Any]:
        _, backend, _ = self.nvml
        return backend.inventory() if backend is not None else []

    @cached_property
    def docker(self) -> tuple[dict[str, Any], dict[str, Any], str | None]:
        """(docker info, docker version, None) or ({}, {}, why the engine is unreachable)."""
        try:
            client = self.probes.docker()
            return client.info(), client.version(), None
        except Exception as e:  # noqa: BLE001 - any failure to reach the engine is the finding
            return {}, {}, f"Docker engine unreachable: {e}"


# --- GPUs --------------------------------------------------------------------------------


def check_nvidia_driver(ctx: Context) -> Check:
    name = "nvidia-driver"
    cfg = ctx.cfg
    if cfg.gpu_backend == "sim":
        return Check(name, "pass", f"simulated: {cfg.sim_gpus} x {cfg.sim_model} (--gpu-backend sim)")
    if cfg.gpu_backend != "nvml":
        return Check(name, "pass", f"not used (--gpu-backend {cfg.gpu_backend})")
    module, backend, why = ctx.nvml
    if backend is None:
        return Check(
            name, "fail", why or "NVML unavailable",
            "install the NVIDIA driver (nvidia-smi must work), or run with --gpu-backend sim",
        )
    try:
        version = module.nvmlSystemGetDriverVersion()
    except module.NVMLError as e:
        version = f"unknown ({e})"
    gpus = ctx.nvml_inventory
    if not gpus:
        return Check(name, "fail", f"driver {version}, but NVML sees no GPU",
                     "check `nvidia-smi -L`; a GPU missing there is a hardware or driver problem")
    models = sorted({g.model for g in gpus})
    return Check(name, "pass", f"driver {version}; {len(gpus)} GPU(s): {', '.join(models)}")


def check_mig(ctx: Context) -> Check:
    """MIG mode per GPU; a pending mode that differs from the current one needs a GPU reset."""
    name = "mig"
    cfg = ctx.cfg
    if cfg.gpu_backend == "sim":
        return Check(name, "pass", "simulated GPUs (no MIG)")
    if cfg.gpu_backend != "nvml":
        return Check(name, "pass", f"not used (--gpu-backend {cfg.gpu_backend})")
    module, backend, why = ctx.nvml
    if backend is None:
        return Check(name, "fail", why or "NVML unavailable", "see nvidia-driver")
    parts, pending = [], []
    for g in ctx.nvml_inventory:
        try:
            current, next_mode = module.nvmlDeviceGetMigMode(module.nvmlDeviceGetHandleByIndex(g.index))
        except module.NVMLError:
            parts.append(f"GPU{g.index} no MIG")
            continue
        on = current == module.NVML_DEVICE_MIG_ENABLE
        parts.append(f"GPU{g.index} {'on' if on else 'off'}" + (f" ({len(g.mig_devices)} devices)" if on else ""))
        if next_mode != current:
            pending.append(f"GPU{g.index}")
    detail = "; ".join(parts) or "no GPU"
    if pending:
        return Check(name, "warn", f"{detail}; MIG mode change pending on {', '.join(pending)}",
                     "reset those GPUs (nvidia-smi -r -i N) or reboot before taking work")
    return Check(name, "pass", detail)


def nvswitches(sysfs: Path) -> list[str]:
    """PCI addresses of NVIDIA NVSwitches (vendor 0x10de, class 0x0680xx) from sysfs."""
    out = []
    try:
        devices = sorted((sysfs / "bus/pci/devices").iterdir())
    except OSError:
        return []
    for dev in devices:
        try:
            vendor = (dev / "vendor").read_text().strip().lower()
            cls = (dev / "class").read_text().strip().lower()
        except OSError:
            continue
        if vendor == _NVIDIA_VENDOR and cls.startswith(_NVSWITCH_CLASS):
            out.append(dev.name)
    return out


def check_fabric_manager(ctx: Context) -> Check:
    """On NVSwitch systems (HGX) CUDA refuses work until nv-fabricmanager has set up the fabric."""
    name = "fabric-manager"
    if ctx.cfg.gpu_backend != "nvml":
        return Check(name, "pass", f"not used (--gpu-backend {ctx.cfg.gpu_backend})")
    switches = nvswitches(ctx.probes.sysfs)
    if not switches:
        return Check(name, "pass", "no NVSwitch on this host; fabric manager not needed")
    systemctl = ctx.probes.which("systemctl")
    if systemctl is None:
        return Check(name, "fail", f"{len(switches)} NVSwitch(es) and no systemctl to ask about "
                     f"{FABRIC_MANAGER_UNIT}", f"start {FABRIC_MANAGER_UNIT} by hand and keep it running")
    r = ctx.probes.run([systemctl, "is-active", FABRIC_MANAGER_UNIT])
    state = (r.stdout or r.stderr).strip() or f"exit {r.returncode}"
    if r.returncode == 0:
        return Check(name, "pass", f"{len(switches)} NVSwitch(es); {FABRIC_MANAGER_UNIT} {state}")
    return Check(name, "fail", f"{len(switches)} NVSwitch(es); {FABRIC_MANAGER_UNIT} {state}",
                 f"install the fabric manager matching the driver, then systemctl enable --now {FABRIC_MANAGER_UNIT}")


def check_amd_smi(ctx: Context) -> Check:
    name = "amd-smi"
    cfg = ctx.cfg
    present = (ctx.probes.dev / "kfd").exists()
    if cfg.gpu_backend != "amdsmi" and not present:
        return Check(name, "pass", "no AMD GPU (/dev/kfd absent) and not used")
    try:
        backend = AmdSmiBackend(ctx.probes.amdsmi())
        gpus = backend.inventory()
        backend.close()
    except Exception as e:  # noqa: BLE001 - ImportError, AmdSmiLibraryException: the finding
        status: Status = "fail" if cfg.gpu_backend == "amdsmi" else "warn"
        return Check(name, status, f"AMD SMI unusable: {e}",
                     "install ROCm (amdsmi Python package and libamd_smi.so) matching the amdgpu driver")
    if not gpus:
        status = "fail" if cfg.gpu_backend == "amdsmi" else "warn"
        return Check(name, status, "AMD SMI sees no GPU", "check `amd-smi list` and the amdgpu driver")
    note = "" if cfg.gpu_backend == "amdsmi" else " (present but not used: --gpu-backend amdsmi uses them)"
    return Check(name, "pass", f"{len(gpus)} GPU(s): {', '.join(sorted({g.model for g in gpus}))}{note}")


# --- NVIDIA Container Toolkit ------------------------------------------------------------


def parse_version(text: str) -> tuple[int, int, int] | None:
    """``NVIDIA Container Toolkit CLI version 1.17.8`` (nvidia-ctk) or ``NVIDIA Container
    Runtime Hook version 1.17.8`` (nvidia-container-toolkit) -> (1, 17, 8)."""
    m = re.search(r"version\s+v?(\d+)\.(\d+)\.(\d+)", text)
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


def toolkit_config_warnings(config: Mapping[str, Any], default_runtime: str = "") -> list[str]:
    """Settings in config.toml known to weaken the toolkit's isolation (pure).

    - ``nvidia-container-cli.no-cgroups = true``: no device cgroup, a container can open every
      GPU's device node (meant for rootless setups, not for shared hosts).
    - ``nvidia-container-cli.ldconfig`` without the leading ``@``: the container's own
      ldconfig runs during setup instead of the host's (``@`` marks a host path).
    - ``features.allow-cuda-compat-libs-from-container = true``: brings back the mounting of
      compat libraries out of the image that 1.17.4 removed for CVE-2025-23359.
    - ``accept-nvidia-visible-devices-envvar-when-unprivileged`` not false while Docker's
      default runtime is nvidia: any container, GPU-less ones included, picks GPUs by setting
      ``NVIDIA_VISIBLE_DEVICES`` in its image.
    """
    out = []
    cli = config.get("nvidia-container-cli") or {}
    features = config.get("features") or {}
    if cli.get("no-cgroups") is True:
        out.append("nvidia-container-cli.no-cgroups = true (containers can open every GPU)")
    ldconfig = cli.get("ldconfig")
    if isinstance(ldconfig, str) and ldconfig and not ldconfig.startswith("@"):
        out.append(f"nvidia-container-cli.ldconfig = {ldconfig!r} runs the container's ldconfig "
                   "(use '@/sbin/ldconfig')")
    if features.get("allow-cuda-compat-libs-from-container") is True:
        out.append("features.allow-cuda-compat-libs-from-container = true (CVE-2025-23359 behaviour)")
    if default_runtime == "nvidia" and config.get("accept-nvidia-visible-devices-envvar-when-unprivileged", True):
        out.append("Docker's default runtime is nvidia and images may pick GPUs with NVIDIA_VISIBLE_DEVICES "
                   "(set accept-nvidia-visible-devices-envvar-when-unprivileged = false)")
    return out


def check_nvidia_toolkit(ctx: Context) -> Check:
    name = "nvidia-container-toolkit"
    if ctx.gpu_mode != "nvidia":
        return Check(name, "pass", f"not used (docker GPU mode {ctx.gpu_mode})")
    found = None
    for binary in ("nvidia-ctk", "nvidia-container-toolkit"):
        path = ctx.probes.which(binary)
        if path is None:
            continue
        r = ctx.probes.run([path, "--version"])
        found = (binary, parse_version(r.stdout + r.stderr))
        if found[1] is not None:
            break
    install = "install NVIDIA Container Toolkit >= 1.17.8 and run `nvidia-ctk runtime configure --runtime=docker`"
    if found is None:
        return Check(name, "fail", "NVIDIA Container Toolkit not installed (no nvidia-ctk on PATH)", install)
    binary, version = found
    if version is None:
        return Check(name, "fail", f"{binary} --version printed no version", install)
    shown = ".".join(map(str, version))
    if version < TOOLKIT_FIXED:
        return Check(name, "fail", f"toolkit {shown} <= 1.17.7: CVE-2025-23266 lets an image escape to the host",
                     "upgrade to NVIDIA Container Toolkit >= 1.17.8 before taking work")
    try:
        config = tomllib.loads(ctx.probes.toolkit_config.read_text())
    except FileNotFoundError:
        config = {}
    except (OSError, tomllib.TOMLDecodeError) as e:
        return Check(name, "warn", f"toolkit {shown}; {ctx.probes.toolkit_config} unreadable: {e}",
                     "fix the file, or regenerate it with nvidia-ctk config")
    info, _, _ = ctx.docker
    weak = toolkit_config_warnings(config, str(info.get("DefaultRuntime", "")))
    if weak:
        return Check(name, "warn", f"toolkit {shown}; " + "; ".join(weak),
                     f"change those settings in {ctx.probes.toolkit_config}")
    return Check(name, "pass", f"toolkit {shown}")


# --- Docker ------------------------------------------------------------------------------


def _engine_version(text: str) -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", text)
    return (int(m[1]), int(m[2])) if m else (0, 0)


def _docker_or_none(ctx: Context, name: str) -> Check | None:
    """The shared outcome when the docker runtime is not used or the engine is unreachable."""
    if ctx.cfg.runtime != "docker":
        return Check(name, "pass", f"not used (--runtime {ctx.cfg.runtime})")
    _, _, why = ctx.docker
    if why:
        return Check(name, "fail", why, "start dockerd and give the agent access to /var/run/docker.sock")
    return None


def check_docker_engine(ctx: Context) -> Check:
    name = "docker-engine"
    if (c := _docker_or_none(ctx, name)) is not None:
        return c
    _, version, _ = ctx.docker
    text = str(version.get("Version", ""))
    v = _engine_version(text)
    detail = f"Docker {text} (API {version.get('ApiVersion', '?')})"
    if v < DOCKER_MIN:
        return Check(name, "fail", f"{detail}: too old to request GPUs by UUID", "upgrade Docker Engine (>= 20.10)")
    if v < DOCKER_WARN_BELOW:
        return Check(name, "warn", f"{detail}: no cgroup v2 support", "upgrade Docker Engine (>= 20.10)")
    return Check(name, "pass", detail)


def check_cgroup_driver(ctx: Context) -> Check:
    """Docker's own advice: on a systemd host, the systemd cgroup driver (one cgroup manager)."""
    name = "cgroup-driver"
    if (c := _docker_or_none(ctx, name)) is not None:
        return c
    info, _, _ = ctx.docker
    driver = str(info.get("CgroupDriver", "?"))
    detail = f"{driver}, cgroup v{info.get('CgroupVersion', '?')}"
    systemd_host = Path("/run/systemd/system").is_dir()
    if driver == "cgroupfs" and systemd_host and str(info.get("CgroupVersion")) == "2":
        return Check(name, "warn", f"{detail} on a systemd host: two managers of one cgroup tree",
                     'set "exec-opts": ["native.cgroupdriver=systemd"] in /etc/docker/daemon.json')
    if driver not in ("systemd", "cgroupfs"):
        return Check(name, "fail", f"{detail}: no cgroup driver, no container limits", "fix dockerd's cgroup setup")
    return Check(name, "pass", detail)


def check_storage_driver(ctx: Context) -> Check:
    name = "storage-driver"
    if (c := _docker_or_none(ctx, name)) is not None:
        return c
    info, _, _ = ctx.docker
    why = disk_quota_support(info)
    driver = str(info.get("Driver", "?"))
    if why is None:
        return Check(name, "pass", f"{driver}: writable-layer size limit works")
    if ctx.cfg.docker_disk_gib == 0:
        return Check(name, "pass", f"{driver}: no size limit asked (--docker-disk-gib 0)")
    return Check(name, "warn", f"{why}: a container can fill the disk",
                 "put /var/lib/docker on xfs mounted with pquota (overlay2), or btrfs/zfs")


def check_gvisor(ctx: Context) -> Check:
    name = "gvisor"
    if not ctx.options.gvisor:
        return Check(name, "pass", "not asked (--gvisor checks the runsc runtime)")
    if (c := _docker_or_none(ctx, name)) is not None:
        return c
    info, _, _ = ctx.docker
    runtimes = info.get("Runtimes") or {}
    if "runsc" in runtimes:
        return Check(name, "pass", f"runsc registered ({runtimes['runsc'].get('path', 'runsc')})")
    return Check(name, "fail", f"runsc not among Docker's runtimes ({', '.join(sorted(runtimes)) or 'none'})",
                 "install gVisor and run `runsc install`, then restart dockerd")


def check_iptables(ctx: Context) -> Check:
    name = "iptables"
    if ctx.cfg.runtime != "docker":
        return Check(name, "pass", f"not used (--runtime {ctx.cfg.runtime})")
    if not ctx.cfg.docker_egress_block:
        return Check(name, "warn", "egress blocking is off: tenant containers reach this host and 169.254.0.0/16",
                     "run the agent with --docker-egress-block true (the default)")
    path = ctx.probes.which("iptables")
    if path is None:
        return Check(name, "fail", "iptables not found: the egress rules cannot be installed",
                     "install iptables (apt-get install iptables)")
    r = ctx.probes.run([path, "-w", "-S", "INPUT"])
    if r.returncode != 0:
        return Check(name, "fail", f"iptables refused: {(r.stderr or r.stdout).strip()[:200]}",
                     "run the agent as root (CAP_NET_ADMIN) on a kernel with netfilter")
    version = ctx.probes.run([path, "--version"]).stdout.strip()
    return Check(name, "pass", f"{version or 'iptables'} usable for the egress rules")


# --- host --------------------------------------------------------------------------------


def _existing(path: Path) -> Path:
    """``path`` or its nearest existing parent (the state dir may not exist before install)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_disk(ctx: Context) -> Check:
    name = "disk"
    fail_gib, warn_gib = ctx.probes.disk_gib
    places = [("state dir", ctx.cfg.state_dir)]
    if ctx.cfg.runtime == "docker":
        info, _, _ = ctx.docker
        places.insert(0, ("docker root", Path(str(info.get("DockerRootDir") or "/var/lib/docker"))))
    parts, worst = [], "pass"
    for label, path in places:
        usage = shutil.disk_usage(_existing(path))
        free = usage.free / GIB
        parts.append(f"{label} {path}: {free:.0f} GiB free of {usage.total / GIB:.0f}")
        if free < fail_gib:
            worst = "fail"
        elif free < warn_gib and worst == "pass":
            worst = "warn"
    detail = "; ".join(parts)
    if worst == "pass":
        return Check(name, "pass", detail)
    limit = fail_gib if worst == "fail" else warn_gib
    return Check(name, worst, f"{detail} (under {limit} GiB)",  # type: ignore[arg-type]
                 "free space (docker system prune) or move /var/lib/docker to a larger disk")


def clock_verdict(state: int, status: int, maxerror_us: int) -> tuple[Status, str]:
    """Pure: the kernel's NTP state -> verdict."""
    if state == _TIME_ERROR or status & _STA_UNSYNC:
        return "warn", "kernel clock not synchronised (no NTP discipline)"
    return "pass", f"synchronised, max error {maxerror_us / 1000:.1f} ms"


def check_clock(ctx: Context) -> Check:
    """Skew breaks TLS validity checks and makes heartbeat times and billed seconds wrong."""
    name = "clock"
    try:
        state, status, maxerror = ctx.probes.clock()
    except (OSError, AttributeError) as e:
        return Check(name, "warn", f"clock state unknown: {e}", "run chrony or systemd-timesyncd")
    verdict, detail = clock_verdict(state, status, maxerror)
    fix = "" if verdict == "pass" else "enable chrony or systemd-timesyncd (timedatectl set-ntp true)"
    return Check(name, verdict, detail, fix)


def check_control_plane(ctx: Context) -> Check:
    name = "control-plane"
    url = ctx.cfg.server + "/healthz"
    try:
        with urllib.request.urlopen(url, timeout=ctx.probes.timeout_s) as r:  # noqa: S310 - operator's URL
            return Check(name, "pass", f"GET {url}: {r.status}")
    except urllib.error.HTTPError as e:
        return Check(name, "fail", f"GET {url}: HTTP {e.code}",
                     "check --server: the control plane answers /healthz with 200")
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        return Check(name, "fail", f"GET {url}: {reason}",
                     "check --server, DNS, the firewall and TLS between this host and the control plane")


def check_gateway(ctx: Context) -> Check:
    """Each tunnel URL reachable over TCP (and TLS for wss://): the tunnel itself needs a host token."""
    name = "gateway"
    urls = [u.strip() for u in ctx.cfg.gateway_url.split(",") if u.strip()]
    if not urls:
        return Check(name, "pass", "no --gateway-url: no exec or port forwarding through a gateway")
    bad, good = [], []
    for url in urls:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "wss" else 80)
        try:
            with socket.create_connection((parts.hostname or "", port), timeout=ctx.probes.timeout_s) as sock:
                if parts.scheme == "wss":
                    with ssl.create_default_context().wrap_socket(sock, server_hostname=parts.hostname):
                        pass
            good.append(url)
        except (OSError, ssl.SSLError) as e:
            bad.append(f"{url}: {e}")
    if bad:
        return Check(name, "fail", "; ".join(bad),
                     "check --gateway-url and the firewall towards the gateway's tunnel port")
    return Check(name, "pass", "reachable: " + ", ".join(good))


CHECKS: Final[tuple[Callable[[Context], Check], ...]] = (
    check_nvidia_driver,
    check_nvidia_toolkit,
    check_mig,
    check_fabric_manager,
    check_amd_smi,
    check_docker_engine,
    check_cgroup_driver,
    check_storage_driver,
    check_gvisor,
    check_iptables,
    check_disk,
    check_clock,
    check_control_plane,
    check_gateway,
)


def run_checks(cfg: AgentConfig, probes: Probes | None = None, options: Options | None = None) -> list[Check]:
    ctx = Context(cfg, probes or Probes(), options or Options())
    out = []
    for fn in CHECKS:
        try:
            out.append(fn(ctx))
        except Exception as e:  # noqa: BLE001 - a broken check is a finding, not a crash
            out.append(Check(fn.__name__.removeprefix("check_").replace("_", "-"), "fail", f"check crashed: {e!r}"))
    if "nvml" in ctx.__dict__ and ctx.nvml[1] is not None:  # opened by a check: close it
        ctx.nvml[1].close()
    return out


def exit_code(checks: Sequence[Check]) -> int:
    return max((EXIT_CODES[c.status] for c in checks), default=0)


def to_json(checks: Sequence[Check]) -> str:
    return json.dumps({"checks": [asdict(c) for c in checks]}, indent=2)


def table(checks: Sequence[Check]) -> str:
    width = max((len(c.name) for c in checks), default=0)
    lines = []
    for c in checks:
        lines.append(f"{c.status.upper():<5} {c.name:<{width}}  {c.detail}")
        if c.fix:
            lines.append(f"{'':<5} {'':<{width}}  fix: {c.fix}")
    counts = {s: sum(c.status == s for c in checks) for s in EXIT_CODES}
    lines.append(f"\n{counts['pass']} pass, {counts['warn']} warn, {counts['fail']} fail")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m agents.host doctor",
        description="Check this host before it takes work. Takes the agent's own flags "
        "(--server, --gpu-backend, --runtime ...); exit 0 all pass, 1 a warning, 2 a failure.",
        add_help=False,
    )
    p.add_argument("--json", action="store_true", help='print {"checks": [...]} instead of a table')
    p.add_argument("--gvisor", action="store_true", help="also require gVisor (runsc) as a Docker runtime")
    p.add_argument("--gpu", action="store_true", help="the real-GPU check instead (agents/host/gpucheck.py)")
    p.add_argument("--doctor-help", action="help", help="this help; --help shows the agent's flags")
    return p


def main(argv: Sequence[str], probes: Probes | None = None, out: Any = None) -> int:
    out = out or sys.stdout
    ns, rest = parser().parse_known_args(list(argv))
    if ns.gpu:
        return gpucheck.main(rest, out=out)
    try:
        cfg = parse_args(rest)
    except ConfigError as e:
        print(f"doctor: {e}", file=sys.stderr)
        return 2
    checks = run_checks(cfg, probes, Options(gvisor=ns.gvisor, as_json=ns.json))
    print(to_json(checks) if ns.json else table(checks), file=out)
    return exit_code(checks)


