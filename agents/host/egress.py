"""Egress rules for tenant networks: default-deny for every address that is not the public
internet. A tenant's container reaches nothing on the host it runs on, and nothing private,
loopback, link-local, shared (CGNAT), multicast or reserved anywhere: on a real site that is
where PostgreSQL, Redis, the gateway's relay, the resolvers and the cloud's metadata service
(169.254.169.254, which hands out the machine's credentials) live. An operator opens what
tenants must reach (a storage network, a package mirror) with an allow-list of CIDRs
(``--docker-egress-allow``); the host's DNS servers keep port 53 open, or names would stop
resolving (Docker's embedded DNS forwards from the container's namespace).

Every bridge the docker runtime creates for tenants is named ``gct<12 hex>`` (see
``docker.bridge_name``), so rules matching ``-i gct+`` cover all of them, now and later:

    INPUT        -i gct+ -j GPUCLOUD-INPUT          packets to any address of this host
    GPUCLOUD-INPUT   ESTABLISHED,RELATED -> RETURN  replies to the agent's own connections
                     everything else     -> DROP    (the connect path, docker-proxy) pass
    DOCKER-USER  -i gct+ -j GPUCLOUD-EGRESS         routed packets (FORWARD if Docker manages
                                                    no iptables)
    GPUCLOUD-EGRESS  ESTABLISHED,RELATED -> RETURN  replies (a published port's clients)
                     -o gct+             -> RETURN  container to container: Docker's own
                                                    rules decide (a tenant's bridge is its own)
                     DNS to a resolver   -> RETURN  udp and tcp port 53 only
                     the allow-list      -> RETURN
                     DENY_V4 ranges      -> DROP
                     anything else       -> RETURN  (Docker's rules: the internet)

The same with ip6tables (DENY_V6: ::1, fc00::/7, fe80::/10, ff00::/8, the IPv4-mapped and
NAT64 forms of the IPv4 ranges, ...) where the host has IPv6 and ip6tables. Tenant networks are
created without IPv6 today; the IPv6 rules are there for the day they are not.

Packets a container sends to an address of the host (the bridge gateway, the host's public
or private addresses, a link-local one) are delivered locally, so they traverse INPUT, not
FORWARD: that is why the host addresses are covered by one rule whatever they are, and why
the allow-list never opens the host itself. Docker's embedded DNS (127.0.0.11) lives in the
container's own network namespace and is unaffected.

Installing is idempotent (a chain left as it is when it is right, else flushed and refilled;
``-C`` before ``-I``) and uses ``iptables -w`` (waits for the xtables lock other tools hold).
The rules are host-wide: agents sharing a host (the demo's three) install under one host-wide
file lock (without it, two agents' flush-and-refill interleaved and left ``DROP`` ahead of the
``RETURN`` for replies), and they must agree on the allow-list (the last start wins). Where
iptables is missing or refuses (no root, no netfilter), ``install`` returns the reason and the
agent logs it plainly; containers still run.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

BRIDGE_PREFIX: Final = "gct"
INPUT_CHAIN: Final = "GPUCLOUD-INPUT"
EGRESS_CHAIN: Final = "GPUCLOUD-EGRESS"
LINK_LOCAL: Final = "169.254.0.0/16"
# The host chain's contents, as ``iptables -S`` prints them.
CHAIN_RULES: Final = (
    ["-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "RETURN"],
    ["-j", "DROP"],
)
# Destinations a tenant's container may not open connections to (IANA special-purpose
# registries, RFC 6890): everything that is not the public internet.
DENY_V4: Final = (
    "0.0.0.0/8",  # "this network"
    "10.0.0.0/8",  # private (RFC 1918)
    "100.64.0.0/10",  # shared address space, carrier-grade NAT (RFC 6598)
    "127.0.0.0/8",  # loopback
    LINK_LOCAL,  # link-local: cloud metadata services
    "172.16.0.0/12",  # private (RFC 1918)
    "192.0.0.0/24",  # IETF protocol assignments
    "192.0.2.0/24",  # documentation (TEST-NET-1)
    "192.88.99.0/24",  # 6to4 relay anycast (deprecated)
    "192.168.0.0/16",  # private (RFC 1918)
    "198.18.0.0/15",  # benchmarking
    "198.51.100.0/24",  # documentation (TEST-NET-2)
    "203.0.113.0/24",  # documentation (TEST-NET-3)
    "224.0.0.0/4",  # multicast
    "240.0.0.0/4",  # reserved, and the limited broadcast address
)
_NAT64: Final = ipaddress.IPv6Network("64:ff9b::/96")
DENY_V6: Final = (
    "::/128",  # unspecified
    "::1/128",  # loopback
    "::ffff:0:0/96",  # IPv4-mapped: every form of an IPv4 address inside IPv6
    "100::/64",  # discard-only
    "2001::/23",  # IETF protocol assignments (Teredo, benchmarking, ORCHID)
    "2001:db8::/32",  # documentation
    "fc00::/7",  # unique local (the private ranges of IPv6)
    "fe80::/10",  # link-local
    "ff00::/8",  # multicast
    # The IPv4 ranges above through NAT64's well-known prefix (64:ff9b::10.0.0.0/104, ...).
    *(
        str(ipaddress.IPv6Network(
            (int(_NAT64.network_address) | int(ipaddress.IPv4Network(n).network_address),
             96 + ipaddress.IPv4Network(n).prefixlen)
        ))
        for n in DENY_V4
    ),
)
# A resolver inside the denied ranges keeps this port open (udp and tcp).
DNS_PORT: Final = 53
# What agents before the default-deny installed in DOCKER-USER / FORWARD; taken out again.
_LEGACY_FORWARD_RULE: Final = ["-i", BRIDGE_PREFIX + "+", "-d", LINK_LOCAL, "-j", "DROP"]


def _lock_path() -> str:
    run_lock = "/run/lock"
    return os.path.join(run_lock if os.access(run_lock, os.W_OK) else tempfile.gettempdir(),
                        "gpucloud-egress.lock")

Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _run(args: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=15, check=False)


def parse_allow(text: str) -> tuple[Network, ...]:
    """The operator's allow-list: CIDRs or addresses, comma-separated. Raises ValueError."""
    out: list[Network] = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        try:
            out.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ValueError(f"{item!r} is not an IP address or CIDR") from None
    return tuple(out)


def host_resolvers(paths: Iterable[Path] = (
    Path("/etc/resolv.conf"), Path("/run/systemd/resolve/resolv.conf"),
)) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, ...]:
    """The DNS servers Docker forwards containers' queries to: the host's resolv.conf, or,
    where that names only a local stub (systemd-resolved's 127.0.0.53), its upstream file."""
    for path in paths:
        try:
            lines = path.read_text().splitlines()
        except OSError:
            continue
        found = []
        for line in lines:
            parts = line.split()
            if len(parts) >= 2 and parts[0] == "nameserver":
                try:
                    found.append(ipaddress.ip_address(parts[1].split("%")[0]))
                except ValueError:
                    continue
        remote = tuple(a for a in found if not a.is_loopback)
        if remote:
            return remote
    return ()


def host_has_ipv6() -> bool:
    """The kernel speaks IPv6 and some interface has an address that is not loopback."""
    try:
        lines = Path("/proc/net/if_inet6").read_text().splitlines()
    except OSError:
        return False
    loopback = "0" * 31 + "1"
    return any(line.split()[0] != loopback for line in lines if line.split())


@dataclass(frozen=True)
class Family:
    """One address family's rules: the tool that installs them and what they deny."""

    name: str
    iptables: str
    deny: tuple[str, ...]
    allow: tuple[Network, ...]
    resolvers: tuple[Network, ...]

    def egress_rules(self) -> list[list[str]]:
        """GPUCLOUD-EGRESS's contents, as ``iptables -S`` prints them."""
        rules: list[list[str]] = [
            ["-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "RETURN"],
            ["-o", BRIDGE_PREFIX + "+", "-j", "RETURN"],
        ]
        for ns in self.resolvers:
            for proto in ("udp", "tcp"):
                rules.append(["-d", str(ns), "-p", proto, "-m", proto, "--dport", str(DNS_PORT),
                              "-j", "RETURN"])
        rules += [["-d", str(net), "-j", "RETURN"] for net in self.allow]
        rules += [["-d", net, "-j", "DROP"] for net in self.deny]
        return rules


def _canonical(rule: Sequence[str]) -> list[str]:
    """A rule with its addresses in one spelling (ip6tables prints ::ffff:0.0.0.0/96 for
    what Python calls ::ffff:0:0/96), so a right chain is recognised as right."""
    out = list(rule)
    for i in range(1, len(out)):
        if out[i - 1] == "-d":
            try:
                out[i] = str(ipaddress.ip_network(out[i], strict=False))
            except ValueError:
                pass
    return out


class EgressRules:
    def __init__(
        self,
        *,
        iptables: str | None = None,
        ip6tables: str | None = None,
        allow: Sequence[Network] = (),
        resolvers: Sequence[ipaddress.IPv4Address | ipaddress.IPv6Address] | None = None,
        runner: Runner = _run,
    ) -> None:
        """`allow`: the operator's CIDRs that tenants may reach although they are in the
        denied ranges. `resolvers`: DNS servers that keep port 53 (default: the host's).
        `ip6tables`: "" for none (default: ip6tables where the host has IPv6)."""
        self.iptables = iptables or shutil.which("iptables") or ""
        if ip6tables is None:
            ip6tables = (shutil.which("ip6tables") or "") if host_has_ipv6() else ""
        self.ip6tables = ip6tables
        self.allow = tuple(allow)
        dns = host_resolvers() if resolvers is None else tuple(resolvers)
        # Only resolvers in the denied ranges need a hole; a public one is reachable anyway.
        self.resolvers = tuple(ipaddress.ip_network(a) for a in dns)
        self._run = runner

    def families(self) -> list[Family]:
        out = [Family("IPv4", self.iptables, DENY_V4, *self._split(4))]
        if self.ip6tables:
            out.append(Family("IPv6", self.ip6tables, DENY_V6, *self._split(6)))
        return out

    def _split(self, version: int) -> tuple[tuple[Network, ...], tuple[Network, ...]]:
        deny = [ipaddress.ip_network(n) for n in (DENY_V4 if version == 4 else DENY_V6)]

        def denied(net: Network) -> bool:
            return any(net.version == d.version and net.subnet_of(d) for d in deny)  # type: ignore[arg-type]

        allow = tuple(n for n in self.allow if n.version == version)
        dns = tuple(n for n in self.resolvers if n.version == version and denied(n))
        return allow, dns

    def _ipt(self, fam: Family, *args: str) -> subprocess.CompletedProcess[str]:
        return self._run([fam.iptables, "-w", "10", *args])

    def _forward_chain(self, fam: Family) -> str:
        # DOCKER-USER is Docker's place for rules of our own (it is evaluated first and
        # Docker never flushes it); without Docker's iptables management, FORWARD itself.
        return "DOCKER-USER" if self._ipt(fam, "-n", "-L", "DOCKER-USER").returncode == 0 else "FORWARD"

    def rules(self, fam: Family | None = None) -> list[tuple[str, list[str]]]:
        """(chain, rule spec) pairs that send tenant traffic to our chains, in the order they
        apply (of IPv4 unless `fam` says otherwise)."""
        fam = fam or self.families()[0]
        iface = ["-i", BRIDGE_PREFIX + "+"]
        return [
            ("INPUT", [*iface, "-j", INPUT_CHAIN]),
            (self._forward_chain(fam), [*iface, "-j", EGRESS_CHAIN]),
        ]

    def install(self) -> str | None:
        """Install the rules; None when they are in place, else why not (for the log)."""
        if not self.iptables:
            return "iptables is not installed"
        try:
            with open(_lock_path(), "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
                problems = [f"{fam.name}: {why}" for fam in self.families()
                            if (why := self._install(fam))]
        except (OSError, subprocess.SubprocessError) as e:
            return f"iptables failed: {e}"
        return "; ".join(problems) or None

    def _chain_is_right(self, fam: Family, chain: str, want: Sequence[Sequence[str]]) -> bool:
        out = self._ipt(fam, "-S", chain)
        lines = [_canonical(line.split()) for line in out.stdout.splitlines() if line.startswith("-A ")]
        return out.returncode == 0 and lines == [_canonical(["-A", chain, *r]) for r in want]

    def _fill(self, fam: Family, chain: str, want: Sequence[Sequence[str]]) -> str | None:
        if self._chain_is_right(fam, chain, want):
            return None
        new = self._ipt(fam, "-N", chain)
        if new.returncode != 0 and "exists" not in new.stderr:
            return f"-N {chain}: {new.stderr.strip() or new.returncode}"
        for args in (["-F", chain], *(["-A", chain, *r] for r in want)):
            done = self._ipt(fam, *args)
            if done.returncode != 0:
                return f"{' '.join(args)}: {done.stderr.strip() or done.returncode}"
        return None

    def _install(self, fam: Family) -> str | None:
        for chain, want in ((INPUT_CHAIN, CHAIN_RULES), (EGRESS_CHAIN, fam.egress_rules())):
            if why := self._fill(fam, chain, want):
                return why
        for chain, spec in self.rules(fam):
            if self._ipt(fam, "-C", chain, *spec).returncode == 0:
                continue  # already there (another agent, an earlier start)
            done = self._ipt(fam, "-I", chain, "1", *spec)
            if done.returncode != 0:
                return f"-I {chain}: {done.stderr.strip() or done.returncode}"
        if fam.name == "IPv4":
            self._delete(fam, self._forward_chain(fam), _LEGACY_FORWARD_RULE)
        return None

    def _delete(self, fam: Family, chain: str, spec: Sequence[str]) -> None:
        while self._ipt(fam, "-C", chain, *spec).returncode == 0:
            if self._ipt(fam, "-D", chain, *spec).returncode != 0:
                break

    def remove(self) -> None:
        """Take the rules out again (an uninstall; tests that installed them)."""
        if not self.iptables:
            return
        for fam in self.families():
            for chain, spec in self.rules(fam):
                self._delete(fam, chain, spec)
            for chain in (INPUT_CHAIN, EGRESS_CHAIN):
                self._ipt(fam, "-F", chain)
                self._ipt(fam, "-X", chain)
