"""The agent API against awkward values in every field: never a 5xx, always the error shape.

An agent is a program we do not control once it runs on someone's server (old versions, bugs,
a compromised host): whatever it sends, the control plane answers 200 or a 4xx that names the
field, and stays up for every other host.
"""
from __future__ import annotations

from tests.agents.test_agent_api import (  # noqa: F401 (fixtures)
    beat_body,
    new_token,
    post,
    region,
    register_body,
    registered,
    triggered,
)
from tests.api.test_bad_input_sweep import RAW_AWKWARD, assert_refused_or_fine, with_raw

AWKWARD = [None, "", "x" * 5000, "nul\x00", 0, -1, 2**63, -(2**63), 1.5, 1e308, True, [], {}, ["a"], [None],
           {"a": 1}, "💥"]


def test_no_register_field_value_makes_a_server_error(client, region, triggered):
    client.raise_request_exception = False
    base = register_body("unused")
    for field in [k for k in base if k != "bootstrap_token"] + ["previous_host_token"]:
        for value in AWKWARD:
            body = {**register_body(new_token(region), hostname=f"h{len(str(value))}"), field: value}
            assert_refused_or_fine(post(client, "/agent/v1/register", body), (field, repr(value)[:40]))
        for raw in RAW_AWKWARD:
            body = with_raw(register_body(new_token(region), hostname="raw"), field, raw)
            assert_refused_or_fine(post(client, "/agent/v1/register", None, raw=body.encode()), (field, raw[:40]))
    for field in ["uuid", "index", "model", "vendor", "memory_mib", "nvlink_island", "numa_node", "name"]:
        for value in AWKWARD:
            body = register_body(new_token(region), hostname="gpu-field")
            body["gpus"][0][field] = value
            assert_refused_or_fine(post(client, "/agent/v1/register", body), ("gpus[0]", field, repr(value)[:40]))


def test_no_heartbeat_field_value_makes_a_server_error(client, registered):
    client.raise_request_exception = False
    host_id, token = registered
    seq = iter(range(1, 10**6))
    sample = {"uuid": "GPU-h1-0", "gpu_util": 50.0, "mem_used_mib": 1000}
    container = {"instance_id": "00000000-0000-0000-0000-000000000000.1", "container_id": "c1", "state": "running"}
    for field in ["seq", "agent_version", "gpus", "containers", "logs"]:
        for value in AWKWARD:
            body = {**beat_body(host_id, next(seq)), field: value}
            assert_refused_or_fine(post(client, "/agent/v1/heartbeat", body, token=token), (field, repr(value)[:40]))
        for raw in RAW_AWKWARD:
            body = with_raw(beat_body(host_id, next(seq)), field, raw)
            resp = post(client, "/agent/v1/heartbeat", None, token=token, raw=body.encode())
            assert_refused_or_fine(resp, (field, raw[:40]))
    for part, item, fields in [
        ("gpus", sample, ["uuid", "gpu_util", "mem_used_mib", "temperature_c", "power_w", "ecc_errors", "xid_events",
                          "healthy"]),
        ("containers", container, ["instance_id", "container_id", "state", "exit_code", "started_at", "finished_at",
                                   "error"]),
        ("logs", {"instance_id": container["instance_id"], "text": "ok"}, ["instance_id", "text", "truncated"]),
    ]:
        for field in fields:
            for value in AWKWARD:
                body = beat_body(host_id, next(seq))
                body[part] = [{**item, field: value}]
                assert_refused_or_fine(post(client, "/agent/v1/heartbeat", body, token=token),
                                       (part, field, repr(value)[:40]))
