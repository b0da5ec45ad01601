"""What a tenant is told about connecting: the `connect` hints of an instance (docs/connect.md).

Read by the web tier, not the gateway process. The gateway's public address comes from the
settings (`GATEWAY_PUBLIC_HOST`, `GATEWAY_PUBLIC_SSH_PORT`); its host key's fingerprint from
the `.pub` file the gateway writes beside its key at start (`GATEWAY_HOST_KEY_PATH.pub`), a
file shared by the gateway replicas and the web tier (the same `var/` volume), so a client
can check the fingerprint it is shown before it trusts the key.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings

from agents.instance_env import (  # noqa: F401  (the gateway's URL scheme, re-exported)
    JUPYTER_PORT,
    URL_PREFIX,
    jupyter_token,
    keeps_prefix,
    platform_env,
    port_prefix,
)
from gpucloud.tenancy.models import openssh_fingerprint
from scheduler.choices import State, WorkloadKind

_cache: dict[tuple[str, float], str] = {}


def host_key_fingerprint(path: Path | None = None) -> str | None:
    """The gateway's host key fingerprint (SHA256:…), or None before the gateway first started."""
    pub = Path(str(path or settings.GATEWAY_HOST_KEY_PATH) + ".pub")
    try:
        key = (str(pub), pub.stat().st_mtime)
    except OSError:
        return None
    if key not in _cache:
        try:
            _cache.clear()
            _cache[key] = openssh_fingerprint(pub.read_text())
        except OSError:
            return None
    return _cache[key] or None


EMPTY: dict[str, Any] = {"ssh": None, "ssh_host": None, "ssh_port": None, "ssh_user": None,
                         "host_key_fingerprint": None, "urls": {}}


def connect_hints(workload: Any) -> dict[str, Any]:
    """How to reach `workload` now: all null until it RUNS, and again once it has ended,
    so no stale hint outlives the instance. `urls`: each published port's URL on the gateway."""
    if workload.kind != WorkloadKind.INSTANCE or workload.state != State.RUNNING:
        return dict(EMPTY, urls={})
    host, port, user = settings.GATEWAY_PUBLIC_HOST, settings.GATEWAY_PUBLIC_SSH_PORT, str(workload.pk)
    return {
        "ssh": f"ssh -p {port} {user}@{host}",
        "ssh_host": host,
        "ssh_port": port,
        "ssh_user": user,
        "host_key_fingerprint": host_key_fingerprint(),
        "urls": {str(p): port_url(workload.pk, int(p)) for p in workload.ports or []},
    }


# ---------------------------------------------------------------------- the HTTP side

TERMINAL_PATH = "/terminal/"  # its tickets: gateway/services.py


def port_url(workload_id: object, port: int) -> str:
    return settings.GATEWAY_PUBLIC_HTTP_URL.rstrip("/") + port_prefix(workload_id, port)


def terminal_ws_url(workload_id: object, ticket: str) -> str:
    base = settings.GATEWAY_PUBLIC_HTTP_URL.rstrip("/")
    scheme, _, rest = base.partition("://")
    return f"{'wss' if scheme == 'https' else 'ws'}://{rest}{TERMINAL_PATH}{workload_id}?ticket={ticket}"
