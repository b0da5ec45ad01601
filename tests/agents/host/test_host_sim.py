from __future__ import annotations

import pytest

from agents.host.runtime import RuntimeError_
from agents.host.sim import (
    LABEL_SIM_DURATION,
    LABEL_SIM_EXIT_CODE,
    MODELS,
    SimGpuBackend,
    SimRuntime,
)
from agents.protocol import DesiredContainer


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def spec(iid: str, gpus: list[str], milli: int = 1000, **labels: str) -> DesiredContainer:
    return DesiredContainer(
        instance_id=iid,
        tenant_id="t",
        kind="job",
        image="img",
        gpu_uuids=gpus,
        gpu_milli=milli,
        labels=labels,
    )


def test_h100_host_is_one_nvswitch_island_with_real_memory() -> None:
    inv = SimGpuBackend(model="H100", count=8, hostname="h1").inventory()
    assert len(inv) == 8
    assert {g.nvlink_island for g in inv} == {0}
    assert {g.memory_mib for g in inv} == {81559}
    assert all(g.uuid.startswith("GPU-") for g in inv)
    assert [g.numa_node for g in inv] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_pcie_board_with_nvlink_bridges_has_islands_of_four() -> None:
    inv = SimGpuBackend(model="A100-PCIE", count=8).inventory()
    assert [g.nvlink_island for g in inv] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert inv[0].topology[inv[4].uuid] == "system"


def test_l40s_has_no_nvlink_and_mi300x_is_amd() -> None:
    assert {g.nvlink_island for g in SimGpuBackend(model="L40S", count=4).inventory()} == {None}
    mi = SimGpuBackend(model="MI300X", count=8).inventory()
    assert mi[0].vendor == "amd" and mi[0].memory_mib == MODELS["MI300X"].memory_mib


def test_uuids_are_stable_per_host_and_unique_across_hosts() -> None:
    a1 = SimGpuBackend(hostname="a").uuids
    assert a1 == SimGpuBackend(hostname="a").uuids
    assert not set(a1) & set(SimGpuBackend(hostname="b").uuids)


def test_unknown_model_is_refused() -> None:
    with pytest.raises(ValueError):
        SimGpuBackend(model="V100X")


def test_utilisation_follows_the_containers_and_is_deterministic() -> None:
    def run() -> list[float | None]:
        rt = SimRuntime(clock=Clock(), seed=7)
        gpus = SimGpuBackend(count=4, seed=7, runtime=rt)
        rt.run(spec("j1", [gpus.uuids[0], gpus.uuids[1]]))
        rt.run(spec("j2", [gpus.uuids[2]], milli=250))
        return [s.gpu_util for s in gpus.sample()]

    utils = run()
    assert utils == run()
    assert utils[0] is not None and utils[0] > 40
    assert utils[2] is not None and 5 < utils[2] < 35
    assert utils[3] is not None and utils[3] < 1


def test_job_exits_after_its_duration_with_its_code() -> None:
    clock = Clock()
    rt = SimRuntime(clock=clock)
    rt.run(spec("j", [], **{LABEL_SIM_DURATION: "60", LABEL_SIM_EXIT_CODE: "3"}))
    assert rt.list()[0].state == "running"
    clock.now += 61
    (o,) = rt.list()
    assert (o.state, o.exit_code) == ("exited", 3)
    assert o.started_at is not None and o.finished_at is not None and o.started_at.endswith("Z")
    assert "exit code 3" in rt.logs("j")


def test_stop_and_remove_are_idempotent_and_run_is_too() -> None:
    rt = SimRuntime(clock=Clock())
    cid = rt.run(spec("i", []))
    assert rt.run(spec("i", [])) == cid
    rt.stop("i")
    rt.stop("i")
    rt.stop("never-existed")
    assert rt.list()[0].exit_code == 143
    rt.remove("i")
    rt.remove("i")
    assert rt.list() == []
    assert rt.logs("i") == ""


def test_runtime_refuses_to_overbook_a_gpu() -> None:
    rt = SimRuntime(clock=Clock())
    rt.run(spec("a", ["GPU-x"], milli=600))
    rt.run(spec("b", ["GPU-x"], milli=400))
    with pytest.raises(RuntimeError_, match="over-booked"):
        rt.run(spec("c", ["GPU-x"], milli=1))


def test_lost_gpu_and_fatal_xid_are_unhealthy() -> None:
    gpus = SimGpuBackend(count=3)
    gpus.lose(gpus.uuids[0])
    gpus.inject_xid(gpus.uuids[1], 79)
    s = gpus.sample()
    assert not s[0].healthy and s[0].error == "GPU is lost"
    assert not s[1].healthy and s[1].xid_events == [79]
    assert s[2].healthy


def test_a_containers_env_sets_its_gpu_utilisation() -> None:
    rt = SimRuntime(clock=Clock())
    gpus = SimGpuBackend(model="H100", count=3, hostname="u", runtime=rt)
    idle, busy, _ = gpus.uuids
    for iid, uuid, util in (("idle", idle, "0"), ("busy", busy, "40")):
        s = spec(iid, [uuid])
        s.env["GPUCLOUD_SIM_GPU_UTIL"] = util
        rt.run(s)
    by = {s.uuid: s.gpu_util for s in gpus.sample()}
    assert by[idle] is not None and by[idle] < 5
    assert by[busy] is not None and 37 <= by[busy] <= 43
