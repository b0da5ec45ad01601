"""The gateway process: agents' tunnels in, SSH sessions out through them.

    user ──ssh -p 2222 <instance>@gw──▶ SSH server ──stream over the host's tunnel──▶ agent ──exec/TCP──▶ container
    agent ──WebSocket /tunnel, Bearer <host token>──▶ tunnel endpoint (hosts need no inbound port)

One asyncio loop holds both servers, the tunnels (host id → Mux), the open sessions and
the loop that re-checks them every `recheck_s` (an instance that stopped, a member removed
or demoted: the session is ended). The routing table host → replica lives in Redis with
an expiry (`routes.py`), refreshed while the tunnel is up. A session for a host whose tunnel
another replica holds is relayed there (`relay.py`: this replica's relay port answers the others).
"""
from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import secrets
import time
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Any

import asyncssh
from asgiref.sync import sync_to_async
from django.conf import settings
from websockets.asyncio.server import ServerConnection, serve
from websockets.http11 import Request, Response

from agents.host import mux as m
from gateway import access, relay
from gateway.proxy import HttpProxy
from gateway.routes import Routes

logger = logging.getLogger(__name__)

# The subsystem "sftp" runs the image's own sftp-server; an image without one gets this
# message on stderr and exit status 127 (scp -O needs `scp` in the image instead).
SFTP_COMMAND = (
    "for p in /usr/lib/openssh/sftp-server /usr/lib/ssh/sftp-server /usr/libexec/openssh/sftp-server "
    "/usr/libexec/sftp-server /usr/lib/sftp-server; do [ -x \"$p\" ] && exec \"$p\"; done; "
    "echo 'gpucloud: this image has no sftp-server, so sftp and scp are not available' >&2; exit 127"
)


@dataclass
class GatewayConfig:
    bind: str = "127.0.0.1"
    ssh_port: int = 2222
    tunnel_port: int = 8022
    http_port: int | None = 8088  # None: no HTTP side
    host_key_path: Path = Path("var/gateway_host_key")
    replica: str = "gw-1"
    recheck_s: float = 2.0
    session_limit: int = 20  # open sessions per tenant (on all replicas sharing Redis)
    redis_url: str = ""
    relay_port: int | None = None  # other replicas' relay connections (gateway/relay.py); None: none
    relay_host: str = ""  # where other replicas reach it (empty: relay.advertised_host)
    relay_secret: bytes = b""  # empty: derived from SECRET_KEY (relay.derive_secret)


def _sync(fn: Any) -> Any:
    return sync_to_async(fn, thread_sensitive=False)


def load_host_key(path: Path) -> asyncssh.SSHKey:
    """The persisted host key (created on first start), and its .pub beside it for the console."""
    if path.exists():
        key = asyncssh.read_private_key(str(path))
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        key = asyncssh.generate_private_key("ssh-ed25519")
        key.write_private_key(str(path))
        path.chmod(0o600)
    pub = path.with_name(path.name + ".pub")
    if not pub.exists():
        key.write_public_key(str(pub))
    return key


@dataclass
class Session:
    id: int
    grant: access.Grant
    kind: str  # shell | exec | sftp | forward
    source: str
    started: float = field(default_factory=time.time)
    streams: list[m.Stream] = field(default_factory=list)
    end: Any = None  # callable that ends the session on the client's side
    reason: str = ""

    @property
    def bytes(self) -> tuple[int, int]:
        return sum(s.bytes_out for s in self.streams), sum(s.bytes_in for s in self.streams)


class Gateway:
    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.tunnels: dict[str, m.Mux] = {}
        self.tunnel_changed = asyncio.Event()
        self.sessions: dict[int, Session] = {}
        self._ids = itertools.count(1)
        self._incarnation = secrets.token_hex(4)  # session leases of an earlier run of this replica are not ours
        self.routes = Routes(config.redis_url, replica=config.replica)
        self.ssh_port = config.ssh_port
        self.tunnel_port = config.tunnel_port
        self.http_port = config.http_port
        self.host_key = load_host_key(config.host_key_path)
        self.ready = asyncio.Event()
        self.wakes_sent = 0
        if config.relay_secret:
            secret = config.relay_secret
        else:
            secret = relay.derive_secret(getattr(settings, "GATEWAY_RELAY_SECRET", ""), settings.SECRET_KEY)
        self.relay = relay.RelayServer(secret, self.open_local)
        self.relay_port = config.relay_port
        self.relayed_out = 0  # streams this replica opened through another
        self._auditing = 0  # session audit writes under way

    # ------------------------------------------------------------------ running

    async def serve(self, stop: asyncio.Event) -> None:
        ssh = await asyncssh.create_server(
            lambda: _SshServer(self), self.config.bind, self.config.ssh_port,
            server_host_keys=[self.host_key],
            encoding=None, line_editor=False, allow_scp=False, agent_forwarding=False,
            x11_forwarding=False, keepalive_interval=15,
        )
        self.ssh_port = ssh.sockets[0].getsockname()[1]
        async with serve(self._tunnel, self.config.bind, self.config.tunnel_port,
                         process_request=self._check_token, max_size=2**20,
                         ping_interval=10, ping_timeout=20) as ws:
            self.tunnel_port = ws.sockets[0].getsockname()[1]
            http = None
            if self.config.http_port is not None:
                self.proxy = HttpProxy(self)
                http = await asyncio.start_server(self.proxy.handle, self.config.bind, self.config.http_port)
                self.http_port = http.sockets[0].getsockname()[1]
            relay_server, advertise = None, None
            if self.config.relay_port is not None:
                relay_server = await asyncio.start_server(self.relay.handle, self.config.bind, self.config.relay_port)
                self.relay_port = relay_server.sockets[0].getsockname()[1]
                address = f"{relay.advertised_host(self.config.bind, self.config.relay_host)}:{self.relay_port}"
                advertise = asyncio.ensure_future(self._advertise(address))
            logger.info("gateway %s: ssh on %s:%s, tunnels on %s:%s, http on %s:%s, relay on %s:%s, host key %s",
                        self.config.replica, self.config.bind, self.ssh_port, self.config.bind, self.tunnel_port,
                        self.config.bind, self.http_port, self.config.bind, self.relay_port,
                        self.host_key.get_fingerprint())
            recheck = asyncio.ensure_future(self._recheck_loop())
            renew = asyncio.ensure_future(self._renew_sessions())
            wakes = asyncio.ensure_future(self.routes.listen_wakes(self.wake))
            self.ready.set()
            try:
                await stop.wait()
            finally:
                recheck.cancel()
                renew.cancel()
                wakes.cancel()
                ssh.close()
                if http is not None:
                    http.close()
                    self.proxy.shutdown()
                if relay_server is not None and advertise is not None:
                    advertise.cancel()
                    relay_server.close()
                    self.relay.shutdown()
                    try:
                        await self.routes.withdraw()
                    except Exception:  # Redis gone: the entry expires
                        logger.warning("could not withdraw this replica's relay address", exc_info=True)
                for session in list(self.sessions.values()):
                    self._end(session, "gateway shutting down")
                # the ended sessions' `session.end` written before the loop goes (bounded)
                deadline = time.monotonic() + 3
                while (self.sessions or self._auditing) and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                for mux in list(self.tunnels.values()):
                    mux.shutdown()
                await self.routes.close()

    # ------------------------------------------------------------------ tunnels

    async def _check_token(self, connection: ServerConnection, request: Request) -> Response | None:
        auth = request.headers.get("Authorization", "")
        token = auth[7:] if auth.startswith("Bearer ") else ""
        host_id = await _sync(access.host_for_token)(token) if token else None
        if host_id is None:
            return connection.respond(HTTPStatus.UNAUTHORIZED, "bad host token\n")
        connection.host_id = host_id  # type: ignore[attr-defined]
        return None

    async def _tunnel(self, ws: ServerConnection) -> None:
        host_id: str = ws.host_id  # type: ignore[attr-defined]

        async def send(frame: bytes) -> None:
            await ws.send(frame)

        mux = m.Mux(send)
        old = self.tunnels.get(host_id)
        if old is not None:
            old.shutdown("replaced by a newer tunnel")
        self.tunnels[host_id] = mux
        await self.routes.claim(host_id)
        await self.routes.watch(host_id, True)
        self.tunnel_changed.set()
        logger.info("tunnel up: host %s", host_id)
        refresh = asyncio.ensure_future(self._refresh_route(host_id, mux))
        try:
            async for message in ws:
                if isinstance(message, bytes):
                    await mux.feed(message)
        finally:
            refresh.cancel()
            mux.shutdown()
            if self.tunnels.get(host_id) is mux:
                del self.tunnels[host_id]
                await self.routes.release(host_id)
                await self.routes.watch(host_id, False)
            logger.info("tunnel down: host %s", host_id)

    async def _advertise(self, address: str) -> None:
        """Keep this replica's relay address in the table, as routes are (Redis errors: retried)."""
        while True:
            try:
                await self.routes.advertise(address)
            except Exception:
                logger.warning("could not advertise the relay address %s", address, exc_info=True)
            await asyncio.sleep(self.routes.ttl_s / 3)

    def _lease(self, session: Session) -> str:
        """The session's name in its tenant's count: unique across this replica's restarts."""
        return f"{self._incarnation}.{session.id}"

    async def _renew_sessions(self) -> None:
        """Keep the leases of this replica's open sessions in the tenants' counts (Redis errors: retried)."""
        while True:
            await asyncio.sleep(self.routes.ttl_s / 3)
            held = [(str(s.grant.tenant_id), self._lease(s)) for s in self.sessions.values()]
            try:
                await self.routes.session_renew(held, now=time.time())
            except Exception:
                logger.warning("could not renew the sessions' leases", exc_info=True)

    async def _refresh_route(self, host_id: str, mux: m.Mux) -> None:
        while not mux.closed:
            await asyncio.sleep(self.routes.ttl_s / 3)
            await self.routes.claim(host_id)

    async def wake(self, host_id: str) -> bool:
        """Tell the host's agent to heartbeat now (its desired state changed)."""
        mux = self.tunnels.get(host_id)
        if mux is None:
            return False
        try:
            await mux.wake()
        except Exception:  # the tunnel is going down: its agent heartbeats on reconnect anyway
            return False
        self.wakes_sent += 1
        return True

    # ------------------------------------------------------------------ sessions

    async def start_session(self, grant: access.Grant, kind: str, source: str) -> Session | None:
        """A session counted against its tenant's limit (across replicas where they share Redis),
        audited; None when the tenant is at its limit."""
        session = Session(id=next(self._ids), grant=grant, kind=kind, source=source)
        try:
            admitted = await self.routes.session_admit(str(grant.tenant_id), self._lease(session),
                                                       limit=self.config.session_limit, now=time.time())
        except Exception:  # Redis unreachable: this replica's own count, rather than no session at all
            logger.warning("could not count session %s across replicas", session.id, exc_info=True)
            admitted = None
        if admitted is None:  # no Redis (the demo's single gateway): this replica's own count
            open_here = sum(1 for s in self.sessions.values() if s.grant.tenant_id == grant.tenant_id)
            admitted = open_here < self.config.session_limit
        if not admitted:
            return None
        self.sessions[session.id] = session
        await self._audit(
            grant=grant, action="session.start", source_ip=source.split(":")[0] or None,
            data={"session": f"{self.config.replica}/{session.id}", "kind": kind, "source": source})
        return session

    async def _audit(self, **kwargs: Any) -> None:
        self._auditing += 1
        try:
            await _sync(access.audit_session)(**kwargs)
        finally:
            self._auditing -= 1

    async def finish_session(self, session: Session, reason: str = "") -> None:
        if self.sessions.pop(session.id, None) is None:
            return
        try:
            await self.routes.session_release(str(session.grant.tenant_id), self._lease(session))
        except Exception:  # Redis gone: the lease lapses within the routes' expiry
            logger.warning("could not release session %s from its tenant's count", session.id, exc_info=True)
        sent, received = session.bytes
        await self._audit(
            grant=session.grant, action="session.end", source_ip=session.source.split(":")[0] or None,
            data={"session": f"{self.config.replica}/{session.id}", "kind": session.kind, "source": session.source,
                  "started": session.started, "ended": time.time(), "bytes_in": sent, "bytes_out": received,
                  "reason": session.reason or reason})

    def _end(self, session: Session, reason: str) -> None:
        session.reason = reason
        for s in session.streams:
            asyncio.ensure_future(s.close(reason))
        if session.end is not None:
            session.end(reason)

    async def _recheck_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.recheck_s)
            sessions = list(self.sessions.values())
            if not sessions:
                continue
            try:
                verdicts = await _sync(access.still_allowed)([s.grant for s in sessions])
            except Exception:
                logger.exception("session re-check failed")
                continue
            for session, ok in zip(sessions, verdicts, strict=True):
                if not ok:
                    logger.info("ending session %s: access withdrawn", session.id)
                    self._end(session, "the instance stopped or your access was withdrawn")

    async def open_stream(self, grant: access.Grant, kind: int, params: dict[str, Any]) -> m.Stream:
        """A stream to the grant's container: over the host's tunnel when this replica holds it,
        else relayed through the replica that does (gateway/relay.py). Host and container come
        from the grant only; `params` are the command or port."""
        params = {**params, "instance": grant.container}
        mux = self.tunnels.get(grant.host_id)
        if mux is not None:
            return await mux.open(kind, params)
        try:
            where = await self.routes.lookup(grant.host_id)
            address = await self.routes.address_of(where) if where and where != self.config.replica else None
        except Exception:  # Redis down: as good as no route
            logger.warning("the routing table could not be read", exc_info=True)
            raise m.OpenFailed("the gateway's routing table is not reachable just now (try again shortly)") from None
        if where is None or where == self.config.replica:
            raise m.OpenFailed("the instance's host is not connected to any gateway just now (try again shortly)")
        if address is None:
            raise m.OpenFailed(f"the instance's host is connected to gateway replica {where}, which does not relay")
        stream = await relay.open_remote(address, self.relay.secret, kind, {**params, "host": grant.host_id})
        self.relayed_out += 1
        return stream

    async def open_local(self, host_id: str, kind: int, params: dict[str, Any]) -> m.Stream:
        """For another replica's relay: a stream on a tunnel this replica holds, and only that."""
        mux = self.tunnels.get(host_id)
        if mux is None:
            raise m.OpenFailed("the instance's host is not connected to this gateway replica")
        return await mux.open(kind, params)

    # ------------------------------------------------------------------ SSH processes

    async def _process(self, process: asyncssh.SSHServerProcess[bytes]) -> None:
        grant: access.Grant = process.get_extra_info("grant")
        peer = process.get_extra_info("peername") or ("", "")
        source = f"{peer[0]}:{peer[1]}"
        subsystem = process.subsystem
        if subsystem and subsystem != "sftp":
            process.stderr.write(f"gpucloud: subsystem {subsystem} is not supported\r\n".encode())
            process.exit(1)
            return
        command = SFTP_COMMAND if subsystem == "sftp" else process.command
        tty = process.term_type is not None and subsystem is None
        kind = "sftp" if subsystem else ("exec" if command else "shell")
        session = await self.start_session(grant, kind, source)
        if session is None:
            process.stderr.write(b"gpucloud: this tenant has reached its limit of open sessions\r\n")
            process.exit(1)
            return
        session.end = lambda reason: (process.stderr.write(f"\r\ngpucloud: {reason}\r\n".encode()),
                                      process.exit(255))
        try:
            cols, rows = process.term_size[:2] if tty else (0, 0)
            try:
                stream = await self.open_stream(grant, m.OPEN_EXEC, {
                    "command": command, "tty": tty, "cols": cols or 80, "rows": rows or 24,
                    "term": process.term_type or ""})
            except (m.OpenFailed, ConnectionError) as e:
                process.stderr.write(f"gpucloud: {e}\r\n".encode())
                process.exit(255)
                return
            session.streams.append(stream)

            async def up() -> None:
                while True:
                    try:
                        data = await process.stdin.read(65536)
                    except asyncssh.TerminalSizeChanged as change:
                        await stream.resize(change.width, change.height)
                        continue
                    if not data:
                        break
                    await stream.write(data)
                await stream.write_eof()

            async def down() -> None:
                while (item := await stream.read_frame()) is not None:
                    kind_, data = item
                    out = process.stderr if kind_ == m.DATA_ERR else process.stdout
                    out.write(data)
                    await out.drain()

            uploader = asyncio.ensure_future(up())
            try:
                await down()
                await asyncio.wait_for(stream.exited.wait(), 2) if not stream.closed.is_set() else None
            except (TimeoutError, ConnectionError, asyncssh.Error):
                pass
            finally:
                uploader.cancel()
            if session.reason:
                return
            await self.finish_session(session)  # audited before the client learns the status
            process.exit(stream.exit_status if stream.exit_status is not None else 255)
            await stream.close()
        finally:
            await self.finish_session(session)

    async def forward(self, grant: access.Grant, port: int, source: str,
                      reader: asyncssh.SSHReader[bytes], writer: asyncssh.SSHWriter[bytes]) -> None:
        """One `-L` connection: a TCP stream to the container's `port`."""
        session = await self.start_session(grant, "forward", source)
        if session is None:
            writer.close()
            return
        session.end = lambda reason: writer.close()
        try:
            try:
                stream = await self.open_stream(grant, m.OPEN_TCP, {"port": port})
            except (m.OpenFailed, ConnectionError):
                writer.close()
                return
            session.streams.append(stream)

            async def up() -> None:
                while data := await reader.read(65536):
                    await stream.write(data)
                await stream.write_eof()

            uploader = asyncio.ensure_future(up())
            try:
                while data := await stream.read():
                    writer.write(data)
                    await writer.drain()
            except (ConnectionError, asyncssh.Error):
                pass
            finally:
                uploader.cancel()
                writer.close()
                await stream.close()
        finally:
            await self.finish_session(session)


class _Process(asyncssh.SSHServerProcess[bytes]):
    """A session whose `sftp` subsystem is ours to run, not asyncssh's own SFTP server.

    Given a `process_factory`, asyncssh accepts the sftp subsystem only with an
    `sftp_factory` (its SFTP server on the gateway's own disk): clients got "subsystem
    request failed". Here it reaches `Gateway._process` like any session, which runs the
    image's sftp-server (or says there is none).
    """

    def __init__(self, gateway: Gateway) -> None:
        super().__init__(gateway._process, None, 3, False)

    def subsystem_requested(self, subsystem: str) -> bool:
        return subsystem == "sftp"

    def session_started(self) -> None:
        assert self._chan is not None and self._conn is not None
        stdin = asyncssh.SSHReader[bytes](self, self._chan)
        stdout = asyncssh.SSHWriter[bytes](self, self._chan)
        stderr = asyncssh.SSHWriter[bytes](self, self._chan, asyncssh.constants.EXTENDED_DATA_STDERR)
        handler = self._start_process(stdin, stdout, stderr)
        if inspect.isawaitable(handler):
            self._conn.create_task(handler, stdin.logger)


class _SshServer(asyncssh.SSHServer):
    """Authentication: public keys only, checked against the control plane's rules."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.conn: asyncssh.SSHServerConnection | None = None
        self.grant: access.Grant | None = None

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self.conn = conn

    def begin_auth(self, username: str) -> bool:
        return True

    def password_auth_supported(self) -> bool:
        return False

    def public_key_auth_supported(self) -> bool:
        return True

    async def validate_public_key(self, username: str, key: asyncssh.SSHKey) -> bool:
        line = key.export_public_key("openssh").decode()
        grant = await _sync(access.authorize)(username=username, public_key=line)
        if grant is None:
            return False
        self.grant = grant
        assert self.conn is not None
        self.conn.set_extra_info(grant=grant)
        return True

    def connection_requested(self, dest_host: str, dest_port: int, orig_host: str, orig_port: int) -> Any:
        grant = self.grant
        if grant is None or not 0 < dest_port < 65536:
            return False
        source = f"{orig_host}:{orig_port}"

        async def handler(reader: asyncssh.SSHReader[bytes], writer: asyncssh.SSHWriter[bytes]) -> None:
            assert grant is not None
            await self.gateway.forward(grant, dest_port, source, reader, writer)

        return handler

    def session_requested(self) -> asyncssh.SSHServerSession[bytes]:
        return _Process(self.gateway)

    def server_requested(self, listen_host: str, listen_port: int) -> bool:
        return False  # no -R: nothing listens on the gateway for a tenant
