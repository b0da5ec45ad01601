"""What the platform adds to an instance: its environment (id, URL prefix, Jupyter's token)
and the gateway's URL scheme for published ports (docs/connect.md).

Here, in the agents' control plane, because the desired state the agents are sent carries the
environment; the gateway (a layer above) reads the same scheme from here through gateway.public.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from django.utils.crypto import salted_hmac

from scheduler.choices import WorkloadKind

URL_PREFIX = "/i/"
JUPYTER_PORT = 8888


def port_prefix(workload_id: object, port: int) -> str:
    """The path under which the gateway serves `port` of the instance: /i/<id>/<port>/."""
    return f"{URL_PREFIX}{workload_id}/{port}/"


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
