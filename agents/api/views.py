"""The agent API, `/agent/v1/`: thin views over `agents.services` (see agents/protocol.py).

Not the tenants' API: no API keys, no sessions (hence no CSRF), not in the OpenAPI
schema (the protocol is documented in docs/agent.md). Errors use the one error shape.
Registration authenticates with the bootstrap token in the body; heartbeats with
`Authorization: Bearer <host token>`. Both are rate-limited (per host, else per address).

Heartbeats enter through `host_heartbeat_view`, a plain Django view: the fast path
(agents/fastpath.py) answers an unchanged heartbeat from Redis without touching the
database; a change that its script authenticated, counted and claimed is applied by the
same code as the DRF view's (`_heartbeat_answer`) without DRF around it; everything else
(a token Redis does not know and the database refuses, throttled, malformed, a body
naming another host) goes on to the DRF view below, which writes those errors.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any, Final
from uuid import UUID

import orjson
from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.db import connection
from django.http import HttpResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.permissions import AllowAny, BasePermission
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from agents import fastpath, longpoll
from agents.models import Host
from agents.protocol import (
    Heartbeat,
    HeartbeatResponse,
    ProtocolError,
    RegisterRequest,
    RegisterResponse,
    WaitRequest,
    WaitResponse,
)
from agents.selectors import (
    holds_moved,
    host_by_pk,
    host_by_token,
    host_desired_containers,
    host_holds_after,
    host_logs_requests,
)
from agents.services.gpus import gpu_samples_apply
from agents.services.heartbeat import host_heartbeat
from agents.services.registration import host_register
from agents.signals import move_orders, removals
from gpucloud.api.errors import exception_handler
from gpucloud.api.parsers import AgentJSONParser
from gpucloud.api.throttling import AtomicRateThrottle
from gpucloud.lib import promstore
from gpucloud.lib.errors import InvalidInput
from gpucloud.lib.http import client_ip
from gpucloud.tenancy.audit import Actor, acting_as


class HostTokenAuthentication(BaseAuthentication):
    """`Authorization: Bearer <host token>` -> (AnonymousUser, Host). `request.auth` is the host."""

    def authenticate(self, request) -> tuple[Any, Host] | None:
        claim = _claim(request)
        if claim is not None and claim.host_id:
            # The fast path's script found the token current (or it was checked just now).
            host = claim.host or host_by_pk(claim.host_id)
            if host is not None:
                return AnonymousUser(), host
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


class AgentThrottle(AtomicRateThrottle):
    """AGENT_RATE_LIMIT per host (heartbeats) or per address (registration), counted atomically
    in Redis: heartbeats in the fast path's script (one limit for fast and slow), the rest in
    gpucloud.lib.ratelimit."""

    scope = "agent"

    def get_rate(self) -> str:
        return settings.AGENT_RATE_LIMIT

    def allow_request(self, request, view) -> bool:
        host = request.auth if isinstance(request.auth, Host) else None
        claim = _claim(request)
        if claim is not None:
            # Counted by the fast path's script already (it also said whether it was over).
            self.claim_wait = claim.wait
            return claim.kind != fastpath.THROTTLED
        if host is not None and fastpath.enabled():
            # Heartbeats share one limit with the fast path: its sliding log in Redis.
            c = fastpath.claim_of(fastpath.beat(None, host_id=str(host.pk)), None)
            self.claim_wait = c.wait
            return c.kind != fastpath.THROTTLED
        return super().allow_request(request, view)

    def wait(self) -> float | None:
        if hasattr(self, "claim_wait"):
            return self.claim_wait
        return super().wait()

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
    parser_classes = [AgentJSONParser]
    renderer_classes = [JSONRenderer]
    throttle_classes = [AgentThrottle]


@extend_schema(exclude=True)
class HostRegisterApi(_AgentApi):
    """POST /agent/v1/register: RegisterRequest -> RegisterResponse."""

    authentication_classes: list = []
    permission_classes = [AllowAny]

    def post(self, request):
        req = _parse(RegisterRequest, request.data)
        # No user: the audit records (a refusal above all) carry the caller's address.
        with acting_as(Actor(ip=client_ip(request))):
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
        claim = _claim(request)  # the fast path's verdict, when its script saw this request
        hb = claim.hb if claim is not None and claim.hb is not None else None
        hb = hb or _parse(Heartbeat, request.data)
        host = request.auth
        if claim is None and fastpath.enabled():
            # The script did not see this body (the fast path could not parse it, DRF
            # could): claim the seq in Redis all the same, where seqs are ordered while the
            # fast path is on. Nothing is cached from such a heartbeat.
            claim = fastpath.claim_of(
                fastpath.beat(None, host_id=str(host.pk), seq=hb.seq, count=False), None
            )
        return Response(_heartbeat_answer(host=host, hb=hb, claim=claim))


def _heartbeat_answer(*, host: Host, hb: Heartbeat, claim: fastpath.Claim | None) -> dict:
    """Apply the heartbeat `hb` of `host` (authenticated, its seq claimed when `claim`) and
    make its answer: the HeartbeatResponse as a dict; remembered for the fast path.

    With the fast path, GPU samples that move no GPU's health go to its buffer in the round
    trip that remembers the answer (one less per changed heartbeat); whatever happens before
    it, they are buffered on the way out, or written here where Redis refuses them."""
    now = timezone.now()
    later: list[bytes] = []
    try:
        return _heartbeat_apply(host=host, hb=hb, claim=claim, now=now, later=later)
    finally:
        if later and not fastpath.samples_push(later):
            gpu_samples_apply(host=host, samples=hb.gpus, now=now)


def _heartbeat_apply(*, host: Host, hb: Heartbeat, claim: fastpath.Claim | None, now: datetime,
                     later: list[bytes]) -> dict:
    """`_heartbeat_answer`'s work; the samples' buffer record is left in `later` until
    `remember` took it (then emptied)."""
    with fastpath.own_bumps(host_id=host.pk) as own:
        outcome = host_heartbeat(host=host, hb=hb, now=now, fresh=None if claim is None else claim.fresh,
                                 buffer_samples=claim is not None,
                                 samples_later=later if claim is not None else None)
    host = outcome.host or host
    answer_version = claim.version if claim is not None else ""
    alone = claim is not None
    holds = outcome.holds
    if outcome.transitions:
        if claim is not None:
            # Our own transitions bumped the version: the answer is the new version's. When
            # the bumps since the claim were all ours, the last of them says which it is
            # (a bump by anybody after it leaves that answer unused); else it is read after
            # them, and so is the answer.
            alone = bool(own) and fastpath.only_own(before=claim.version, after=str(max(own)), own=own)
            answer_version = str(max(own)) if alone else fastpath.version(host_id=host.pk)
        if holds is not None:
            holds = (holds_moved(holds, outcome.transitions) if alone
                     else host_holds_after(host=host, holds=holds, moved={wid for wid, _ in outcome.transitions}))
    # what the volume signals' receivers read once for both lists (some read with the host's row)
    shared = outcome.answer_reads if alone and outcome.answer_reads is not None else {}
    body = HeartbeatResponse(
        desired=host_desired_containers(host=host, holds=holds),
        heartbeat_interval_s=float(settings.AGENT_HEARTBEAT_INTERVAL_S),
        logs_requests=(outcome.logs_requests if alone and outcome.logs_requests is not None
                       else host_logs_requests(host=host)),
        desired_version=answer_version if claim is not None and longpoll.enabled() else None,
        remove_volumes=removals(host=host, shared=shared),
        volume_moves=move_orders(host=host, shared=shared),
        start_attempts=settings.WORKLOAD_START_ATTEMPTS,
    ).to_dict()
    if claim is not None and (claim.digest or claim.token_hash):
        if not outcome.applied or outcome.unknown_gpus:
            claim.digest = ""  # a late heartbeat, or GPUs we do not know: not a baseline
        fastpath.remember(
            claim=claim,
            answer_version=answer_version,
            answer=orjson.dumps(body),
            token_ok=bool(claim.token_hash) and outcome.token_hash == claim.token_hash,
            alone=alone,
            samples=later,  # (emptied once buffered)
        )
    return body


@extend_schema(exclude=True)
class HostWaitApi(_AgentApi):
    """POST /agent/v1/wait: WaitRequest -> WaitResponse, a long poll (agents/longpoll.py)."""

    authentication_classes = [HostTokenAuthentication]
    permission_classes = [IsHost]

    def post(self, request):
        req = _parse(WaitRequest, request.data)
        host = request.auth
        if req.host_id != str(host.pk):
            raise exceptions.AuthenticationFailed("This token belongs to another host.")
        changed = False
        if longpoll.enabled():
            changed = longpoll.wait(host_id=str(host.pk), since=req.version, timeout_s=req.timeout_s,
                                    on_park=connection.close)
        return Response(WaitResponse(changed=changed).to_dict())


_wait_api = HostWaitApi.as_view()


@csrf_exempt
def host_wait_view(request):
    """POST /agent/v1/wait: with the host token known to Redis (the heartbeat fast path's
    cache) the long poll is answered here, without DRF and without the database: one Redis
    script authenticates and counts it, as a fast heartbeat. Everything else (an unknown or
    replaced token, throttled, malformed, long polls off) goes to the DRF view, which
    answers it in the one error shape.

    A parked long poll holds no database connection (`on_park`; the agent API has no atomic
    requests): with DB_CONN_MAX_AGE each thread would otherwise keep one, and a fleet of waits
    would take PostgreSQL's max_connections from everything else. One answered at once keeps
    it, so the thread's next request does not connect again."""
    if request.method != "POST" or not longpoll.enabled():
        return _wait_api(request)
    parts = request.META.get("HTTP_AUTHORIZATION", "").split()
    if len(parts) != 2 or parts[0].lower() != "bearer":
        return _wait_api(request)
    try:
        req = WaitRequest.from_dict(orjson.loads(request.body))
    except (orjson.JSONDecodeError, ProtocolError):
        return _wait_api(request)
    kind, host_id = fastpath.authenticate(raw_token=parts[1])
    if kind != fastpath.SLOW or host_id != req.host_id:
        return _wait_api(request)
    changed = longpoll.wait(host_id=host_id, since=req.version, timeout_s=req.timeout_s,
                            on_park=connection.close)
    return HttpResponse(orjson.dumps(WaitResponse(changed=changed).to_dict()), content_type="application/json")


def _claim(request) -> fastpath.Claim | None:
    return getattr(getattr(request, "_request", request), "agent_claim", None)


_heartbeat_api = HostHeartbeatApi.as_view()


@csrf_exempt
def host_heartbeat_view(request):
    """POST /agent/v1/heartbeat, counted and timed for `/metrics` (gpucloud.lib.promstore)."""
    t0 = time.perf_counter()
    response = _host_heartbeat(request)
    if request.method == "POST" and response.status_code == 200:
        path = getattr(request, "heartbeat_path", "slow")
        (promstore.Batch().inc("gpucloud_heartbeats", (path,))
         .observe("gpucloud_heartbeat_seconds", (path,), time.perf_counter() - t0).send(coalesce=True))
    return response


def _host_heartbeat(request):
    """POST /agent/v1/heartbeat: the fast path, else the synchronous path.

    A heartbeat the fast path fully accepts is answered here (200, the cached answer); one
    it claimed but cannot answer is applied here too, without DRF (`_heartbeat_lean`). A
    token unknown to Redis is checked in the database once and the script run again; every
    refusal (401, 429, 400) is the DRF view's, in the one error shape.
    """
    if request.method != "POST" or not fastpath.enabled():
        return _heartbeat_api(request)
    parsed = fastpath.parse(request)
    if parsed is None:
        return _heartbeat_api(request)  # it says what is wrong
    reply = fastpath.beat(parsed)
    host = None
    if int(reply[0]) == fastpath.MISS:
        host = host_by_token(raw=request.META["HTTP_AUTHORIZATION"].split()[1])
        if host is None:
            return _heartbeat_api(request)  # 401
        reply = fastpath.beat(parsed, host_id=str(host.pk))
    if int(reply[0]) == fastpath.FAST:
        request.heartbeat_path = "fast"
        return HttpResponse(reply[1], content_type="application/json")
    claim = fastpath.claim_of(reply, parsed)
    claim.host = host
    if host is not None:
        claim.host_id = str(host.pk)
    if claim.kind == fastpath.SLOW and request.META.get("HTTP_ACCEPT", "").strip() in _JSON_ACCEPT:
        return _heartbeat_lean(request, claim)
    request.agent_claim = claim
    return _heartbeat_api(request)


# What the DRF view negotiates to its one renderer, JSON: an agent's request (the agent sends
# application/json). Anything else goes to the DRF view, which answers as it always did.
_JSON_ACCEPT: Final = frozenset({"", "*/*", "application/json"})


def _heartbeat_lean(request, claim: fastpath.Claim):
    """The DRF view's `post` for a heartbeat the script claimed, without DRF's request
    wrapping, negotiation, authentication and throttle classes: the script did their work
    (a host token current in Redis or checked just now, counted against the rate limit,
    its seq claimed). The same service, the same answer, its errors in the one error shape
    by the same handler (gpucloud.api.errors); every refusal before it (401, 429, 400, a
    body naming another host) is still the DRF view's."""
    if claim.hb is None or claim.hb.host_id != claim.host_id:
        request.agent_claim = claim
        return _heartbeat_api(request)  # it refuses a body naming another host
    # The host row is read (locked) by the heartbeat itself: a host deleted meanwhile is a
    # 401 from the DRF view, whose authentication reads it again.
    host = claim.host or Host(pk=UUID(claim.host_id))
    try:
        body = _heartbeat_answer(host=host, hb=claim.hb, claim=claim)
    except Host.DoesNotExist:
        request.agent_claim = claim
        return _heartbeat_api(request)
    except Exception as exc:
        response = exception_handler(exc, {"request": request})
        if response is None:
            raise  # a bug: Django's 500 handler answers, as behind DRF
        out = HttpResponse(orjson.dumps(response.data), status=response.status_code,
                           content_type="application/json")
        for name, value in response.headers.items():
            out.headers.setdefault(name, value)
        return out
    return HttpResponse(orjson.dumps(body), content_type="application/json")
