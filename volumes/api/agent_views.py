"""The agents' side of a volume move (`/agent/v1/volume-moves/…`, docs/volumes.md): chunks
up from the source, down to the target, and the two reports. Host-token authenticated like
the heartbeat; each host only reaches the moves it takes part in, in its role."""
from __future__ import annotations

from django.http import HttpResponse
from drf_spectacular.utils import extend_schema
from rest_framework.parsers import BaseParser
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from agents.api.views import HostTokenAuthentication, IsHost
from gpucloud.api.parsers import AgentJSONParser
from gpucloud.lib.errors import InvalidInput
from volumes import moves


class OctetStreamParser(BaseParser):
    media_type = "application/octet-stream"

    def parse(self, stream, media_type=None, parser_context=None) -> bytes:
        data = stream.read(moves.CHUNK_BYTES + 1) if stream is not None else b""
        if len(data) > moves.CHUNK_BYTES:
            raise InvalidInput(f"Chunks hold at most {moves.CHUNK_BYTES} bytes.", code="move_too_large")
        return data


class _MoveApi(APIView):
    authentication_classes = [HostTokenAuthentication]
    permission_classes = [IsHost]
    renderer_classes = [JSONRenderer]
    parser_classes = [AgentJSONParser]


def _int(data, key: str, *, hi: int = 2**63 - 1) -> int:
    v = data.get(key) if isinstance(data, dict) else None
    if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= hi:
        raise InvalidInput(f"{key}: must be a whole number >= 0.", fields={key: ["A whole number >= 0."]})
    return v


def _sha(data) -> str:
    v = data.get("sha256") if isinstance(data, dict) else None
    if not isinstance(v, str) or len(v) != 64 or any(c not in "0123456789abcdef" for c in v):
        raise InvalidInput("sha256: 64 lower-case hex digits.", fields={"sha256": ["64 lower-case hex digits."]})
    return v


@extend_schema(exclude=True)
class MoveChunkApi(_MoveApi):
    parser_classes = [OctetStreamParser]

    def put(self, request, move_id, seq: int):
        moves.store_chunk(move_id=move_id, host=request.auth, seq=seq, data=request.data)
        return Response({"seq": seq, "bytes": len(request.data)})

    def get(self, request, move_id, seq: int):
        data = moves.read_chunk(move_id=move_id, host=request.auth, seq=seq)
        return HttpResponse(data, content_type="application/octet-stream")


@extend_schema(exclude=True)
class MoveSentApi(_MoveApi):
    def post(self, request, move_id):
        move = moves.mark_sent(move_id=move_id, host=request.auth, size_bytes=_int(request.data, "size_bytes"),
                               sha256=_sha(request.data), chunks=_int(request.data, "chunks", hi=2**31))
        return Response({"state": move.state})


@extend_schema(exclude=True)
class MoveReceivedApi(_MoveApi):
    def post(self, request, move_id):
        move = moves.mark_received(move_id=move_id, host=request.auth,
                                   size_bytes=_int(request.data, "size_bytes"), sha256=_sha(request.data))
        return Response({"state": move.state})


@extend_schema(exclude=True)
class MoveFailedApi(_MoveApi):
    def post(self, request, move_id):
        error = request.data.get("error") if isinstance(request.data, dict) else None
        move = moves.mark_failed(move_id=move_id, host=request.auth, error=str(error or "")[:400])
        return Response({"state": move.state})
