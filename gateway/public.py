"""What a tenant is told about connecting: the `connect` hints of an instance (docs/connect.md).

Read by the web tier, not the gateway process. The gateway's public address comes from the
settings (`GATEWAY_PUBLIC_HOST`, `GATEWAY_PUBLIC_SSH_PORT`); its host key's fingerprint from
the `.pub` file the gateway writes beside its key at start (`GATEWAY_HOST_KEY_PATH.pub`), a
file shared by the gateway replicas and the web tier (the same `var/` volume), so a client
can check the fingerprint it is shown before it trusts the key.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core import signing
from django.utils.crypto import salted_hmac

from scheduler.choices import State, WorkloadKind

_cache: dict[tuple[str, float], str] = {}


def host_key_fingerprint(path: Path | None = None) -> str | None:
    """The gateway's host key fingerprint (SHA256:…), or None before the gateway first started."""
    from frontend.models import openssh_fingerprint

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

URL_PREFIX = "/i/"
JUPYTER_PORT = 8888
TERMINAL_PATH = "/terminal/"
_TICKET_SALT = "gpucloud.gateway.terminal"
TICKET_MAX_AGE_S = 120


def port_prefix(workload_id: object, port: int) -> str:
    """The path under which the gateway serves `port` of the instance: /i/<id>/<port>/."""
    return f"{URL_PREFIX}{workload_id}/{port}/"


def port_url(workload_id: object, port: int) -> str:
    return settings.GATEWAY_PUBLIC_HTTP_URL.rstrip("/") + port_prefix(workload_id, port)


def keeps_prefix(env: Mapping[str, str], ports: Sequence[int], port: int) -> bool:
    """Whether the app on `port` was told its path prefix, so the proxy passes the path whole.

    Only the Jupyter port, where the platform sets Jupyter's `base_url` itself (through the
    Jupyter images' NOTEBOOK_ARGS, unless the tenant set NOTEBOOK_ARGS). Every other port
    gets the path with /i/<id>/<port> taken off (and the prefix in X-Forwarded-Prefix), so an
    app that serves from / with relative links works unchanged."""
    return port == JUPYTER_PORT and JUPYTER_PORT in ports and "NOTEBOOK_ARGS" not in env


def jupyter_token(workload_id: object, env: Mapping[str, str]) -> str:
    """The token Jupyter in the instance is started with: the tenant's own JUPYTER_TOKEN, else
    one derived from the instance id and the platform's secret (stored nowhere, logged never)."""
    if env.get("JUPYTER_TOKEN"):
        return str(env["JUPYTER_TOKEN"])
    return salted_hmac("gpucloud.gateway.jupyter-token", str(workload_id), algorithm="sha256").hexdigest()[:48]


def platform_env(workload: Any) -> dict[str, str]:
    """What the platform adds to an instance's environment (the tenant's own values win):
    its id and URL prefix, and what starts Jupyter images with the platform's token under the
    gateway's path (docker-stacks images read JUPYTER_TOKEN and NOTEBOOK_ARGS)."""
    if workload.kind != WorkloadKind.INSTANCE:
        return {}
    env = {str(k): str(v) for k, v in (workload.env or {}).items()}
    ports = [int(p) for p in workload.ports or []]
    out = {"GPUCLOUD_INSTANCE_ID": str(workload.pk), "GPUCLOUD_URL_PREFIX": f"{URL_PREFIX}{workload.pk}/",
           "JUPYTER_TOKEN": jupyter_token(workload.pk, env)}
    if keeps_prefix(env, ports, JUPYTER_PORT):
        out["NOTEBOOK_ARGS"] = f"--ServerApp.base_url={port_prefix(workload.pk, JUPYTER_PORT)}"
    return out


def terminal_ticket(*, user_id: int, workload_id: object) -> str:
    """A short-lived, signed ticket that opens the web terminal (the console puts it in the
    page; the gateway checks it and then the same rules as for SSH)."""
    return signing.dumps({"u": user_id, "w": str(workload_id)}, salt=_TICKET_SALT, compress=True)


def terminal_ticket_read(ticket: str) -> tuple[int, str] | None:
    try:
        data = signing.loads(ticket, salt=_TICKET_SALT, max_age=TICKET_MAX_AGE_S)
        return int(data["u"]), str(data["w"])
    except (signing.BadSignature, KeyError, TypeError, ValueError):
        return None


def terminal_ws_url(workload_id: object, ticket: str) -> str:
    base = settings.GATEWAY_PUBLIC_HTTP_URL.rstrip("/")
    scheme, _, rest = base.partition("://")
    return f"{'wss' if scheme == 'https' else 'ws'}://{rest}{TERMINAL_PATH}{workload_id}?ticket={ticket}"
