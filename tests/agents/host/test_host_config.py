from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from agents.host.config import AgentConfig, ConfigError, parse_args
from agents.host.logs import JsonFormatter


def test_every_setting_comes_from_the_environment() -> None:
    cfg = parse_args(
        [],
        {
            "GPUCLOUD_SERVER": "http://cp:8000/",
            "GPUCLOUD_BOOTSTRAP_TOKEN": "boot",
            "GPUCLOUD_GPU_BACKEND": "sim",
            "GPUCLOUD_RUNTIME": "sim",
            "GPUCLOUD_SIM_GPUS": "4",
            "GPUCLOUD_SIM_MODEL": "H200",
            "GPUCLOUD_STATE_DIR": "/tmp/agent",
            "GPUCLOUD_HOSTNAME": "h7",
            "GPUCLOUD_ONCE": "true",
            "GPUCLOUD_BACKOFF_CAP_S": "5.5",
            "GPUCLOUD_DOCKER_PUBLISH_ADDRESS": "10.1.2.3",
            "GPUCLOUD_DOCKER_PIDS_LIMIT": "2048",
            "GPUCLOUD_DOCKER_NOFILE": "4096",
            "GPUCLOUD_DOCKER_DISK_GIB": "0",
            "GPUCLOUD_DOCKER_EGRESS_BLOCK": "false",
        },
    )
    assert cfg == AgentConfig(
        server="http://cp:8000",  # trailing slash dropped
        bootstrap_token="boot",
        gpu_backend="sim",
        runtime="sim",
        sim_gpus=4,
        sim_model="H200",
        state_dir=Path("/tmp/agent"),
        hostname="h7",
        once=True,
        backoff_cap_s=5.5,
        docker_publish_address="10.1.2.3",
        docker_pids_limit=2048,
        docker_nofile=4096,
        docker_disk_gib=0,
        docker_egress_block=False,
    )


def test_container_hardening_defaults_and_flags() -> None:
    cfg = parse_args([], {"GPUCLOUD_SERVER": "http://a"})
    assert (cfg.docker_publish_address, cfg.docker_pids_limit, cfg.docker_nofile) == (
        "127.0.0.1", 4096, 65536,
    )
    assert (cfg.docker_disk_gib, cfg.docker_egress_block) == (100, True)
    cfg = parse_args(
        ["--docker-egress-block", "off", "--docker-publish-address", "", "--docker-nofile", "2048"],
        {"GPUCLOUD_SERVER": "http://a"},
    )
    assert (cfg.docker_egress_block, cfg.docker_publish_address, cfg.docker_nofile) == (
        False, "", 2048,
    )


def test_flags_override_the_environment() -> None:
    env = {"GPUCLOUD_SERVER": "http://a", "GPUCLOUD_SIM_GPUS": "4", "GPUCLOUD_GPU_BACKEND": "sim"}
    cfg = parse_args(
        ["--server", "https://b", "--sim-gpus", "2", "--state-dir", "/s", "--once"], env
    )
    assert (cfg.server, cfg.sim_gpus, cfg.gpu_backend, cfg.state_dir, cfg.once) == (
        "https://b",
        2,
        "sim",
        Path("/s"),
        True,
    )
    assert cfg.hostname  # defaults to this machine's name


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"GPUCLOUD_SERVER": "http://a", "GPUCLOUD_SIM_GPUS": "eight"}, "GPUCLOUD_SIM_GPUS"),
        ({"GPUCLOUD_SERVER": "http://a", "GPUCLOUD_ONCE": "maybe"}, "GPUCLOUD_ONCE"),
        ({"GPUCLOUD_SERVER": "cp:8000"}, "GPUCLOUD_SERVER"),
        ({}, "GPUCLOUD_SERVER"),
        ({"GPUCLOUD_SERVER": "http://a", "GPUCLOUD_GPU_BACKEND": "cuda"}, "gpu-backend"),
        ({"GPUCLOUD_SERVER": "http://a", "GPUCLOUD_BACKOFF_BASE_S": "0"}, "backoff_base_s"),
        ({"GPUCLOUD_SERVER": "http://a", "GPUCLOUD_DOCKER_PUBLISH_ADDRESS": "localhost"},
         "docker-publish-address"),
        ({"GPUCLOUD_SERVER": "http://a", "GPUCLOUD_DOCKER_PIDS_LIMIT": "0"}, "docker-pids-limit"),
        ({"GPUCLOUD_SERVER": "http://a", "GPUCLOUD_DOCKER_NOFILE": "10"}, "docker-nofile"),
        ({"GPUCLOUD_SERVER": "http://a", "GPUCLOUD_DOCKER_EGRESS_BLOCK": "sometimes"},
         "GPUCLOUD_DOCKER_EGRESS_BLOCK"),
        (
            {
                "GPUCLOUD_SERVER": "http://a",
                "GPUCLOUD_GPU_BACKEND": "sim",
                "GPUCLOUD_SIM_MODEL": "V100",
            },
            "sim-model",
        ),
    ],
)
def test_bad_values_fail_loudly_naming_the_setting(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_args([], env)


def test_logs_are_one_json_object_per_line_with_extra_fields() -> None:
    record = logging.LogRecord(
        "agents.host.daemon", logging.INFO, __file__, 1, "container started", None, None
    )
    record.instance_id = "i-1"
    record.gpus = ["GPU-1"]
    line = JsonFormatter().format(record)
    data = json.loads(line)
    assert data["msg"] == "container started"
    assert data["level"] == "info"
    assert data["instance_id"] == "i-1" and data["gpus"] == ["GPU-1"]
    assert "\n" not in line
