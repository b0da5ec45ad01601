"""The real-GPU check (scripts/gpu-check.sh): on this machine (no GPU) it stops plainly; the
report's steps run against the fake NVML and a stand-in for ``docker run --gpus`` (the
NVIDIA runtime needs a GPU this machine lacks)."""

from __future__ import annotations

import io
import json
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pynvml
from fake_nvml import A100_40GB_PROFILES, FakeGpu, FakeNvml

from agents.host import gpucheck

ROOT = Path(__file__).resolve().parents[3]
A100 = "GPU-a100a100-0000-1111-2222-333344445555"
OTHER = "GPU-0bbb0000-0000-1111-2222-333344445555"


def smi_line(index: int, uuid: str) -> str:
    return f"GPU {index}: NVIDIA A100-SXM4-40GB (UUID: {uuid})\n"


def fake_docker(output: str) -> tuple[list[list[str]], gpucheck.Runner]:
    calls: list[list[str]] = []

    def run(args: Sequence[str]) -> subprocess.CompletedProcess[str]:
        calls.append(list(args))
        return subprocess.CompletedProcess(list(args), 0, output, "")

    return calls, run


def a100_in_mig_mode() -> FakeNvml:
    on = pynvml.NVML_DEVICE_MIG_ENABLE
    return FakeNvml([FakeGpu(uuid=A100, name="NVIDIA A100-SXM4-40GB", total_bytes=40960 * 1024 * 1024,
                             mig=(on, on), mig_profiles=dict(A100_40GB_PROFILES))])


def test_on_this_machine_it_exits_non_zero_saying_why():
    r = subprocess.run([str(ROOT / "scripts/gpu-check.sh")], cwd=ROOT, capture_output=True, text=True,
                       timeout=60, check=False)
    assert r.returncode == 2
    assert r.stdout == ""
    assert r.stderr.startswith("gpu-check: no NVIDIA GPU to check on this machine: ")
    assert "NVML Shared Library Not Found" in r.stderr


def test_report_with_mig_create_and_a_pinned_container():
    fake = a100_in_mig_mode()
    calls, run = fake_docker(smi_line(0, A100) + "  MIG 1g.5gb Device 0: (UUID: MIG-x)\n")
    out = io.StringIO()
    code = gpucheck.main(["--mig-create", "--image", "probe:1"], out=out, nvml=fake, run=run)
    report = json.loads(out.getvalue())
    assert code == 0, report
    assert report["ok"] is True
    assert report["driver"] == "550.54.15"
    steps = report["steps"]
    assert [g["uuid"] for g in steps["inventory"]["gpus"]] == [A100]
    assert [s["uuid"] for s in steps["samples"]["samples"]] == [A100]
    created = steps["mig"]["create"]
    assert (created["profile"], created["created"], created["destroyed"]) == ("1g.5gb", True, True)
    assert fake.gpus[0].instances == {}  # nothing left behind on the GPU
    assert calls == [["docker", "run", "--rm", "--gpus", f"device={A100}", "probe:1", "nvidia-smi", "-L"]]
    assert steps["container"]["seen"] == [A100]


def test_a_container_that_sees_more_than_its_gpu_fails_the_report():
    calls, run = fake_docker(smi_line(0, A100) + smi_line(1, OTHER))
    out = io.StringIO()
    code = gpucheck.main(["--image", "probe:1"], out=out, nvml=a100_in_mig_mode(), run=run)
    report = json.loads(out.getvalue())
    assert code == 1
    assert report["ok"] is False
    assert report["steps"]["container"]["seen"] == [A100, OTHER]
    assert "create" not in report["steps"]["mig"]  # only with --mig-create


def test_smi_uuids_skips_mig_lines():
    text = smi_line(0, A100) + "  MIG 3g.20gb Device 0: (UUID: MIG-1234)\n" + smi_line(1, OTHER)
    assert gpucheck.smi_uuids(text) == [A100, OTHER]
