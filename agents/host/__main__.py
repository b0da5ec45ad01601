"""``python -m agents.host``: build the backend and runtime named in the config, run the loop."""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Sequence
from types import FrameType

from agents.host import doctor, install
from agents.host.config import AgentConfig, ConfigError, docker_gpu_mode, parse_args
from agents.host.daemon import Agent
from agents.host.egress import EgressRules, parse_allow
from agents.host.fleet import Fleet
from agents.host.gpu import GpuBackend
from agents.host.logs import setup_logging
from agents.host.runtime import Runtime
from agents.host.sim import SimGpuBackend, SimRuntime
from agents.host.tunnel import AgentTunnel, Connector, DockerConnector, SimConnector

logger = logging.getLogger("agents.host")


def build(cfg: AgentConfig) -> tuple[GpuBackend, Runtime, tuple[int, int] | None]:
    """(backend, runtime, resources override) for ``cfg``. Imports vendor modules lazily."""
    backend: GpuBackend
    if cfg.gpu_backend == "sim":
        backend = SimGpuBackend(model=cfg.sim_model, count=cfg.sim_gpus, hostname=cfg.hostname, seed=cfg.sim_seed)
    elif cfg.gpu_backend == "nvml":
        from agents.host.nvml import NvmlBackend

        backend = NvmlBackend()
    else:
        from agents.host.amdsmi import AmdSmiBackend

        backend = AmdSmiBackend()

    runtime: Runtime
    if cfg.runtime == "sim":
        runtime = SimRuntime(seed=cfg.sim_seed)
    else:
        from agents.host.docker import DockerRuntime, amd_device_nodes, nofile_within_host

        mode = docker_gpu_mode(cfg)
        nodes = None
        if mode == "amd":
            nodes = {g.uuid: amd_device_nodes(g.pci_bus_id) for g in backend.inventory()}
        runtime = DockerRuntime(
            gpu_vendor=mode,
            amd_devices=nodes,
            scope=cfg.docker_scope,
            publish_address=cfg.docker_publish_address,
            pids_limit=cfg.docker_pids_limit,
            nofile=nofile_within_host(cfg.docker_nofile),
            disk_gib=cfg.docker_disk_gib,
            image_fallback=cfg.docker_image_fallback,
        )
        if cfg.docker_egress_block:
            why = EgressRules(allow=parse_allow(cfg.docker_egress_allow)).install()
            if why:
                logger.error(
                    "egress rules NOT installed: tenant containers can reach this host's "
                    "addresses and private networks (169.254.0.0/16: cloud metadata)",
                    extra={"error": why},
                )
            else:
                logger.info("egress rules installed for tenant bridges (gct+)",
                            extra={"allow": cfg.docker_egress_allow or "none"})
        else:
            logger.warning("egress blocking is off (--docker-egress-block false)")

    if isinstance(backend, SimGpuBackend):
        # Simulated GPUs' load follows the containers on them, whichever runtime runs those.
        backend.runtime = runtime

    # A simulated host advertises a plausible machine for its GPUs (DGX-like per GPU).
    resources = None
    if cfg.gpu_backend == "sim":
        resources = (max(8, 28 * cfg.sim_gpus), max(32768, 256 * 1024 * cfg.sim_gpus))
    return backend, runtime, resources


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    # Subcommands: the host checks and the systemd installer; anything else runs the agent.
    if args[:1] == ["doctor"]:
        return doctor.main(args[1:])
    if args[:1] in (["install"], ["uninstall"]):
        return install.main(args)
    try:
        cfg = parse_args(args)
    except ConfigError as e:
        print(f"agents.host: {e}", file=sys.stderr)
        return 2
    setup_logging(cfg.log_level)
    if cfg.sim_fleet:
        return run_fleet(cfg)
    try:
        backend, runtime, resources = build(cfg)
    except Exception as e:
        # No driver, no Docker engine: nothing this agent can do on this machine.
        logger.critical(
            "cannot start",
            extra={"error": str(e), "gpu_backend": cfg.gpu_backend, "runtime": cfg.runtime},
        )
        return 3
    agent = Agent(cfg, backend=backend, runtime=runtime, resources=resources)
    tunnel = start_tunnel(cfg, agent, runtime)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        logger.info("signal received; finishing the current iteration", extra={"signal": signum})
        agent.request_stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        return agent.run()
    finally:
        if tunnel is not None:
            tunnel.stop()


def run_fleet(cfg: AgentConfig) -> int:
    """``--sim-fleet N``: N simulated hosts in this process (agents/host/fleet.py)."""
    fleet = Fleet(cfg, build)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        logger.info("signal received; stopping the fleet", extra={"signal": signum})
        fleet.request_stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return fleet.run()


def start_tunnel(cfg: AgentConfig, agent: Agent, runtime: Runtime) -> AgentTunnel | None:
    """The gateway tunnel, when one is configured: exec/TCP into containers and wake-ups."""
    if not cfg.gateway_url:
        return None
    connector: Connector = (
        SimConnector(runtime) if cfg.runtime == "sim" else DockerConnector(scope=cfg.docker_scope)
    )
    tunnel = AgentTunnel(
        [u.strip() for u in cfg.gateway_url.split(",") if u.strip()],
        token=lambda: agent.state.host_token if agent.state else None,
        connector=connector,
        on_wake=agent.wake,
    )
    tunnel.start()
    return tunnel


if __name__ == "__main__":
    sys.exit(main())
