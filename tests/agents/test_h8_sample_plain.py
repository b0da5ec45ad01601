"""A GPU sample or a container report read by the plain reading (`agents.protocol._sample_plain`,
`_container_plain`: the common shapes of every heartbeat's) is what the generic reader gives,
and whatever the plain reading leaves alone is refused by the generic reader with the same
error."""
from __future__ import annotations

from types import MappingProxyType

import pytest

from agents.protocol import INT32_MAX, INT64_MAX, GpuSample, Heartbeat, ObservedContainer, ProtocolError

_BASE = {"uuid": "GPU-1", "healthy": True, "error": None, "gpu_util": 50.5, "mem_util": 1, "mem_used_mib": 512,
         "temperature_c": 40.0, "power_w": 70, "ecc_corrected": 0, "ecc_uncorrected": 0, "xid_events": []}

_CASES = [
    {},
    {"healthy": False},
    {"healthy": None},
    {"healthy": 1},
    {"healthy": "yes"},
    {"uuid": ""},
    {"uuid": None},
    {"uuid": 7},
    {"uuid": "GPU-\x00"},
    {"uuid": "GPU-é"},
    {"uuid": "GPU-\ud800"},
    {"error": "Xid 79"},
    {"error": ""},
    {"error": 3},
    {"gpu_util": None},
    {"gpu_util": True},
    {"gpu_util": -1},
    {"gpu_util": "50"},
    {"mem_util": 2**70},
    {"mem_used_mib": -5},
    {"mem_used_mib": INT32_MAX},
    {"mem_used_mib": INT32_MAX + 1},
    {"mem_used_mib": 1.5},
    {"mem_used_mib": False},
    {"ecc_uncorrected": INT64_MAX},
    {"ecc_uncorrected": INT64_MAX + 1},
    {"ecc_corrected": None},
    {"ecc_corrected": True},
    {"xid_events": None},
    {"xid_events": [79]},
    {"xid_events": [True]},
    {"xid_events": ""},
    {"xid_events": {}},
    {"xid_events": 0},
    {"temperature_c": [1]},
    {"power_w": 1e308},
    {"unknown": "ignored"},
]


def _read(cls: type, data: object, path: str) -> object:
    try:
        return cls.from_dict(data, path)
    except ProtocolError as exc:
        return f"ProtocolError: {exc}"


def _both_ways(cls: type, base: dict, change: dict, path: str) -> None:
    """`base` with `change`, and without the keys `change` sets to None: read the same by the
    plain reading (a dict) and the generic one (a mapping that is not a dict takes it)."""
    data = {**base, **change}
    for missing in ([], [k for k, v in change.items() if v is None]):
        d = {k: v for k, v in data.items() if k not in missing}
        assert _read(cls, d, path) == _read(cls, MappingProxyType(d), path)


@pytest.mark.parametrize("change", _CASES, ids=[repr(c) for c in _CASES])
def test_a_sample_reads_the_same_by_the_plain_and_the_generic_reading(change):
    _both_ways(GpuSample, _BASE, change, "gpus[0]")


_CONTAINER = {"instance_id": "w.1", "container_id": "abc", "state": "exited", "exit_code": 0,
              "started_at": "2026-12-05T10:00:00Z", "finished_at": "2026-12-05T10:01:00Z", "error": None,
              "host_ports": {}}

_CONTAINER_CASES = [
    {},
    {"instance_id": ""},
    {"instance_id": None},
    {"instance_id": 5},
    {"instance_id": "w.\x00"},
    {"instance_id": "w.é"},
    {"instance_id": "w.\ud800"},
    {"container_id": None},
    {"container_id": ""},
    {"container_id": "é"},
    {"container_id": 1},
    {"state": "running"},
    {"state": "created"},
    {"state": "missing"},
    {"state": "paused"},
    {"state": None},
    {"state": 1},
    {"exit_code": None},
    {"exit_code": -1},
    {"exit_code": 137},
    {"exit_code": INT32_MAX + 1},
    {"exit_code": True},
    {"exit_code": 0.0},
    {"started_at": None},
    {"started_at": "x\x00"},
    {"finished_at": 3},
    {"error": "image not found"},
    {"error": "bad\x00byte"},
    {"error": 5},
    {"host_ports": None},
    {"host_ports": {"8888": 32768}},
    {"host_ports": {"8888": "x"}},
    {"host_ports": []},
    {"unknown": 1},
]


@pytest.mark.parametrize("change", _CONTAINER_CASES, ids=[repr(c) for c in _CONTAINER_CASES])
def test_a_container_report_reads_the_same_by_the_plain_and_the_generic_reading(change):
    _both_ways(ObservedContainer, _CONTAINER, change, "containers[0]")


def test_a_heartbeat_of_plain_samples_round_trips():
    hb = Heartbeat(host_id="h", seq=3, gpus=[GpuSample(uuid=f"GPU-{i}", gpu_util=float(i), mem_used_mib=i,
                                                       ecc_uncorrected=0) for i in range(8)], agent_version="v")
    assert Heartbeat.from_dict(hb.to_dict()) == hb
