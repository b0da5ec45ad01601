"""``python -m agents.host doctor``: each check against this machine's real parts (Docker
engine, iptables, sysfs, the kernel clock, sockets and HTTP servers), with fakes only for the
hardware it lacks (NVML, AMD SMI, the toolkit's binary, NVSwitches, the fabric manager)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import docker
import pynvml
import pytest
from fake_amdsmi import FakeAmdGpu, FakeAmdSmi
from fake_nvml import A100_40GB_PROFILES, FakeGpu, FakeNvml, hgx

from agents.host import doctor
from agents.host.config import AgentConfig
from agents.host.docker import disk_quota_support
from agents.host.doctor import Check, Context, Options, Probes

ROOT = Path(__file__).resolve().parents[3]


class _Health(BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        code = self.server.status if self.path == "/healthz" else 404  # type: ignore[attr-defined]
        self.send_response(code)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[ThreadingHTTPServer]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    srv.status = 200  # type: ignore[attr-defined]
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def url(srv: ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{srv.server_address[1]}"


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def cfg(**kw: object) -> AgentConfig:
    base = {"server": "http://127.0.0.1:9", "hostname": "doctor-test", "state_dir": Path("/tmp")}
    base.update(kw)
    return AgentConfig(**base).validated()  # type: ignore[arg-type]


def ctx(config: AgentConfig, probes: Probes | None = None, **opts: bool) -> Context:
    return Context(config, probes or Probes(), Options(**opts))


def by_name(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks}


def executable(dir_: Path, name: str, script: str) -> Path:
    path = dir_ / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)
    return path


def path_probes(bin_dir: Path, **kw: object) -> Probes:
    """Probes whose PATH is only ``bin_dir`` (the fake executables placed there)."""
    return Probes(which=lambda b: shutil.which(b, path=str(bin_dir)), **kw)  # type: ignore[arg-type]


# --- the acceptance: this machine, whole ---------------------------------------------------


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agents.host", "doctor", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)


def test_nvml_on_this_machine_fails_for_the_right_reason_and_exits_2(server):
    r = run_cli("--json", "--server", url(server), "--gpu-backend", "nvml", "--runtime", "docker")
    assert r.returncode == 2, r.stderr
    report = json.loads(r.stdout)
    assert set(report) == {"checks"}
    assert all(set(c) == {"name", "status", "detail", "fix"} for c in report["checks"])
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["nvidia-driver"]["status"] == "fail"
    assert checks["nvidia-driver"]["detail"] == "NVML library not found / no NVIDIA driver"
    assert "driver" in checks["nvidia-driver"]["fix"]
    # The toolkit is wanted with real NVIDIA GPUs and is not installed here.
    assert checks["nvidia-container-toolkit"]["status"] == "fail"
    assert checks["control-plane"]["status"] == "pass"
    assert checks["docker-engine"]["status"] == "pass"


def test_sim_backend_gpu_checks_pass_and_the_table_says_so(server):
    r = run_cli("--server", url(server), "--gpu-backend", "sim", "--runtime", "docker")
    lines = {line.split()[1]: line for line in r.stdout.splitlines() if line[:4] in ("PASS", "WARN", "FAIL")}
    for name in ("nvidia-driver", "nvidia-container-toolkit", "mig", "fabric-manager", "amd-smi"):
        assert lines[name].startswith("PASS"), lines[name]
    assert "simulated: 8 x H100" in lines["nvidia-driver"]
    statuses = {line.split()[0] for line in lines.values()}
    assert r.returncode == {"PASS": 0, "WARN": 1, "FAIL": 2}[max(statuses, key=["PASS", "WARN", "FAIL"].index)]


def test_bad_flags_exit_2_naming_the_flag():
    r = run_cli("--gpu-backend", "sim")  # no --server
    assert r.returncode == 2
    assert "--server" in r.stderr


def test_exit_code_is_the_worst_status():
    assert doctor.exit_code([Check("a", "pass", "")]) == 0
    assert doctor.exit_code([Check("a", "pass", ""), Check("b", "warn", "")]) == 1
    assert doctor.exit_code([Check("a", "warn", ""), Check("b", "fail", ""), Check("c", "pass", "")]) == 2


# --- NVIDIA driver, MIG, fabric manager (fake NVML, fake sysfs) ----------------------------


def test_driver_and_gpus_seen_through_nvml():
    fake = hgx(4)
    check = doctor.check_nvidia_driver(ctx(cfg(gpu_backend="nvml"), Probes(nvml=lambda: fake)))
    assert check.status == "pass"
    assert check.detail == "driver 550.54.15; 4 GPU(s): NVIDIA H100 80GB HBM3"


def test_driver_without_gpus_fails():
    check = doctor.check_nvidia_driver(ctx(cfg(gpu_backend="nvml"), Probes(nvml=lambda: FakeNvml([]))))
    assert check.status == "fail"
    assert "sees no GPU" in check.detail


def test_driver_not_loaded_is_named():
    fake = FakeNvml([FakeGpu(uuid="GPU-1")])

    def init() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    fake.nvmlInit = init  # type: ignore[method-assign]
    check = doctor.check_nvidia_driver(ctx(cfg(gpu_backend="nvml"), Probes(nvml=lambda: fake)))
    assert (check.status, check.detail) == ("fail", "NVML library found but the NVIDIA driver is not loaded")


def test_mig_mode_per_gpu_and_a_pending_change_warns():
    on = pynvml.NVML_DEVICE_MIG_ENABLE
    fake = FakeNvml([
        FakeGpu(uuid="GPU-a", bus_id="00000000:18:00.0", mig=(on, on), mig_profiles=A100_40GB_PROFILES),
        FakeGpu(uuid="GPU-b", bus_id="00000000:28:00.0", mig=(0, 0)),
        FakeGpu(uuid="GPU-c", bus_id="00000000:38:00.0", mig=None),
    ])
    check = doctor.check_mig(ctx(cfg(gpu_backend="nvml"), Probes(nvml=lambda: fake)))
    assert (check.status, check.detail) == ("pass", "GPU0 on (0 devices); GPU1 off; GPU2 no MIG")
    fake.gpus[1].mig = (0, on)  # enabled, waiting for a reset
    check = doctor.check_mig(ctx(cfg(gpu_backend="nvml"), Probes(nvml=lambda: fake)))
    assert check.status == "warn"
    assert "pending on GPU1" in check.detail


def pci_device(sysfs: Path, bus: str, vendor: str, cls: str) -> None:
    d = sysfs / "bus/pci/devices" / bus
    d.mkdir(parents=True)
    (d / "vendor").write_text(vendor + "\n")
    (d / "class").write_text(cls + "\n")


def test_fabric_manager_needed_only_with_nvswitches(tmp_path):
    sysfs = tmp_path / "sys"
    pci_device(sysfs, "0000:18:00.0", "0x10de", "0x030200")  # an H100 (3D controller)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    executable(bin_dir, "systemctl", 'echo inactive; exit 3\n')
    config = cfg(gpu_backend="nvml")
    check = doctor.check_fabric_manager(ctx(config, path_probes(bin_dir, sysfs=sysfs)))
    assert (check.status, check.detail) == ("pass", "no NVSwitch on this host; fabric manager not needed")

    pci_device(sysfs, "0000:a0:00.0", "0x10de", "0x068000")  # an NVSwitch
    check = doctor.check_fabric_manager(ctx(config, path_probes(bin_dir, sysfs=sysfs)))
    assert check.status == "fail"
    assert check.detail == "1 NVSwitch(es); nvidia-fabricmanager inactive"

    executable(bin_dir, "systemctl", '[ "$2" = nvidia-fabricmanager ] && echo active && exit 0; exit 4\n')
    check = doctor.check_fabric_manager(ctx(config, path_probes(bin_dir, sysfs=sysfs)))
    assert (check.status, check.detail) == ("pass", "1 NVSwitch(es); nvidia-fabricmanager active")


def test_fabric_manager_on_this_machines_real_sysfs():
    assert doctor.nvswitches(Path("/sys")) == []
    check = doctor.check_fabric_manager(ctx(cfg(gpu_backend="nvml")))
    assert check.status == "pass"


# --- NVIDIA Container Toolkit (fake binary on PATH, config.toml in a tmp dir) --------------


@pytest.mark.parametrize(
    ("binary", "output", "status"),
    [
        ("nvidia-ctk", "NVIDIA Container Toolkit CLI version 1.17.7\ncommit: abc\n", "fail"),
        ("nvidia-ctk", "NVIDIA Container Toolkit CLI version 1.16.2\n", "fail"),
        ("nvidia-container-toolkit", "NVIDIA Container Runtime Hook version 1.17.8\ncommit: x\n", "pass"),
        ("nvidia-ctk", "NVIDIA Container Toolkit CLI version 1.18.0\n", "pass"),
    ],
)
def test_toolkit_version_fails_up_to_1_17_7(tmp_path, binary, output, status):
    executable(tmp_path, binary, f"printf '{output}'\n")
    probes = path_probes(tmp_path, toolkit_config=tmp_path / "config.toml")
    check = doctor.check_nvidia_toolkit(ctx(cfg(gpu_backend="nvml", runtime="docker"), probes))
    assert check.status == status, check
    if status == "fail":
        assert "CVE-2025-23266" in check.detail
        assert "1.17.8" in check.fix


def test_toolkit_missing_fails_and_is_not_needed_without_nvidia_gpus(tmp_path):
    probes = path_probes(tmp_path)
    check = doctor.check_nvidia_toolkit(ctx(cfg(gpu_backend="nvml", runtime="docker"), probes))
    assert check.status == "fail"
    assert "not installed" in check.detail
    check = doctor.check_nvidia_toolkit(ctx(cfg(gpu_backend="sim", runtime="docker"), probes))
    assert (check.status, check.detail) == ("pass", "not used (docker GPU mode none)")


@pytest.mark.parametrize(
    ("toml", "needle"),
    [
        ("[nvidia-container-cli]\nno-cgroups = true\n", "no-cgroups = true"),
        ('[nvidia-container-cli]\nldconfig = "/sbin/ldconfig"\n', "runs the container's ldconfig"),
        ("[features]\nallow-cuda-compat-libs-from-container = true\n", "CVE-2025-23359"),
    ],
)
def test_toolkit_configs_that_weaken_the_hooks_warn(tmp_path, toml, needle):
    executable(tmp_path, "nvidia-ctk", "echo 'NVIDIA Container Toolkit CLI version 1.17.8'\n")
    (tmp_path / "config.toml").write_text(toml)
    probes = path_probes(tmp_path, toolkit_config=tmp_path / "config.toml")
    check = doctor.check_nvidia_toolkit(ctx(cfg(gpu_backend="nvml", runtime="docker"), probes))
    assert check.status == "warn"
    assert needle in check.detail


def test_toolkit_default_config_passes(tmp_path):
    executable(tmp_path, "nvidia-ctk", "echo 'NVIDIA Container Toolkit CLI version 1.17.8'\n")
    (tmp_path / "config.toml").write_text(
        '[nvidia-container-cli]\nldconfig = "@/sbin/ldconfig"\nno-cgroups = false\n'
        "[features]\ndisable-cuda-compat-lib-hook = true\n"
    )
    probes = path_probes(tmp_path, toolkit_config=tmp_path / "config.toml")
    check = doctor.check_nvidia_toolkit(ctx(cfg(gpu_backend="nvml", runtime="docker"), probes))
    assert (check.status, check.detail) == ("pass", "toolkit 1.17.8")


def test_envvar_gpu_selection_warns_only_when_nvidia_is_dockers_default_runtime():
    assert doctor.toolkit_config_warnings({}, "runc") == []
    (warning,) = doctor.toolkit_config_warnings({}, "nvidia")
    assert "NVIDIA_VISIBLE_DEVICES" in warning
    assert doctor.toolkit_config_warnings(
        {"accept-nvidia-visible-devices-envvar-when-unprivileged": False}, "nvidia") == []


# --- AMD SMI (fake module, fake /dev) ------------------------------------------------------


def test_amd_smi_only_where_present_or_asked(tmp_path):
    none = doctor.check_amd_smi(ctx(cfg(gpu_backend="nvml"), Probes(dev=tmp_path)))
    assert none.status == "pass"
    assert "no AMD GPU" in none.detail
    fake = FakeAmdSmi([FakeAmdGpu(uuid="amd-1")])
    check = doctor.check_amd_smi(ctx(cfg(gpu_backend="amdsmi"), Probes(dev=tmp_path, amdsmi=lambda: fake)))
    assert (check.status, check.detail) == ("pass", "1 GPU(s): AMD Instinct MI300X")

    def missing() -> object:
        raise ImportError("No module named 'amdsmi'")

    check = doctor.check_amd_smi(ctx(cfg(gpu_backend="amdsmi"), Probes(dev=tmp_path, amdsmi=missing)))
    assert check.status == "fail"
    assert "No module named 'amdsmi'" in check.detail
    (tmp_path / "kfd").touch()  # an AMD GPU present while the agent uses another backend
    check = doctor.check_amd_smi(ctx(cfg(gpu_backend="nvml"), Probes(dev=tmp_path, amdsmi=missing)))
    assert check.status == "warn"


# --- Docker (the real engine) --------------------------------------------------------------


def test_docker_checks_against_the_real_engine():
    client = docker.from_env()
    info, version = client.info(), client.version()
    c = ctx(cfg(gpu_backend="sim", runtime="docker"))
    engine = doctor.check_docker_engine(c)
    assert engine.status == "pass"
    assert engine.detail.startswith(f"Docker {version['Version']} ")
    cgroup = doctor.check_cgroup_driver(c)
    assert cgroup.status in ("pass", "warn")
    assert cgroup.detail.startswith(f"{info['CgroupDriver']}, cgroup v{info['CgroupVersion']}")
    storage = doctor.check_storage_driver(c)
    why = disk_quota_support(info)
    assert storage.status == ("pass" if why is None else "warn")
    if why is not None:
        assert storage.detail.startswith(why)
    asked_none = doctor.check_storage_driver(ctx(cfg(gpu_backend="sim", runtime="docker", docker_disk_gib=0)))
    assert asked_none.status == "pass"


def test_gvisor_only_when_asked_and_named_runtimes_otherwise():
    runtimes = docker.from_env().info()["Runtimes"]
    c = ctx(cfg(gpu_backend="sim"), gvisor=True)
    check = doctor.check_gvisor(c)
    assert check.status == ("pass" if "runsc" in runtimes else "fail")
    if "runsc" not in runtimes:
        assert "runc" in check.detail and "runsc install" in check.fix
    assert doctor.check_gvisor(ctx(cfg(gpu_backend="sim"))).status == "pass"


def test_unreachable_engine_fails_every_docker_check(tmp_path):
    probes = Probes(docker=lambda: docker.DockerClient(base_url=f"unix://{tmp_path}/no.sock", timeout=2))
    c = ctx(cfg(gpu_backend="sim", runtime="docker"), probes)
    for fn in (doctor.check_docker_engine, doctor.check_cgroup_driver, doctor.check_storage_driver):
        check = fn(c)
        assert check.status == "fail"
        assert check.detail.startswith("Docker engine unreachable")
    sim = ctx(cfg(gpu_backend="sim", runtime="sim"), probes)
    assert doctor.check_docker_engine(sim) == Check("docker-engine", "pass", "not used (--runtime sim)")


# --- iptables, disk, clock -----------------------------------------------------------------


def test_iptables_real_missing_and_switched_off(tmp_path):
    real = doctor.check_iptables(ctx(cfg(gpu_backend="sim")))
    assert real.status == "pass", real
    assert "iptables" in real.detail
    missing = doctor.check_iptables(ctx(cfg(gpu_backend="sim"), path_probes(tmp_path)))
    assert missing.status == "fail"
    executable(tmp_path, "iptables", "echo 'iptables: Permission denied (you must be root)' >&2; exit 4\n")
    refused = doctor.check_iptables(ctx(cfg(gpu_backend="sim"), path_probes(tmp_path)))
    assert refused.status == "fail"
    assert "Permission denied" in refused.detail
    off = doctor.check_iptables(ctx(cfg(gpu_backend="sim", docker_egress_block=False)))
    assert off.status == "warn"


def test_disk_free_against_the_thresholds(tmp_path):
    free_gib = shutil.disk_usage(tmp_path).free / doctor.GIB
    config = cfg(gpu_backend="sim", runtime="sim", state_dir=tmp_path / "not-yet")
    ok = doctor.check_disk(ctx(config, Probes(disk_gib=(0, 0))))
    assert ok.status == "pass"
    # The nearest existing parent is measured (other processes move the exact figure).
    assert ok.detail.startswith(f"state dir {tmp_path}/not-yet: ") and " GiB free of " in ok.detail
    warn = doctor.check_disk(ctx(config, Probes(disk_gib=(0, int(free_gib) + 1))))
    assert warn.status == "warn"
    fail = doctor.check_disk(ctx(config, Probes(disk_gib=(int(free_gib) + 1, int(free_gib) + 2))))
    assert fail.status == "fail"
    with_docker = doctor.check_disk(ctx(replace(config, runtime="docker"), Probes(disk_gib=(0, 0))))
    assert with_docker.detail.startswith(f"docker root {docker.from_env().info()['DockerRootDir']}: ")


def test_clock_verdicts_and_this_kernel():
    assert doctor.clock_verdict(5, 0x40, 16_000_000) == ("warn", "kernel clock not synchronised (no NTP discipline)")
    assert doctor.clock_verdict(0, 0x40, 1000)[0] == "warn"  # STA_UNSYNC alone
    assert doctor.clock_verdict(0, 0x2001, 3500) == ("pass", "synchronised, max error 3.5 ms")
    state, status, maxerror = doctor.adjtimex()
    check = doctor.check_clock(ctx(cfg(gpu_backend="sim")))
    assert (check.status, check.detail) == doctor.clock_verdict(state, status, maxerror)


# --- reachability (a real HTTP server, real sockets) ---------------------------------------


def test_control_plane_reachability(server):
    c = ctx(cfg(server=url(server), gpu_backend="sim"))
    assert doctor.check_control_plane(c).status == "pass"
    server.status = 503  # type: ignore[attr-defined]
    check = doctor.check_control_plane(ctx(cfg(server=url(server), gpu_backend="sim")))
    assert (check.status, check.detail) == ("fail", f"GET {url(server)}/healthz: HTTP 503")
    port = closed_port()
    check = doctor.check_control_plane(ctx(cfg(server=f"http://127.0.0.1:{port}", gpu_backend="sim")))
    assert check.status == "fail"
    assert "refused" in check.detail.lower()


def test_gateway_reachability():
    listener = socket.create_server(("127.0.0.1", 0))
    try:
        up = f"ws://127.0.0.1:{listener.getsockname()[1]}/tunnel"
        down = f"ws://127.0.0.1:{closed_port()}/tunnel"
        assert doctor.check_gateway(ctx(cfg(gpu_backend="sim", gateway_url=up))).status == "pass"
        check = doctor.check_gateway(ctx(cfg(gpu_backend="sim", gateway_url=f"{up},{down}")))
        assert check.status == "fail"
        assert check.detail.startswith(down)
    finally:
        listener.close()
    assert doctor.check_gateway(ctx(cfg(gpu_backend="sim"))).status == "pass"  # none configured


def test_every_check_is_in_the_report(server):
    checks = doctor.run_checks(cfg(server=url(server), gpu_backend="sim"), options=Options(gvisor=False))
    assert [c.name for c in checks] == [
        "nvidia-driver", "nvidia-container-toolkit", "mig", "fabric-manager", "amd-smi", "docker-engine",
        "cgroup-driver", "storage-driver", "gvisor", "iptables", "disk", "clock", "control-plane", "gateway",
    ]
