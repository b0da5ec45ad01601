"""HTTP client for the agent protocol, on the standard library only (urllib)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any, Final

from agents.host import __version__
from agents.protocol import (
    HEARTBEAT_PATH,
    PROTOCOL_VERSION,
    REGISTER_PATH,
    VOLUME_MOVES_PATH,
    WAIT_PATH,
    Heartbeat,
    HeartbeatResponse,
    ProtocolError,
    RegisterRequest,
    RegisterResponse,
    WaitRequest,
    WaitResponse,
)

USER_AGENT: Final = f"gpucloud-agent/{__version__}"


class ControlPlaneError(Exception):
    """Base class. ``retryable``: try again later with backoff; containers keep running."""

    retryable = True


class Unreachable(ControlPlaneError):
    """Connection refused, timeout, DNS, 5xx, 429, or a reply that is not the protocol."""


class Unauthorized(ControlPlaneError):
    """401/403: the token is not (or no longer) accepted."""


class Rejected(ControlPlaneError):
    """Any other 4xx: this request will not succeed if repeated as is."""

    retryable = False


class ControlPlaneClient:
    def __init__(self, server: str, *, timeout_s: float = 10.0) -> None:
        self.server = server.rstrip("/")
        self.timeout_s = timeout_s

    def _post(
        self, path: str, body: dict[str, Any], token: str | None, timeout_s: float | None = None
    ) -> Any:
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": USER_AGENT,
            "X-Gpucloud-Protocol": str(PROTOCOL_VERSION),
        }
        if token:
            headers["Authorization"] = f"Bearer {token}"
        req = urllib.request.Request(
            self.server + path, data=json.dumps(body).encode(), headers=headers, method="POST"
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout_s or self.timeout_s) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as e:
            detail = _error_text(e)
            if e.code in (401, 403):
                raise Unauthorized(f"{path}: HTTP {e.code} {detail}") from None
            if e.code == 429 or e.code >= 500:
                raise Unreachable(f"{path}: HTTP {e.code} {detail}") from None
            raise Rejected(f"{path}: HTTP {e.code} {detail}") from None
        except (urllib.error.URLError, OSError) as e:  # refused, reset, timeout, DNS
            raise Unreachable(f"{path}: {e}") from None
        try:
            return json.loads(raw)
        except ValueError:
            raise Unreachable(f"{path}: reply is not JSON") from None

    def register(self, req: RegisterRequest) -> RegisterResponse:
        data = self._post(REGISTER_PATH, req.to_dict(), None)
        try:
            return RegisterResponse.from_dict(data)
        except ProtocolError as e:
            raise Unreachable(f"{REGISTER_PATH}: bad reply: {e}") from None

    def heartbeat(self, token: str, hb: Heartbeat) -> HeartbeatResponse:
        data = self._post(HEARTBEAT_PATH, hb.to_dict(), token)
        try:
            return HeartbeatResponse.from_dict(data)
        except ProtocolError as e:
            raise Unreachable(f"{HEARTBEAT_PATH}: bad reply: {e}") from None

    def wait(self, token: str, req: WaitRequest) -> WaitResponse:
        """The long poll: returns when the desired state moved past ``req.version`` or the
        wait timed out (``changed`` False)."""
        data = self._post(WAIT_PATH, req.to_dict(), token, timeout_s=req.timeout_s + self.timeout_s)
        try:
            return WaitResponse.from_dict(data)
        except ProtocolError as e:
            raise Unreachable(f"{WAIT_PATH}: bad reply: {e}") from None


class MoveClient:
    """The data of a volume move, relayed by the control plane (docs/volumes.md)."""

    def __init__(self, server: str, token: str, move_id: str, *, timeout_s: float = 60.0) -> None:
        self.base = f"{server.rstrip('/')}{VOLUME_MOVES_PATH}/{move_id}"
        self.token = token
        self.timeout_s = timeout_s

    def _call(self, method: str, path: str, data: bytes | None, content_type: str) -> bytes:
        headers = {"User-Agent": USER_AGENT, "Authorization": f"Bearer {self.token}",
                   "X-Gpucloud-Protocol": str(PROTOCOL_VERSION)}
        if data is not None:
            headers["Content-Type"] = content_type
        req = urllib.request.Request(self.base + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return bytes(resp.read())
        except urllib.error.HTTPError as e:
            detail = _error_text(e)
            if e.code in (401, 403):
                raise Unauthorized(f"{path}: HTTP {e.code} {detail}") from None
            if e.code == 429 or e.code >= 500:
                raise Unreachable(f"{path}: HTTP {e.code} {detail}") from None
            raise Rejected(f"{path}: HTTP {e.code} {detail}") from None
        except (urllib.error.URLError, OSError) as e:
            raise Unreachable(f"{path}: {e}") from None

    def put_chunk(self, seq: int, data: bytes) -> None:
        self._call("PUT", f"/chunks/{seq}", data, "application/octet-stream")

    def get_chunk(self, seq: int) -> bytes:
        return self._call("GET", f"/chunks/{seq}", None, "")

    def report(self, what: str, body: dict[str, Any]) -> str:
        """POST sent|received|failed; returns the move's state after it."""
        raw = self._call("POST", f"/{what}", json.dumps(body).encode(), "application/json")
        try:
            return str(json.loads(raw).get("state", ""))
        except (ValueError, AttributeError):
            raise Unreachable(f"/{what}: reply is not JSON") from None


def _error_text(e: urllib.error.HTTPError) -> str:
    """The message of the control plane's ``{"error": {"code", "message"}}`` body, if any."""
    try:
        body = json.loads(e.read() or b"{}")
        err = body.get("error", {})
        return f"{err.get('code', '')}: {err.get('message', '')}".strip(": ")
    except (ValueError, AttributeError, OSError):
        return ""
