from __future__ import annotations

import ipaddress

from django.conf import settings


def client_ip(request) -> str | None:
    """The client's address, for rate limits and the audit log's source IP.

    With no proxy in front (`TRUSTED_PROXY_HOPS=0`, the default) it is REMOTE_ADDR, and
    X-Forwarded-For is ignored: any client can write that header. Behind N proxies that each
    append the address they saw, only the last N entries were written by them; the client's
    address is the Nth from the right (fewer entries: the leftmost, which a trusted proxy
    wrote). Never the leftmost of a longer list: that one is whatever the client sent.
    A value that is not an IP address (a misconfigured proxy) falls back to REMOTE_ADDR.
    """
    remote = request.META.get("REMOTE_ADDR") or None
    hops = settings.TRUSTED_PROXY_HOPS
    if hops > 0:
        forwarded = request.META.get("HTTP_X_FORWARDED_FOR", "")
        if forwarded:
            entries = [part.strip() for part in forwarded.split(",")]
            candidate = entries[max(0, len(entries) - hops)]
            try:
                return str(ipaddress.ip_address(candidate))
            except ValueError:
                pass
    return remote
