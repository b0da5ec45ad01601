"""The agent API, `/agent/v1/`: thin views over `agents.services` (see agents/protocol.py).

Not the tenants' API: no API keys, no sessions (hence no CSRF), not in the OpenAPI
schema (the protocol is documented in docs/agent.md). Errors use the one error shape.
Registration authenticates with the bootstrap token in the body; heartbeats with
`Authorization: Bearer <host token>`. Both are rate-limited (per host, else per address).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.parsers import JSONParser
from rest_framework.permissions import AllowAny, BasePermission
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.throttling import SimpleRateThrottle
from rest_framework.views import APIView

from agents.models import Host
from agents.protocol import (
    Heartbeat,
    HeartbeatResponse,
    ProtocolError,
    RegisterRequest,
    RegisterResponse,
)
from agents.selectors import host_by_token, host_desired_containers, host_logs_requests
from agents.services import host_heartbeat, host_register
from gpucloud.lib.errors import InvalidInput


class HostTokenAuthentication(BaseAuthentication):
    """`Authorization: Bearer <host token>` -> (AnonymousUser, Host). `request.auth` is the host."""

    def authenticate(self, request) -> tuple[Any, Host] | None:
        parts = get_authorization_header(request).split()
        if not parts:
            return None  # IsHost answers 401 not_authenticated
        if parts[0].lower() != b"bearer" or len(parts) != 2:
            raise exceptions.AuthenticationFailed("Use 'Authorization: Bearer <host token>'.")
        try:
            raw = parts[1].decode()
        except UnicodeDecodeError:
            raise exceptions.AuthenticationFailed("Malformed host token.") from None
        host = host_by_token(raw=raw)
        if host is None:
            raise exceptions.AuthenticationFailed("Unknown or replaced host token.")
        return AnonymousUser(), host

    def authenticate_header(self, request) -> str:
        # Its presence makes DRF answer 401 (not 403) to a missing or bad token.
        return 'Bearer realm="gpucloud-agent"'


class IsHost(BasePermission):
    def has_permission(self, request, view) -> bool:
        return isinstance(request.auth, Host)


class AgentThrottle(SimpleRateThrottle):
    """AGENT_RATE_LIMIT per host (heartbeats) or per address (registration), in the shared cache."""

    scope = "agent"

    def get_rate(self) -> str:
        return settings.AGENT_RATE_LIMIT

    def get_cache_key(self, request, view) -> str:
        host = request.auth if isinstance(request.auth, Host) else None
        ident = f"host:{host.pk}" if host else f"ip:{self.get_ident(request)}"
        return self.cache_format % {"scope": self.scope, "ident": ident}


def _parse(message: Any, data: Any) -> Any:
    try:
        return message.from_dict(data)
    except ProtocolError as e:
        raise InvalidInput(f"{e.field}: {e.message}", fields={e.field: [e.message]}) from None


class _AgentApi(APIView):
    parser_classes = [JSONParser]
    renderer_classes = [JSONRenderer]
    throttle_classes = [AgentThrottle]


@extend_schema(exclude=True)
class HostRegisterApi(_AgentApi):
    """POST /agent/v1/register: RegisterRequest -> RegisterResponse."""

    authentication_classes: list = []
    permission_classes = [AllowAny]

    def post(self, request):
        req = _parse(RegisterRequest, request.data)
        host, token = host_register(req=req)
        body = RegisterResponse(
            host_id=str(host.pk),
            host_token=token,
            heartbeat_interval_s=float(settings.AGENT_HEARTBEAT_INTERVAL_S),
        )
        return Response(body.to_dict())


@extend_schema(exclude=True)
class HostHeartbeatApi(_AgentApi):
    """POST /agent/v1/heartbeat: Heartbeat -> HeartbeatResponse (the whole desired set)."""

    authentication_classes = [HostTokenAuthentication]
    permission_classes = [IsHost]

    def post(self, request):
        hb = _parse(Heartbeat, request.data)
        outcome = host_heartbeat(host=request.auth, hb=hb)
        body = HeartbeatResponse(
            desired=host_desired_containers(host=request.auth, allocations=outcome.allocations),
            heartbeat_interval_s=float(settings.AGENT_HEARTBEAT_INTERVAL_S),
            logs_requests=host_logs_requests(host=request.auth),
        )
        return Response(body.to_dict())
