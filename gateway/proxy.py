"""The gateway's HTTP side: published container ports under /i/<instance id>/<port>/, and the
web terminal's WebSocket (docs/connect.md).

    browser ──HTTP / WebSocket──▶ proxy ──TCP stream over the host's tunnel──▶ agent ──▶ container port
    console page ──WebSocket /terminal/<id>?ticket=…──▶ proxy ──exec stream with a PTY──▶ agent ──▶ shell

Path-based, not one sub-domain per port: it needs no wildcard DNS name or certificate, works
on 127.0.0.1 and behind one host name, and the console's session cookie reaches it when the
gateway's HTTP port is on the console's host name (cookies ignore ports). The price: an app
that builds absolute links must know its prefix (the Jupyter port is configured for it by the
platform, `public.keeps_prefix`); every other port gets the path with the prefix taken off.

HTTP/1.1 on both sides with h11 (sans-I/O, so the upstream side runs over a tunnel stream as
well as over a socket); a WebSocket upgrade is passed through as bytes after the 101, so any
WebSocket protocol works (Jupyter kernels, TensorBoard). The web terminal speaks the
WebSocket protocol itself (websockets' sans-I/O ServerProtocol): binary messages are the
terminal's bytes both ways, text messages JSON control (`{"resize": [cols, rows]}` in,
`{"exit": status}` out).

Authorisation: the console's session cookie or `Authorization: Bearer <API key>` (checked
by `access.authorize_http` with the control plane's own rules); neither is passed on to the
container. 401 without credentials (or with bad ones), 404 for an instance the caller may
not reach, whoever's it is.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

import h11
from asgiref.sync import sync_to_async
from django.conf import settings
from websockets.datastructures import Headers
from websockets.frames import Frame, Opcode
from websockets.http11 import Request as WsRequest
from websockets.server import ServerProtocol

from agents.host import mux as m
from gateway import access, public, services

if TYPE_CHECKING:
    from gateway.server import Gateway

logger = logging.getLogger(__name__)

HOP_BY_HOP = {b"connection", b"keep-alive", b"proxy-connection", b"proxy-authenticate", b"proxy-authorization",
              b"te", b"trailer", b"upgrade"}
GRANT_CACHE_S = 5.0  # an authorisation is reused this long for the same credential and instance
MAX_HEAD = 64 * 1024


def _sync(fn: Any) -> Any:
    return sync_to_async(fn, thread_sensitive=False)


class Reply(Exception):
    """End the request with this status and message (the API's error shape)."""

    def __init__(self, status: int, code: str, message: str, headers: list[tuple[bytes, bytes]] | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers or []


def _header(headers: Sequence[tuple[bytes, bytes]], name: bytes) -> str:
    return ", ".join(v.decode("latin-1") for k, v in headers if k == name)


def _tokens(value: str) -> set[str]:
    return {t.strip().lower() for t in value.split(",") if t.strip()}


def _is_upgrade(headers: Sequence[tuple[bytes, bytes]]) -> bool:
    return "upgrade" in _tokens(_header(headers, b"connection")) and bool(_header(headers, b"upgrade"))


def _bearer(headers: Sequence[tuple[bytes, bytes]]) -> str:
    auth = _header(headers, b"authorization")
    return auth[7:].strip() if auth[:7].lower() == "bearer " else ""


# Every way into the HTTP side, by path prefix. tests/gateway/test_gateway_origin.py walks this
# table: each entrance must refuse a WebSocket from a foreign Origin, and a new one fails the
# test until it is added there (with how to reach it).
ENTRANCES: dict[str, str] = {"/healthz": "health", public.TERMINAL_PATH: "terminal", public.URL_PREFIX: "port"}


def entrance(path: str) -> str | None:
    """Which entrance `path` is ("health", "terminal", "port"), or None (404)."""
    if path == "/healthz":
        return ENTRANCES[path]
    return next((name for prefix, name in ENTRANCES.items() if prefix.endswith("/") and path.startswith(prefix)),
                None)


_DEFAULT_PORTS = {"http": 80, "ws": 80, "https": 443, "wss": 443}


def _origin(url: str) -> tuple[str, str, int | None] | None:
    """(scheme, host name, port or None for the scheme's default) of an origin or URL, lower-case;
    None when it is not one (`null`, no host, another scheme)."""
    try:
        parts = urlsplit(url.strip())
        host, port = (parts.hostname or ""), parts.port
    except ValueError:
        return None
    if parts.scheme not in _DEFAULT_PORTS or not host:
        return None
    return parts.scheme, host.lower(), None if port == _DEFAULT_PORTS[parts.scheme] else port


def origin_allowed(headers: Sequence[tuple[bytes, bytes]]) -> bool:
    """May a WebSocket authenticated by the console's cookie open from this request's Origin?

    Yes without an Origin (browsers always send one on a WebSocket handshake: no Origin is no
    browser, so no visitor's cookie is being borrowed); yes from the gateway's own host name
    (the port URL's origin; any port of it, as the cookie itself ignores ports: that is the
    console's when the gateway shares its host name, the only case the cookie reaches us), from
    GATEWAY_PUBLIC_HTTP_URL's origin and from the console's CSRF_TRUSTED_ORIGINS. No otherwise,
    `null` (a sandboxed or file page) included."""
    given = _header(headers, b"origin")
    if not given:
        return True
    seen = _origin(given)
    if seen is None:
        return False
    own = _origin("http://" + _header(headers, b"host"))
    if own is not None and own[1] == seen[1]:
        return True
    trusted = [settings.GATEWAY_PUBLIC_HTTP_URL, *settings.CSRF_TRUSTED_ORIGINS]
    return any(_origin(t) == seen for t in trusted)


class HttpProxy:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self._grants: dict[tuple[str, str, str], tuple[float, access.Grant]] = {}
        self.requests = 0
        self.connections: set[asyncio.Task[Any]] = set()

    def shutdown(self) -> None:
        """Cancel every open connection's task (the gateway is stopping)."""
        for task in list(self.connections):
            task.cancel()

    # ------------------------------------------------------------------ connections

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self.connections.add(task)
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        peer = writer.get_extra_info("peername") or ("", 0)
        source = f"{peer[0]}:{peer[1]}"
        try:
            while True:
                event = await _next_event(conn, lambda: reader.read(65536))
                if not isinstance(event, h11.Request):
                    break
                keep = await self._request(conn, event, reader, writer, source)
                if not keep or conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    break
                conn.start_next_cycle()
        except h11.RemoteProtocolError:
            if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                await _write(writer, conn, *_error(400, "bad_request", "That is not HTTP/1.1 this gateway reads."))
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except Exception:
            logger.exception("http proxy: connection from %s failed", source)
        finally:
            self.connections.discard(task)  # type: ignore[arg-type]
            writer.close()

    async def _request(self, conn: h11.Connection, req: h11.Request, reader: asyncio.StreamReader,
                       writer: asyncio.StreamWriter, source: str) -> bool:
        self.requests += 1
        target = req.target.decode("latin-1")
        path, _, query = target.partition("?")
        try:
            way_in = entrance(path)
            if way_in == "health":
                await _write(writer, conn, h11.Response(status_code=200, headers=[(b"content-length", b"3")]),
                             h11.Data(data=b"ok\n"), h11.EndOfMessage())
                await _drain_request(conn, reader)
                return True
            if way_in == "terminal":
                await self._terminal(conn, req, reader, writer, source, path[len(public.TERMINAL_PATH):], query)
                return False
            if way_in != "port":
                raise Reply(404, "not_found", "Nothing here: ports are served under /i/<instance id>/<port>/.")
            instance, _, rest = path[len(public.URL_PREFIX):].partition("/")
            port_s, slash, rest = rest.partition("/")
            if not port_s.isdigit() or not 0 < int(port_s) < 65536:
                raise Reply(404, "not_found", "Nothing here: ports are served under /i/<instance id>/<port>/.")
            port = int(port_s)
            if not slash:  # /i/<id>/<port> → /i/<id>/<port>/ (an app's relative links need the slash)
                location = public.port_prefix(instance, port) + (f"?{query}" if query else "")
                await _write(writer, conn, h11.Response(status_code=308, headers=[
                    (b"location", location.encode("latin-1")), (b"content-length", b"0")]), h11.EndOfMessage())
                await _drain_request(conn, reader)
                return True
            if _is_upgrade(req.headers) and not _bearer(req.headers) and not origin_allowed(req.headers):
                # a page of another site opening a WebSocket with the visitor's console cookie
                # (cross-site WebSocket hijacking); an API key is not sent by browsers on their own
                raise Reply(403, "forbidden_origin", "A WebSocket with the console's session opens from the "
                                                     "console's or the gateway's own site only.")
            grant = await self._authorize(req.headers, instance)
            if port not in grant.ports:
                raise Reply(404, "not_found", "No such instance, or it is not yours to reach, or that port "
                                              "is not published.")
            prefix = public.port_prefix(instance, port)
            upstream_target = target if port in grant.keep_prefix else "/" + rest + (f"?{query}" if query else "")
            return await self._forward(conn, req, reader, writer, source, grant, port, prefix, upstream_target)
        except Reply as r:
            if conn.our_state is h11.SEND_RESPONSE:
                response, body = _error(r.status, r.code, r.message, r.headers)
                await _write(writer, conn, response, body)
            return False

    async def _authorize(self, headers: Sequence[tuple[bytes, bytes]], instance: str) -> access.Grant:
        api_key = _bearer(headers)
        session_key = _cookies(headers).get(settings.SESSION_COOKIE_NAME, "")
        if not api_key and not session_key:
            raise Reply(401, "not_authenticated", "Sign in to the console, or send `Authorization: Bearer <api key>`.",
                        [(b"www-authenticate", b'Bearer realm="gateway"')])
        cache_key = ("k" if api_key else "s", api_key or session_key, instance)
        now = time.monotonic()
        hit = self._grants.get(cache_key)
        if hit is not None and hit[0] > now:
            return hit[1]
        found = await _sync(access.authorize_http)(instance=instance, session_key=session_key if not api_key else "",
                                                   api_key=api_key)
        if found == access.UNAUTHENTICATED:
            raise Reply(401, "not_authenticated", "This API key or console session is unknown, revoked or expired.",
                        [(b"www-authenticate", b'Bearer realm="gateway"')])
        if not isinstance(found, access.Grant):
            raise Reply(404, "not_found", "No such instance, or it is not yours to reach, or it is not running.")
        if len(self._grants) > 10000:
            self._grants = {k: v for k, v in self._grants.items() if v[0] > now}
        self._grants[cache_key] = (now + GRANT_CACHE_S, found)
        return found

    # ------------------------------------------------------------------ proxying

    async def _forward(self, conn: h11.Connection, req: h11.Request, reader: asyncio.StreamReader,
                       writer: asyncio.StreamWriter, source: str, grant: access.Grant, port: int, prefix: str,
                       target: str) -> bool:
        upgrade = _is_upgrade(req.headers)
        try:
            stream = await self.gateway.open_stream(grant, m.OPEN_TCP, {"port": port})
        except (m.OpenFailed, ConnectionError) as e:
            raise Reply(502, "bad_gateway", f"The instance's port {port} did not answer: {e}") from None
        try:
            up = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD)
            headers = _upstream_headers(req.headers, grant, port, prefix, source, upgrade)
            await stream.write(up.send(h11.Request(method=req.method, target=target.encode("latin-1"),
                                                   headers=headers)))
            if conn.they_are_waiting_for_100_continue:  # ours to answer: `expect` is not passed on
                writer.write(conn.send(h11.InformationalResponse(status_code=100, headers=[])))
            while True:  # the request body, as it comes
                event = await _next_event(conn, lambda: reader.read(65536))
                if isinstance(event, h11.Data):
                    await stream.write(up.send(h11.Data(data=event.data)))
                elif isinstance(event, h11.EndOfMessage):
                    await stream.write(up.send(h11.EndOfMessage()))
                    break
                elif event is None and upgrade:
                    break  # h11 pauses after an upgrade request's head: no body follows
                else:
                    raise ConnectionError("the client went away mid-request")
            while True:  # the response
                event = await _next_event(up, stream.read)
                if isinstance(event, h11.InformationalResponse) and event.status_code == 101 and upgrade:
                    writer.write(conn.send(h11.InformationalResponse(
                        status_code=101, headers=_downstream_headers(event.headers, upgrade=True))))
                    await self._splice(conn, up, reader, writer, stream, grant, source)
                    return False
                if isinstance(event, h11.InformationalResponse):
                    continue
                if isinstance(event, h11.Response):
                    writer.write(conn.send(h11.Response(status_code=event.status_code, reason=event.reason,
                                                        headers=_downstream_headers(event.headers))))
                elif isinstance(event, h11.Data):
                    writer.write(conn.send(event))
                    await writer.drain()
                elif isinstance(event, h11.EndOfMessage):
                    writer.write(conn.send(h11.EndOfMessage()))
                    await writer.drain()
                    return True
                else:
                    raise Reply(502, "bad_gateway", f"The instance's port {port} closed the connection mid-answer.")
        except h11.ProtocolError as e:
            raise Reply(502, "bad_gateway", f"The instance's port {port} did not answer in HTTP/1.1: {e}") from None
        except ConnectionError:
            if conn.our_state is h11.SEND_RESPONSE:
                raise Reply(502, "bad_gateway", f"The instance's port {port} closed the connection.") from None
            return False
        finally:
            await stream.close()

    async def _splice(self, conn: h11.Connection, up: h11.Connection, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter, stream: m.Stream, grant: access.Grant, source: str) -> None:
        """After a 101: bytes both ways until either side ends, as one audited session."""
        session = await self.gateway.start_session(grant, "websocket", source)
        if session is None:
            return
        session.streams.append(stream)
        session.end = lambda reason: writer.close()
        try:
            if conn.trailing_data[0]:
                await stream.write(conn.trailing_data[0])
            if up.trailing_data[0]:
                writer.write(up.trailing_data[0])

            async def client_to_container() -> None:
                while data := await reader.read(65536):
                    await stream.write(data)
                await stream.write_eof()

            async def container_to_client() -> None:
                while data := await stream.read():
                    writer.write(data)
                    await writer.drain()

            await _both_ways(client_to_container(), container_to_client())
        finally:
            await self.gateway.finish_session(session)

    # ------------------------------------------------------------------ the web terminal

    async def _terminal(self, conn: h11.Connection, req: h11.Request, reader: asyncio.StreamReader,
                        writer: asyncio.StreamWriter, source: str, instance: str, query: str) -> None:
        if "websocket" not in _header(req.headers, b"upgrade").lower():
            raise Reply(400, "bad_request", "The web terminal is a WebSocket.")
        ticket = (parse_qs(query).get("ticket") or [""])[0]
        origin = _header(req.headers, b"origin")
        grant = await _sync(access.authorize_terminal)(instance=instance, ticket=ticket, origin=origin) \
            if ticket else None
        if grant == services.WRONG_ORIGIN:
            raise Reply(403, "forbidden_origin", "The web terminal opens from the console page that asked for it "
                                                 "(this ticket is now used up: reload that page).")
        if not isinstance(grant, access.Grant):
            raise Reply(404, "not_found", "No such instance, or it is not yours to reach, or the page is stale "
                                          "(reload it).")
        ws = ServerProtocol(max_size=2**20)
        # websockets checks the handshake itself: it reads the request head h11 has parsed
        ws.receive_data(req.method + b" " + req.target + b" HTTP/1.1\r\n"
                        + b"".join(k + b": " + v + b"\r\n" for k, v in req.headers) + b"\r\n")
        head = [e for e in ws.events_received() if isinstance(e, WsRequest)]
        if not head:
            raise Reply(400, "bad_request", "That is not a WebSocket handshake.")
        response = ws.accept(head[0])
        if response.status_code != 101:
            ws.send_response(response)
            for chunk in ws.data_to_send():
                writer.write(chunk)
            await writer.drain()
            return
        session = await self.gateway.start_session(grant, "terminal", source)
        if session is None:
            raise Reply(429, "session_limit", "This tenant has reached its limit of open sessions.")
        ws.send_response(response)
        if conn.trailing_data[0]:
            ws.receive_data(conn.trailing_data[0])

        async def flush() -> None:
            for chunk in ws.data_to_send():
                if chunk:
                    writer.write(chunk)
            await writer.drain()

        def end(reason: str) -> None:  # a stop or a withdrawn membership: say why, then close
            ws.send_text(json.dumps({"closed": reason}).encode())
            ws.send_close(1000, reason[:100])
            for chunk in ws.data_to_send():
                writer.write(chunk)
            writer.close()

        session.end = end
        stream = None
        try:
            try:
                stream = await self.gateway.open_stream(grant, m.OPEN_EXEC, {
                    "command": None, "tty": True, "cols": 80, "rows": 24, "term": "xterm-256color"})
            except (m.OpenFailed, ConnectionError) as e:
                ws.send_text(json.dumps({"closed": f"gpucloud: {e}"}).encode())
                ws.send_close(1011, "open failed")
                await flush()
                return
            session.streams.append(stream)
            opened = stream

            async def client_to_shell() -> None:
                kind, parts = Opcode.BINARY, []
                while data := await reader.read(65536):
                    ws.receive_data(data)
                    for frame in ws.events_received():
                        if not isinstance(frame, Frame):
                            continue
                        if frame.opcode in (Opcode.TEXT, Opcode.BINARY):
                            kind, parts = frame.opcode, [bytes(frame.data)]
                        elif frame.opcode == Opcode.CONT:
                            parts.append(bytes(frame.data))
                        elif frame.opcode == Opcode.CLOSE:
                            await flush()
                            return
                        else:
                            continue  # ping, pong: answered by websockets
                        if frame.fin:
                            body = b"".join(parts)
                            await (_control(opened, body) if kind == Opcode.TEXT else opened.write(body))
                    await flush()  # pongs
                await opened.write_eof()

            async def shell_to_client() -> None:
                while data := await opened.read():
                    ws.send_binary(data)
                    await flush()
                await asyncio.wait_for(opened.exited.wait(), 2) if not opened.closed.is_set() else None
                ws.send_text(json.dumps({"exit": opened.exit_status}).encode())
                ws.send_close(1000, "exit")
                await flush()

            await _both_ways(client_to_shell(), shell_to_client(), linger_s=0)
        except (TimeoutError, ConnectionError):
            pass
        finally:
            if stream is not None:
                await stream.close()
            await self.gateway.finish_session(session)


async def _control(stream: m.Stream, body: bytes) -> None:
    try:
        msg = json.loads(body)
        cols, rows = msg["resize"]
        await stream.resize(max(1, min(int(cols), 1000)), max(1, min(int(rows), 1000)))
    except (ValueError, KeyError, TypeError):
        pass  # unknown control messages are ignored


async def _both_ways(up: Awaitable[None], down: Awaitable[None], *, linger_s: float = 5.0) -> None:
    """Run both directions; done when `down` (towards the client) is, or `linger_s` after `up`
    ended first (a client's half close: the answer may still be coming)."""
    up_task, down_task = asyncio.ensure_future(up), asyncio.ensure_future(down)
    try:
        await asyncio.wait({up_task, down_task}, return_when=asyncio.FIRST_COMPLETED)
        if not down_task.done() and linger_s > 0:
            await asyncio.wait({down_task}, timeout=linger_s)
        for t in (up_task, down_task):
            if t.done() and not t.cancelled() and t.exception() is not None:
                exc = t.exception()
                if not isinstance(exc, ConnectionError | TimeoutError):
                    raise exc  # type: ignore[misc]
    finally:
        up_task.cancel()
        down_task.cancel()


async def _next_event(conn: h11.Connection, read: Callable[[], Awaitable[bytes]]) -> Any:
    """The next h11 event, reading as needed; None when h11 pauses (after an upgrade)."""
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await read())
            continue
        if event is h11.PAUSED:
            return None
        return event


async def _write(writer: asyncio.StreamWriter, conn: h11.Connection, *events: Any) -> None:
    for event in events:
        data = conn.send(event)
        if data:
            writer.write(data)
    await writer.drain()


async def _drain_request(conn: h11.Connection, reader: asyncio.StreamReader) -> None:
    while conn.their_state is h11.SEND_BODY:
        event = await _next_event(conn, lambda: reader.read(65536))
        if event is None or isinstance(event, h11.ConnectionClosed):
            return


def _error(status: int, code: str, message: str,
           headers: list[tuple[bytes, bytes]] | None = None) -> tuple[h11.Response, h11.Data]:
    body = json.dumps({"error": {"code": code, "message": message, "fields": {}}}).encode() + b"\n"
    return (h11.Response(status_code=status, headers=[
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"), *(headers or [])]), h11.Data(data=body))


def _cookies(headers: Sequence[tuple[bytes, bytes]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in headers:
        if k != b"cookie":
            continue
        for part in v.decode("latin-1").split(";"):
            name, eq, value = part.strip().partition("=")
            if eq and name not in out:
                out[name] = value.strip().strip('"')
    return out


def _strip_cookie(value: bytes, name: str) -> bytes:
    parts = [p for p in value.decode("latin-1").split(";") if p.strip().partition("=")[0] != name]
    return ";".join(parts).strip().encode("latin-1")


def _upstream_headers(headers: Sequence[tuple[bytes, bytes]], grant: access.Grant, port: int, prefix: str,
                      source: str, upgrade: bool) -> list[tuple[bytes, bytes]]:
    """The client's headers less the hop-by-hop ones and the platform's credentials (the
    session cookie, a Bearer API key), plus X-Forwarded-* and, on the Jupyter port, its token."""
    out: list[tuple[bytes, bytes]] = []
    cookie_name = settings.SESSION_COOKIE_NAME
    authorization = False
    for k, v in headers:
        if k in HOP_BY_HOP or k == b"expect" or k.startswith(b"x-forwarded-"):
            continue
        if k == b"cookie":
            v = _strip_cookie(v, cookie_name)
            if not v:
                continue
        if k == b"authorization":
            if v[:7].lower() == b"bearer ":
                continue  # ours: the API key
            authorization = True
        out.append((k, v))
    if upgrade:
        out += [(b"connection", b"Upgrade"), (b"upgrade", _header(headers, b"upgrade").encode("latin-1"))]
    host = _header(headers, b"host")
    out += [(b"x-forwarded-for", source.rpartition(":")[0].encode()), (b"x-forwarded-proto", b"http"),
            (b"x-forwarded-host", host.encode("latin-1")), (b"x-forwarded-prefix", prefix.rstrip("/").encode())]
    if port in grant.keep_prefix and not authorization and grant.jupyter_token:
        out.append((b"authorization", f"token {grant.jupyter_token}".encode()))
    return out


def _downstream_headers(headers: Sequence[tuple[bytes, bytes]], *, upgrade: bool = False) -> list[tuple[bytes, bytes]]:
    """The app's answer less hop-by-hop headers, and less any cookie named as the console's
    (an app could otherwise plant a session or CSRF cookie on the console's host name)."""
    ours = {settings.SESSION_COOKIE_NAME.encode(), settings.CSRF_COOKIE_NAME.encode()}
    out = [(k, v) for k, v in headers if k not in HOP_BY_HOP
           and not (k == b"set-cookie" and v.partition(b"=")[0].strip() in ours)]
    if upgrade:
        out += [(b"connection", b"Upgrade"), (b"upgrade", _header(headers, b"upgrade").encode("latin-1"))]
    return out


def _ws_headers(headers: list[tuple[bytes, bytes]]) -> Any:
    h = Headers()
    for k, v in headers:
        h[k.decode("latin-1")] = v.decode("latin-1")
    return h


