"""The one door for every HTTP request the control plane makes to a URL a user (or tenant) gave it.

Today that is budget webhooks; anything added later (payment provider callbacks, other
notification channels) goes through `outbound_post` too, so there is one place to get right.

Rules (a URL is refused with `OutboundRefused` and a reason a person can read):

- scheme `https`; plain `http` only with `WEBHOOK_ALLOW_PRIVATE=1` (demos, tests);
- a host, no `user:password@` (credentials in a URL end up in logs), a port in 1..65535;
- every address the host resolves to (all A and AAAA records, through `resolve`) must be
  allowed, else none is used: a name with one public and one internal record is refused;
- never allowed, whatever the setting: link-local (169.254.0.0/16 with the clouds' metadata
  service 169.254.169.254, fe80::/10), multicast, unspecified (0.0.0.0, ::), reserved
  (240.0.0.0/4, broadcast), "this network" 0.0.0.0/8, IPv4-compatible ::/96 and the known
  metadata addresses outside link-local (fd00:ec2::254, 100.100.100.200);
- allowed only with `WEBHOOK_ALLOW_PRIVATE=1`: everything else that is not globally routable
  (loopback, RFC 1918, CGNAT 100.64.0.0/10, unique-local fc00::/7, documentation ranges);
- IPv6 addresses that carry an IPv4 address (IPv4-mapped ::ffff:a.b.c.d, 6to4 2002::/16,
  NAT64 64:ff9b::/96) are judged by the IPv4 address they carry.

`outbound_post` checks, then connects to the address it checked (pinned: a DNS answer that
changes between the check and the connect cannot move the request), sends the original Host
header and TLS server name (so certificates are verified for the name), never follows a
redirect (a 3xx is an answer like any other non-2xx), and reads at most a few KiB back.
It uses `http.client`, which reads no proxy settings from the environment.
"""
from __future__ import annotations

import http.client
import ipaddress
import socket
import ssl
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ValidationError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# Refused even with WEBHOOK_ALLOW_PRIVATE: no demo needs them, and they are where an attacker aims.
_NEVER = [ipaddress.ip_network(n) for n in (
    "0.0.0.0/8", "169.254.0.0/16", "224.0.0.0/4", "240.0.0.0/4", "255.255.255.255/32",
    "100.100.100.200/32",  # Alibaba Cloud's metadata service (inside CGNAT, not link-local)
    "::/96", "fe80::/10", "ff00::/8",
    "fd00:ec2::254/128",  # AWS's IPv6 metadata service (inside unique-local)
)]
_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")

MAX_RESPONSE_BYTES = 4096


class OutboundRefused(ValueError):
    """The URL may not be called: the message says why (shown to the user, logged)."""


class OutboundError(OSError):
    """The URL was allowed but could not be reached (refused, reset, timed out, unresolvable)."""


@dataclass(frozen=True)
class OutboundTarget:
    url: str
    scheme: str
    host: str  # as written (lowercase, IDNA-encoded), for the Host header and TLS server name
    port: int
    path: str  # path and query, what goes on the request line
    addresses: tuple[str, ...]  # every resolved address, each checked


@dataclass(frozen=True)
class OutboundResponse:
    status: int
    body: bytes  # at most MAX_RESPONSE_BYTES


def resolve(host: str, port: int) -> list[str]:
    """Every address `host` resolves to, in the resolver's order (the only DNS lookup here)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    seen: dict[str, None] = {}
    for _family, _type, _proto, _canon, sockaddr in infos:
        seen.setdefault(str(sockaddr[0]), None)
    return list(seen)


def address_refusal(ip: IPAddress, *, allow_private: bool) -> str | None:
    """Why this address may not be called, or None when it may."""
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or ip.sixtofour
        if embedded is None and ip in _NAT64:
            embedded = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if embedded is not None:
            return address_refusal(embedded, allow_private=allow_private)
    if ip.is_loopback:  # before _NEVER, which holds ::/96 and so ::1
        return None if allow_private else f"{ip} is not a public address"
    if (any(ip in net for net in _NEVER if net.version == ip.version) or ip.is_link_local or ip.is_multicast
            or ip.is_unspecified or ip.is_reserved):
        return f"{ip} is a link-local, multicast, reserved or metadata address"
    if (not ip.is_global or ip.is_private or ip in _CGNAT) and not allow_private:
        return f"{ip} is not a public address"
    return None


def outbound_check(url: str, *, allow_private: bool | None = None) -> OutboundTarget:
    """Check a URL and resolve its host: the target to connect to, or `OutboundRefused`.

    Raises `OutboundError` when the host does not resolve (at save time the caller shows it as
    a refusal; at delivery it is a failure worth retrying).
    """
    if allow_private is None:
        allow_private = settings.WEBHOOK_ALLOW_PRIVATE
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise OutboundRefused(f"The URL is not valid: {exc}.") from None
    scheme = parts.scheme.lower()
    if scheme != "https" and not (scheme == "http" and allow_private):
        raise OutboundRefused("The URL must use https.")
    if parts.username is not None or parts.password is not None:
        raise OutboundRefused("The URL may not contain a user name or password.")
    if not parts.hostname:
        raise OutboundRefused("The URL has no host.")
    try:
        host = parts.hostname.encode("idna").decode("ascii") if not _is_ip(parts.hostname) else parts.hostname
    except UnicodeError:
        raise OutboundRefused("The URL's host name is not valid.") from None
    port = port if port is not None else (443 if scheme == "https" else 80)
    if not 0 < port < 65536:
        raise OutboundRefused("The URL's port is not valid.")
    try:
        addresses = resolve(host, port)
    except (OSError, UnicodeError) as exc:
        raise OutboundError(f"{host} does not resolve: {exc}") from exc
    if not addresses:
        raise OutboundError(f"{host} does not resolve")
    for raw in addresses:
        try:
            ip = ipaddress.ip_address(raw.split("%", 1)[0])
        except ValueError:
            raise OutboundRefused(f"{host} resolves to {raw!r}, which is not an address.") from None
        reason = address_refusal(ip, allow_private=allow_private)
        if reason:
            where = "" if raw == host else f"{host} resolves to "
            raise OutboundRefused(f"{where}{reason}; webhooks only go to public https addresses.")
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return OutboundTarget(url=url, scheme=scheme, host=host, port=port, path=path, addresses=tuple(addresses))


def outbound_url_validator(value: str) -> None:
    """The save-time check as a Django validator (DRF serializers, forms, the admin)."""
    if not value:
        return
    try:
        outbound_check(value)
    except (OutboundRefused, OutboundError) as exc:
        raise ValidationError(str(exc), code="outbound_refused") from None


def outbound_post(url: str, *, body: bytes, headers: dict[str, str], timeout_s: float,
                  allow_private: bool | None = None) -> OutboundResponse:
    """POST `body` to a checked URL, connecting only to an address that passed the check.

    Raises `OutboundRefused` (never sent) or `OutboundError` (sent or tried, and failed).
    Any answer, 2xx or not, is returned; redirects are not followed.
    """
    target = outbound_check(url, allow_private=allow_private)
    last: OSError | None = None
    for address in target.addresses:
        conn = _connection(target, address, timeout_s)
        try:
            conn.request("POST", target.path, body=body, headers={**headers, "Connection": "close"})
            resp = conn.getresponse()
            return OutboundResponse(status=resp.status, body=resp.read(MAX_RESPONSE_BYTES))
        except ConnectionRefusedError as exc:  # nothing sent: the next address may answer
            last = exc
        except (OSError, http.client.HTTPException) as exc:
            raise OutboundError(f"{target.host}:{target.port}: {exc}") from exc
        finally:
            conn.close()
    raise OutboundError(f"{target.host}:{target.port}: {last}")


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class _PinnedHTTPConnection(http.client.HTTPConnection):
    """Connects to `address`; `host` stays what the Host header says."""

    def __init__(self, host: str, port: int, *, address: str, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self._address = address

    def connect(self) -> None:
        self.sock = socket.create_connection((self._address, self.port), self.timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    """Connects to `address`, verifies the certificate for `host` and sends it as the server name."""

    def __init__(self, host: str, port: int, *, address: str, timeout: float, context: ssl.SSLContext) -> None:
        super().__init__(host, port, timeout=timeout, context=context)
        self._address = address
        self._tls = context

    def connect(self) -> None:
        sock = socket.create_connection((self._address, self.port), self.timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = self._tls.wrap_socket(sock, server_hostname=self.host)


def _connection(target: OutboundTarget, address: str, timeout_s: float) -> http.client.HTTPConnection:
    if target.scheme == "https":
        return _PinnedHTTPSConnection(target.host, target.port, address=address, timeout=timeout_s,
                                      context=ssl.create_default_context())
    return _PinnedHTTPConnection(target.host, target.port, address=address, timeout=timeout_s)
