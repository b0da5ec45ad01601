"""Egress rules for tenant networks: no traffic to this host's own addresses, none to
link-local (169.254.0.0/16: cloud metadata services hand out credentials there).

Every bridge the docker runtime creates for tenants is named ``gct<12 hex>`` (see
``docker.bridge_name``), so one set of iptables rules matching ``-i gct+`` covers all of
them, now and later:

    INPUT        -i gct+ -j GPUCLOUD-INPUT              packets to any address of this host
    GPUCLOUD-INPUT  ESTABLISHED,RELATED -> RETURN       replies to the agent's own connections
                    everything else     -> DROP         (the connect path, docker-proxy) pass
    DOCKER-USER  -i gct+ -d 169.254.0.0/16 -j DROP      routed link-local (FORWARD if Docker
                                                        manages no iptables)

Packets a container sends to an address of the host (the bridge gateway, the host's public
or private addresses, a link-local one) are delivered locally, so they traverse INPUT, not
FORWARD: that is why the host addresses are covered by one rule whatever they are. Docker's
embedded DNS (127.0.0.11) lives in the container's own network namespace and is unaffected.

Installing is idempotent (``-C`` before ``-I``; the chain left as it is when it is right,
else flushed and refilled) and uses ``iptables -w`` (waits for the xtables lock other tools
hold). Agents sharing a host (the demo's three) install under one host-wide file lock: without
it, two agents' flush-and-refill interleaved and left ``DROP`` ahead of the ``RETURN`` for
replies, so the connect path's own connections to containers were dropped. Where iptables is missing or
refuses (no root, no netfilter), ``install`` returns the reason and the agent logs it plainly;
containers still run. IPv4 only: tenant networks are created without IPv6.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from typing import Final

BRIDGE_PREFIX: Final = "gct"
INPUT_CHAIN: Final = "GPUCLOUD-INPUT"
LINK_LOCAL: Final = "169.254.0.0/16"
# The chain's contents, as ``iptables -S`` prints them.
CHAIN_RULES: Final = (
    ["-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "RETURN"],
    ["-j", "DROP"],
)


def _lock_path() -> str:
    run_lock = "/run/lock"
    return os.path.join(run_lock if os.access(run_lock, os.W_OK) else tempfile.gettempdir(),
                        "gpucloud-egress.lock")

Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]


def _run(args: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=15, check=False)


class EgressRules:
    def __init__(self, *, iptables: str | None = None, runner: Runner = _run) -> None:
        self.iptables = iptables or shutil.which("iptables") or ""
        self._run = runner

    def _ipt(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self._run([self.iptables, "-w", "10", *args])

    def _forward_chain(self) -> str:
        # DOCKER-USER is Docker's place for rules of our own (it is evaluated first and
        # Docker never flushes it); without Docker's iptables management, FORWARD itself.
        return "DOCKER-USER" if self._ipt("-n", "-L", "DOCKER-USER").returncode == 0 else "FORWARD"

    def rules(self) -> list[tuple[str, list[str]]]:
        """(chain, rule spec) pairs that ``install`` makes sure of, in the order they apply."""
        iface = ["-i", BRIDGE_PREFIX + "+"]
        return [
            ("INPUT", [*iface, "-j", INPUT_CHAIN]),
            (self._forward_chain(), [*iface, "-d", LINK_LOCAL, "-j", "DROP"]),
        ]

    def install(self) -> str | None:
        """Install the rules; None when they are in place, else why not (for the log)."""
        if not self.iptables:
            return "iptables is not installed"
        try:
            with open(_lock_path(), "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
                return self._install()
        except (OSError, subprocess.SubprocessError) as e:
            return f"iptables failed: {e}"

    def _chain_is_right(self) -> bool:
        out = self._ipt("-S", INPUT_CHAIN)
        lines = [line.split() for line in out.stdout.splitlines() if line.startswith("-A ")]
        return out.returncode == 0 and lines == [["-A", INPUT_CHAIN, *r] for r in CHAIN_RULES]

    def _install(self) -> str | None:
        if not self._chain_is_right():
            new = self._ipt("-N", INPUT_CHAIN)
            if new.returncode != 0 and "exists" not in new.stderr:
                return f"iptables -N {INPUT_CHAIN}: {new.stderr.strip() or new.returncode}"
            for args in (["-F", INPUT_CHAIN], *(["-A", INPUT_CHAIN, *r] for r in CHAIN_RULES)):
                done = self._ipt(*args)
                if done.returncode != 0:
                    return f"iptables {' '.join(args)}: {done.stderr.strip() or done.returncode}"
        for chain, spec in self.rules():
            if self._ipt("-C", chain, *spec).returncode == 0:
                continue  # already there (another agent, an earlier start)
            done = self._ipt("-I", chain, "1", *spec)
            if done.returncode != 0:
                return f"iptables -I {chain}: {done.stderr.strip() or done.returncode}"
        return None

    def remove(self) -> None:
        """Take the rules out again (an uninstall; tests that installed them)."""
        if not self.iptables:
            return
        for chain, spec in self.rules():
            while self._ipt("-C", chain, *spec).returncode == 0:
                if self._ipt("-D", chain, *spec).returncode != 0:
                    break
        self._ipt("-F", INPUT_CHAIN)
        self._ipt("-X", INPUT_CHAIN)
