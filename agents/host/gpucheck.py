"""The real-GPU check (``scripts/gpu-check.sh``, ``python -m agents.host doctor --gpu``).

On a machine with an NVIDIA GPU it runs, through the agent's own NVML backend:

1. the inventory and one round of samples (what a heartbeat reports);
2. MIG discovery: each GPU's MIG mode, profiles and devices; with ``--mig-create``, on a GPU
   in MIG mode, one GPU instance of the smallest profile created and destroyed again;
3. a real container pinned to one GPU (``docker run --gpus device=<UUID>``) that must see
   exactly that GPU in ``nvidia-smi -L``.

It prints one JSON report (``{"ok", "steps": {...}}``) and exits 0 when every step passed,
1 when one failed, 2 when there is no NVIDIA GPU to check at all (with the reason on
stderr). CI never needs it; docs/agent.md keeps the report of the last run on real GPUs.
"""

from __future__ import annotations

import argparse
import importlib
import io
import json
import re
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, Final

from agents.host.nvml import NvmlBackend

Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]
_UUID_LINE: Final = re.compile(r"^GPU \d+: .*\(UUID: (GPU-[0-9a-fA-F-]+)\)\s*$", re.M)
# The image the pinned container runs when none is given: the host's own C library and
# loader, nothing else. The NVIDIA runtime mounts nvidia-smi and libnvidia-ml into it, and
# no registry is needed (GPU machines lent for checks reach no network).
PROBE_IMAGE: Final = "gpucloud-gpucheck:host-libc"


def _run(args: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=300, check=False)


def smi_uuids(text: str) -> list[str]:
    """GPU UUIDs in ``nvidia-smi -L`` output (MIG lines, indented, are not GPUs)."""
    return _UUID_LINE.findall(text)


def host_libc_image(run: Runner, which: Callable[[str], str | None]) -> str:
    """Import PROBE_IMAGE from the libraries nvidia-smi links against (``ldd``), unless present."""
    if run(["docker", "image", "inspect", PROBE_IMAGE]).returncode == 0:
        return PROBE_IMAGE
    smi = which("nvidia-smi")
    if smi is None:
        raise RuntimeError("nvidia-smi not on PATH: cannot build the probe image (pass --image)")
    libs = re.findall(r"(/\S+\.so[.\d]*)", run(["ldd", smi]).stdout)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for lib in libs:
            if "nvidia" not in lib:  # the runtime brings the driver's own libraries
                tar.add(str(Path(lib).resolve()), arcname=lib.lstrip("/"))
    r = subprocess.run(["docker", "import", "-", PROBE_IMAGE], input=buf.getvalue(),
                       capture_output=True, timeout=300, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"docker import failed: {r.stderr.decode(errors='replace').strip()}")
    return PROBE_IMAGE


def mig_step(backend: NvmlBackend, gpus: list[Any], create: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"ok": True, "gpus": {}}
    for g in gpus:
        profiles = backend.mig_profiles(g.uuid)
        out["gpus"][g.uuid] = {
            "mig_mode": g.mig_mode,
            "profiles": [asdict(p) for p in profiles],
            "devices": [asdict(d) for d in backend.mig_devices(g.uuid)],
        }
    if not create:
        return out
    target = next((g for g in gpus if g.mig_mode), None)
    if target is None:
        out["create"] = {"skipped": "no GPU in MIG mode (nvidia-smi -mig 1 needs a GPU reset)"}
        return out
    smallest = min(backend.mig_profiles(target.uuid), key=lambda p: p.slices)
    before = {d.uuid for d in backend.mig_devices(target.uuid)}
    try:
        dev = backend.create_mig_device(target.uuid, smallest.profile)
        created = dev.uuid not in before
        backend.destroy_mig_device(target.uuid, dev.uuid)
        gone = dev.uuid not in {d.uuid for d in backend.mig_devices(target.uuid)}
        out["create"] = {"gpu": target.uuid, "profile": smallest.name, "mig_uuid": dev.uuid,
                         "created": created, "destroyed": gone}
        out["ok"] = created and gone
    except Exception as e:  # noqa: BLE001 - NVML's refusal is the finding
        out["create"] = {"gpu": target.uuid, "profile": smallest.name, "error": str(e)}
        out["ok"] = False
    return out


def container_step(gpu_uuid: str, image: str, run: Runner) -> dict[str, Any]:
    r = run(["docker", "run", "--rm", "--gpus", f"device={gpu_uuid}", image, "nvidia-smi", "-L"])
    seen = smi_uuids(r.stdout)
    return {
        "ok": r.returncode == 0 and seen == [gpu_uuid],
        "pinned": gpu_uuid,
        "image": image,
        "seen": seen,
        "output": (r.stdout + r.stderr).strip()[-2000:],
    }


def report(nvml: Any, *, mig_create: bool, image: str | None, run: Runner = _run,
           which: Callable[[str], str | None] = shutil.which) -> dict[str, Any]:
    """The whole check; raises nvml's error when NVML cannot start (no GPU to check)."""
    backend = NvmlBackend(nvml)
    try:
        gpus = backend.inventory()
        if not gpus:
            raise RuntimeError("NVML started but sees no GPU")
        steps: dict[str, Any] = {}
        samples = backend.sample()
        steps["inventory"] = {"ok": True, "gpus": [asdict(g) for g in gpus]}
        steps["samples"] = {"ok": all(s.healthy for s in samples), "samples": [asdict(s) for s in samples]}
        steps["mig"] = mig_step(backend, gpus, mig_create)
        try:
            steps["container"] = container_step(gpus[0].uuid, image or host_libc_image(run, which), run)
        except (RuntimeError, OSError, subprocess.SubprocessError) as e:
            steps["container"] = {"ok": False, "error": str(e)}
        try:
            driver = nvml.nvmlSystemGetDriverVersion()
        except Exception as e:  # noqa: BLE001
            driver = f"unknown ({e})"
        return {"ok": all(s["ok"] for s in steps.values()), "driver": driver, "steps": steps}
    finally:
        backend.close()


def main(argv: Sequence[str], out: Any = None, nvml: Any = None, run: Runner = _run) -> int:
    out = out or sys.stdout
    p = argparse.ArgumentParser(prog="scripts/gpu-check.sh", description=__doc__.split("\n\n")[0])
    p.add_argument("--mig-create", action="store_true",
                   help="create and destroy one MIG instance on a GPU in MIG mode (changes the GPU briefly)")
    p.add_argument("--image", help=f"image for the pinned container (default: {PROBE_IMAGE}, built from this host)")
    ns = p.parse_args(list(argv))
    try:
        module = nvml if nvml is not None else importlib.import_module("pynvml")
        result = report(module, mig_create=ns.mig_create, image=ns.image, run=run)
    except Exception as e:  # noqa: BLE001 - NVMLError_LibraryNotFound & co.: nothing to check
        print(f"gpu-check: no NVIDIA GPU to check on this machine: {e} "
              "(NVML library not found / no NVIDIA driver?)", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2, default=str), file=out)
    return 0 if result["ok"] else 1
