"""``python -m agents.host --sim-fleet N``: N simulated hosts in one process, for benchmarks
and large demos (``GPUCLOUD_BOOTSTRAP_TOKEN``: N one-time tokens, comma-separated).

Each host is a whole ``Agent`` (its own simulated GPUs and runtime, state directory, host
token, seq and long poll) speaking the real protocol over HTTP to the control plane; only the
process is shared. Each runs its loop in a thread of its own (the loop mostly waits on the
network). Starts are spread over the first interval, and every wait is jittered, so the
fleet's heartbeats do not arrive in lock-step.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from dataclasses import replace

from agents.host.config import AgentConfig
from agents.host.daemon import Agent
from agents.host.gpu import GpuBackend
from agents.host.runtime import Runtime

Build = Callable[[AgentConfig], tuple[GpuBackend, Runtime, tuple[int, int] | None]]

logger = logging.getLogger(__name__)


def fleet_configs(cfg: AgentConfig) -> list[AgentConfig]:
    """One config per host: its name, state directory and seed."""
    width = max(3, len(str(cfg.sim_fleet - 1)))
    tokens = cfg.bootstrap_token.split(",")
    out = []
    for i in range(cfg.sim_fleet):
        name = f"{cfg.hostname}-{i:0{width}d}"
        out.append(
            replace(
                cfg,
                hostname=name,
                bootstrap_token=tokens[i % len(tokens)],
                state_dir=cfg.state_dir / name,
                sim_seed=cfg.sim_seed * 100_003 + i,
                sim_fleet=0,
            )
        )
    return out


class Fleet:
    def __init__(self, cfg: AgentConfig, build: Build) -> None:
        """`build`: each host's backend and runtime from its config (`agents.host.__main__.build`,
        passed in by `run_fleet`, which imports this module)."""
        self.agents: list[Agent] = []
        self._rng = random.Random(cfg.sim_seed)
        for c in fleet_configs(cfg):
            backend, runtime, resources = build(c)
            self.agents.append(
                Agent(
                    c,
                    backend=backend,
                    runtime=runtime,
                    resources=resources,
                    rng=random.Random(c.sim_seed),
                )
            )
        self._stop = threading.Event()
        self._spread_s = min(cfg.default_interval_s, 2.0)

    def request_stop(self) -> None:
        self._stop.set()
        for a in self.agents:
            a.request_stop()

    def run(self) -> int:
        """Run every host until ``request_stop()``; 0 when all stopped cleanly."""
        threads = []
        for a in self.agents:
            t = threading.Thread(target=self._run_one, args=(a,), name=a.config.hostname, daemon=True)
            threads.append(t)
            t.start()
        logger.info("fleet started", extra={"hosts": len(self.agents)})
        for t in threads:
            while t.is_alive():
                t.join(timeout=0.5)
        return 0

    def _run_one(self, agent: Agent) -> None:
        if self._stop.wait(self._rng.uniform(0.0, self._spread_s)):
            return
        if agent.config.once:
            agent.iterate()
            return
        agent.run()
