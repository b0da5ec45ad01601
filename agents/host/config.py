"""Agent configuration: environment first, command-line flags override.

Every flag has an environment variable (``GPUCLOUD_<FLAG>``, dashes as underscores);
bad values fail loudly at start, naming the variable or flag.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Final

from agents.host.egress import parse_allow
from agents.host.sim import MODELS
from agents.protocol import host_name_normalise

GPU_BACKENDS: Final = ("nvml", "amdsmi", "sim")
RUNTIMES: Final = ("docker", "sim")
DOCKER_GPU_MODES: Final = ("auto", "nvidia", "amd", "none")


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class AgentConfig:
    server: str = ""
    bootstrap_token: str = ""
    gpu_backend: str = "nvml"
    runtime: str = "docker"
    # How the docker runtime hands GPUs to containers. auto: nvidia with nvml, amd with
    # amdsmi, none (env variables only, no device request) with the sim backend.
    docker_gpu_mode: str = "auto"
    docker_scope: str = ""  # only manage containers labelled gpucloud.agent=<this>
    # Host address published container ports bind to; loopback: only the agent (the connect
    # path) reaches them. "" binds all addresses (reachable from the network: avoid).
    docker_publish_address: str = "127.0.0.1"
    docker_pids_limit: int = 4096  # the cap; a spec asking for more gets this
    docker_nofile: int = 65536  # open-files ulimit (soft = hard)
    docker_disk_gib: int = 100  # writable-layer size where the storage driver can; 0 = none
    # iptables: tenant bridges reach neither this host's addresses nor any private, loopback,
    # link-local, CGNAT, multicast or reserved address (agents/host/egress.py)...
    docker_egress_block: bool = True
    # ...except these CIDRs, comma-separated (a storage network, a package mirror).
    docker_egress_allow: str = ""
    # An image on this host to run in place of a requested image the engine lacks, saying so
    # in the container's log (the demo: no registry needed); "": pull as usual.
    docker_image_fallback: str = ""
    sim_gpus: int = 8
    sim_model: str = "H100"
    sim_seed: int = 0
    # >0: run this many simulated hosts in one process (agents/host/fleet.py), named
    # <hostname>-000.., each with its own state under <state-dir>/<its name>; the bootstrap
    # token is then N tokens, comma-separated (each admits one host).
    sim_fleet: int = 0
    state_dir: Path = Path("/var/lib/gpucloud-agent")
    hostname: str = ""
    once: bool = False
    log_level: str = "INFO"
    request_timeout_s: float = 10.0
    backoff_base_s: float = 1.0
    backoff_cap_s: float = 60.0
    default_interval_s: float = 10.0  # until the control plane says otherwise
    # ws(s):// URL of a gateway's tunnel endpoint, or several, comma-separated (gateway replicas:
    # the agent moves to the next one when its connection fails); empty: no tunnel
    gateway_url: str = ""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> AgentConfig:
        env = os.environ if environ is None else environ
        values: dict[str, object] = {}
        for f in fields(cls):
            key = "GPUCLOUD_" + f.name.upper()
            if key not in env:
                continue
            raw = env[key]
            values[f.name] = _convert(key, raw, f.type)
        return cls(**values)  # type: ignore[arg-type]

    def validated(self) -> AgentConfig:
        """Fill derived defaults and check values; raises ConfigError."""
        cfg = self
        # The control plane stores names in one form (agents.protocol.host_name_normalise);
        # a name it would refuse fails here, at start, rather than at every registration.
        raw_name = cfg.hostname or socket.gethostname()
        try:
            cfg = replace(cfg, hostname=host_name_normalise(raw_name))
        except ValueError as e:
            raise ConfigError(f"--hostname / GPUCLOUD_HOSTNAME {raw_name!r} {e}") from None
        if not cfg.server.startswith(("http://", "https://")):
            raise ConfigError("--server / GPUCLOUD_SERVER must be an http(s) URL")
        if cfg.gpu_backend not in GPU_BACKENDS:
            raise ConfigError(f"--gpu-backend must be one of {GPU_BACKENDS}")
        if cfg.runtime not in RUNTIMES:
            raise ConfigError(f"--runtime must be one of {RUNTIMES}")
        if cfg.docker_gpu_mode not in DOCKER_GPU_MODES:
            raise ConfigError(f"--docker-gpu-mode must be one of {DOCKER_GPU_MODES}")
        if cfg.gpu_backend == "sim" and cfg.sim_model not in MODELS:
            raise ConfigError(f"--sim-model must be one of {sorted(MODELS)}")
        if cfg.docker_publish_address:
            try:
                ipaddress.ip_address(cfg.docker_publish_address)
            except ValueError:
                raise ConfigError(
                    "--docker-publish-address must be an IP address (or empty for all)"
                ) from None
        try:
            parse_allow(cfg.docker_egress_allow)
        except ValueError as e:
            raise ConfigError(f"--docker-egress-allow / GPUCLOUD_DOCKER_EGRESS_ALLOW: {e}") from None
        if cfg.docker_pids_limit < 16:
            raise ConfigError("--docker-pids-limit must be >= 16")
        if not 1024 <= cfg.docker_nofile <= 1048576:
            raise ConfigError("--docker-nofile must be between 1024 and 1048576")
        if cfg.docker_disk_gib < 0:
            raise ConfigError("--docker-disk-gib must be >= 0")
        if cfg.sim_gpus < 0:
            raise ConfigError("--sim-gpus must be >= 0")
        if cfg.sim_fleet < 0:
            raise ConfigError("--sim-fleet must be >= 0")
        if cfg.sim_fleet and (cfg.gpu_backend != "sim" or cfg.runtime != "sim"):
            raise ConfigError("--sim-fleet needs --gpu-backend sim and --runtime sim")
        if cfg.sim_fleet and len(cfg.bootstrap_token.split(",")) not in (1, cfg.sim_fleet):
            raise ConfigError("--sim-fleet N takes one bootstrap token per host, comma-separated")
        if cfg.sim_fleet and cfg.gateway_url:
            raise ConfigError("--sim-fleet runs without a gateway tunnel")
        if cfg.gateway_url and not all(u.strip().startswith(("ws://", "wss://")) for u in cfg.gateway_url.split(",")):
            raise ConfigError("--gateway-url / GPUCLOUD_GATEWAY_URL must be a ws(s):// URL")
        for name in ("request_timeout_s", "backoff_base_s", "backoff_cap_s", "default_interval_s"):
            if getattr(cfg, name) <= 0:
                raise ConfigError(f"{name} must be > 0")
        return replace(cfg, server=cfg.server.rstrip("/"))


def _convert(key: str, raw: str, typ: object) -> object:
    t = typ if isinstance(typ, str) else getattr(typ, "__name__", str(typ))
    try:
        if t == "bool":
            low = raw.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off", ""):
                return False
            raise ValueError(raw)
        if t == "int":
            return int(raw)
        if t == "float":
            return float(raw)
        if t == "Path":
            return Path(raw)
        return raw
    except ValueError:
        raise ConfigError(f"{key}={raw!r} is not a valid {t}") from None


def _flag_bool(raw: str) -> bool:
    value = _convert("--docker-egress-block", raw, "bool")
    assert isinstance(value, bool)
    return value


def parse_args(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> AgentConfig:
    """Flags over environment over defaults. Raises ConfigError (argparse exits on bad syntax)."""
    base = AgentConfig.from_env(environ)
    p = argparse.ArgumentParser(
        prog="python -m agents.host",
        description="gpucloud host agent. Every flag can also be set as GPUCLOUD_<FLAG>.",
    )
    p.add_argument("--server", help="control plane URL (GPUCLOUD_SERVER)")
    p.add_argument(
        "--bootstrap-token", help="one-time registration token (GPUCLOUD_BOOTSTRAP_TOKEN)"
    )
    p.add_argument("--gpu-backend", choices=GPU_BACKENDS)
    p.add_argument("--runtime", choices=RUNTIMES)
    p.add_argument(
        "--docker-gpu-mode",
        choices=DOCKER_GPU_MODES,
        help="auto (default): nvidia with nvml, amd with amdsmi, none with sim",
    )
    p.add_argument("--docker-scope", help="manage only containers labelled gpucloud.agent=<it>")
    p.add_argument(
        "--docker-publish-address", help="host address published ports bind to (127.0.0.1)"
    )
    p.add_argument("--docker-pids-limit", type=int, help="most processes per container (4096)")
    p.add_argument("--docker-nofile", type=int, help="open-files ulimit per container (65536)")
    p.add_argument(
        "--docker-disk-gib", type=int, help="writable-layer size limit, where supported (100)"
    )
    p.add_argument(
        "--docker-egress-block",
        type=_flag_bool,
        metavar="BOOL",
        help="block tenant traffic to this host and to private, loopback, link-local, CGNAT, "
        "multicast and reserved addresses with iptables (true)",
    )
    p.add_argument(
        "--docker-egress-allow",
        metavar="CIDRS",
        help="comma-separated CIDRs tenants may reach although private (none)",
    )
    p.add_argument(
        "--docker-image-fallback",
        metavar="IMAGE",
        help="run this local image, saying so, where a requested one is not on the host (none)",
    )
    p.add_argument("--sim-gpus", type=int)
    p.add_argument("--sim-model")
    p.add_argument("--sim-seed", type=int)
    p.add_argument(
        "--sim-fleet", type=int, metavar="N", help="run N simulated hosts in this process (0)"
    )
    p.add_argument("--state-dir", type=Path, help="where the host token is kept")
    p.add_argument("--hostname", help="name to register under (default: this machine's)")
    p.add_argument("--once", action="store_const", const=True, help="one iteration, then exit")
    p.add_argument("--log-level")
    p.add_argument("--request-timeout-s", type=float)
    p.add_argument("--backoff-base-s", type=float)
    p.add_argument("--backoff-cap-s", type=float)
    p.add_argument("--default-interval-s", type=float)
    p.add_argument("--gateway-url", help="gateway tunnel URL, ws(s)://host:port/tunnel (GPUCLOUD_GATEWAY_URL)")
    ns = p.parse_args(argv)
    overrides = {k: v for k, v in vars(ns).items() if v is not None}
    return replace(base, **overrides).validated()


def docker_gpu_mode(cfg: AgentConfig) -> str:
    """The docker runtime's GPU mode: as configured, else the one that fits the backend.

    Simulated GPUs do not exist, so asking the engine for them would fail every start:
    with the sim backend the containers get the GPU environment variables only.
    """
    if cfg.docker_gpu_mode != "auto":
        return cfg.docker_gpu_mode
    return {"nvml": "nvidia", "amdsmi": "amd"}.get(cfg.gpu_backend, "none")
