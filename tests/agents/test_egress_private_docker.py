"""Tenant containers reach no private network (issue 27, finding 5; docs/security.md).

On the real Docker engine: the test makes a private network of its own, a network namespace
behind a veth pair holding an RFC 1918 address, a CGNAT one and a third that the operator
allow-lists, with a listener on each. A tenant's busybox container (the test image of
tests/agents/test_docker_runtime.py, no registry) reaches the first before the egress rules
are installed (so the test can fail: the route works) and not after; it reaches the
allow-listed one after. Before the fix the rules dropped only 169.254.0.0/16 and the host's
own addresses, and the container reached the private address with the rules in place.

Traffic goes only to the addresses this test creates (no other address on this machine or
beyond), each dial is bounded (nc -w 2), and everything is removed at the end.
"""

from __future__ import annotations

import ipaddress
import secrets
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.host.egress import DENY_V4, DENY_V6, EgressRules, parse_allow
from tests.agents.test_docker_runtime import (  # noqa: F401 (fixtures)
    _rules_present,
    client,
    runtime,
    spec,
    wait_for,
)

PORT = 7407
SECRET = b"private-network-secret"
# Answers each connection with SECRET; gives up by itself after two minutes whatever happens.
LISTENER = f"""
import socket, sys, time
s = socket.create_server(("0.0.0.0", {PORT}))
s.settimeout(1.0)
print("ready", flush=True)
end = time.monotonic() + 120
while time.monotonic() < end:
    try:
        c, _ = s.accept()
    except OSError:
        continue
    with c:
        c.sendall({SECRET!r} + b"\\n")
"""


def sh(*args: str) -> None:
    subprocess.run(list(args), check=True, capture_output=True, text=True, timeout=15)


def _free_octet() -> int:
    """A second octet for 10.X/16 and 100.64+X-ish nets no route of this machine touches."""
    routes = subprocess.run(["ip", "-4", "route", "show", "table", "all"], capture_output=True,
                            text=True, check=True).stdout
    used = []
    for line in routes.splitlines():
        word = line.split()[0] if line.split() else ""
        if word.startswith(("local", "broadcast")) and len(line.split()) > 1:
            word = line.split()[1]
        try:
            used.append(ipaddress.ip_network(word, strict=False))
        except ValueError:
            continue
    for x in range(200, 250):
        ours = [ipaddress.ip_network(f"10.{x}.0.0/16"), ipaddress.ip_network(f"100.{64 + x - 200}.{x}.0/24")]
        if not any(n.overlaps(u) for n in ours for u in used if u.prefixlen > 0):
            return x
    pytest.fail("no free 10.x/16 for the test's private network")


@dataclass
class PrivateNet:
    private: str  # RFC 1918, denied
    cgnat: str  # 100.64.0.0/10, denied
    allowed: str  # RFC 1918, on the operator's allow-list


@pytest.fixture
def private_net() -> Iterator[PrivateNet]:
    """A namespace behind a veth pair, three addresses in it, a listener on them."""
    tag = secrets.token_hex(3)
    # (not gct...: that is the tenant bridges' prefix, which the rules let through as -o)
    ns, host_if, ns_if = f"egt{tag}", f"egt{tag}h", f"egt{tag}n"
    x = _free_octet()
    cg = f"100.{64 + x - 200}.{x}"
    net = PrivateNet(private=f"10.{x}.0.2", cgnat=f"{cg}.2", allowed=f"10.{x}.1.2")
    listener = None
    try:
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        sh("ip", "link", "set", ns_if, "netns", ns)
        for host_addr, ns_addr in ((f"10.{x}.0.1/24", f"{net.private}/24"),
                                   (f"10.{x}.1.1/24", f"{net.allowed}/24"),
                                   (f"{cg}.1/24", f"{net.cgnat}/24")):
            sh("ip", "addr", "add", host_addr, "dev", host_if)
            sh("ip", "netns", "exec", ns, "ip", "addr", "add", ns_addr, "dev", ns_if)
        sh("ip", "link", "set", host_if, "up")
        sh("ip", "netns", "exec", ns, "ip", "link", "set", ns_if, "up")
        sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        listener = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", LISTENER],
                                    stdout=subprocess.PIPE, text=True)
        assert listener.stdout is not None and listener.stdout.readline().strip() == "ready"
        yield net
    finally:
        if listener is not None:
            listener.kill()
            listener.wait(10)
        subprocess.run(["ip", "link", "del", host_if], capture_output=True, timeout=15)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=15)


def test_a_tenant_container_reaches_no_private_address_but_the_allow_listed_one(
    client, runtime, private_net
):
    c = client.containers.get(runtime.run(spec("egress-private", command=["sleep", "300"])))

    def dial(addr: str):
        return c.exec_run(["sh", "-c", f"nc -w 2 {addr} {PORT} </dev/null"])

    rules = EgressRules(allow=parse_allow(f"{private_net.allowed}/32"))
    ours = not _rules_present(rules)  # rules another agent installed: restored to the default
    try:
        if ours:  # the route works: without the rules the private address answers
            assert SECRET in wait_for(lambda: dial(private_net.private).output or None, "the listener")
        assert rules.install() is None, "iptables works here (root, as .ci/run runs)"
        for addr in (private_net.private, private_net.cgnat):
            refused = dial(addr)
            assert SECRET not in refused.output and refused.exit_code != 0, (addr, refused)
        assert SECRET in dial(private_net.allowed).output  # the operator's allow-list
        # Off the list again, it is refused like any private address.
        assert EgressRules().install() is None
        assert SECRET not in dial(private_net.allowed).output
    finally:
        if ours:
            rules.remove()
        else:
            EgressRules().install()


@settings(max_examples=2000, deadline=None)
@given(st.ip_addresses(v=4) | st.ip_addresses(v=6))
def test_every_address_that_is_not_public_internet_is_denied(addr):
    """Whatever Python's ipaddress (the IANA special-purpose registries) says is not global
    (private, shared, loopback, link-local, reserved, documentation, ...) is denied, and all
    multicast; the IPv4 ranges in their IPv4-mapped and NAT64 spellings too."""
    deny = [ipaddress.ip_network(n) for n in (DENY_V4 if addr.version == 4 else DENY_V6)]

    def denied(a) -> bool:
        return any(a in n for n in deny)

    if not addr.is_global or addr.is_multicast:
        assert denied(addr), addr
    if addr.version == 4 and denied(addr):
        mapped = ipaddress.ip_address(f"::ffff:{addr}")
        nat64 = ipaddress.ip_address(int(ipaddress.ip_address("64:ff9b::")) | int(addr))
        assert all(any(a in ipaddress.ip_network(n) for n in DENY_V6) for a in (mapped, nat64))


@pytest.mark.parametrize("public", ["1.1.1.1", "8.8.8.8", "100.128.0.1", "172.32.0.1",
                                    "192.169.0.1", "2606:4700::1111", "2a00:1450::1"])
def test_public_addresses_stay_reachable(public):
    a = ipaddress.ip_address(public)
    deny = DENY_V4 if a.version == 4 else DENY_V6
    assert not any(a in ipaddress.ip_network(n) for n in deny)
