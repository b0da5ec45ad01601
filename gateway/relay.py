"""Relaying between gateway replicas (docs/connect.md, "Replicas").

A user's session may land on a replica that does not hold the host's tunnel (behind a load
balancer, agents and users reach replicas independently). That replica (B) opens the stream
on the replica that does (A), over an internal connection, and uses it as it would a tunnel
stream of its own:

    user ──ssh / http──▶ replica B ──relay connection (TCP, GATEWAY_RELAY_PORT)──▶ replica A ──tunnel──▶ agent

- **Finding A**: the routing table names the replica holding the host (`gateway:route:<host>`);
  each replica advertises where its relay port is reached (`gateway:replica:<name>` →
  `host:port`, with the same expiry, refreshed while it runs).
- **One connection per stream**, so a relay's life is its stream's: closing either ends both,
  a replica that goes away ends the streams it carried (the other side sees the connection go).
- **Authentication, both ways, before anything else**: A sends `MAGIC + nonce_a`; B answers
  `MAGIC + nonce_b + HMAC(secret, MAGIC "client" nonce_a nonce_b)`; A checks it (constant-time)
  and answers `HMAC(secret, MAGIC "server" nonce_a nonce_b)`, which B checks. A peer without the
  secret gets the connection closed and nothing else; a recorded handshake is no good again
  (fresh nonces). The secret is `GATEWAY_RELAY_SECRET`, or else derived from `SECRET_KEY`
  (which replicas share already: sessions, terminal tickets). Nothing the user sends takes part.
- **Frames**: the tunnel's own (agents/host/mux.py), each behind a u32 length: B's side is a
  `Mux` that opens one stream, A's a `Mux` answering it. Flow control is the tunnel's credit
  windows on each hop (A holds at most one window per direction per stream); resizes travel in
  order with the keystrokes (`inline_resize`).
- **What B may ask**: an exec or TCP stream to `instance` on `host`, both taken from the grant
  B's own authorisation produced (never from what the user typed), and A serves only a host
  whose tunnel it holds itself. The session (its limit, audit, re-checks, ending) stays on B,
  where the user is.

The relay is plain TCP, like the tunnel's `ws://`: keep the port on the replicas' private
network (its contents are not encrypted; the handshake keeps strangers out, not eavesdroppers).
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import os
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Any

from agents.host import mux as m

logger = logging.getLogger(__name__)

MAGIC = b"gpucloud-relay/1"
NONCE = 32
MAC = 32  # SHA-256
LENGTH = struct.Struct("!I")
MAX_FRAME = 2**20 + m.HEADER.size  # as the tunnel's WebSocket (max_size)
HANDSHAKE_TIMEOUT_S = 5.0

OpenLocal = Callable[[str, int, dict[str, Any]], Awaitable[m.Stream]]


def derive_secret(configured: str, secret_key: str) -> bytes:
    """The relay's shared secret: `GATEWAY_RELAY_SECRET`, or one derived from `SECRET_KEY`."""
    if configured:
        return configured.encode()
    return hmac.new(secret_key.encode(), b"gpucloud gateway relay", hashlib.sha256).digest()


def _proof(secret: bytes, role: bytes, nonce_a: bytes, nonce_b: bytes) -> bytes:
    return hmac.new(secret, MAGIC + role + nonce_a + nonce_b, hashlib.sha256).digest()


def advertised_host(bind: str, configured: str = "") -> str:
    """Where other replicas reach this one: `GATEWAY_RELAY_HOST`, else the bind address, else
    (bound to every address) this machine's own address as its name resolves."""
    if configured:
        return configured
    if bind not in ("", "0.0.0.0", "::"):
        return bind
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def _keepalive(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        except OSError:
            pass


def _sender(writer: asyncio.StreamWriter) -> m.Send:
    async def send(frame: bytes) -> None:
        if writer.is_closing():
            raise ConnectionError("relay connection closed")
        writer.write(LENGTH.pack(len(frame)) + frame)
        await writer.drain()
    return send


async def _pump(reader: asyncio.StreamReader, mux: m.Mux, reason: str) -> None:
    """Feed the connection's frames to `mux` until it ends; then every stream on it is closed."""
    try:
        while True:
            (size,) = LENGTH.unpack(await reader.readexactly(LENGTH.size))
            if size > MAX_FRAME:
                logger.warning("relay: a frame of %s bytes: connection dropped", size)
                return
            await mux.feed(await reader.readexactly(size))
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    except Exception:  # a malformed frame from an authenticated peer: this connection only
        logger.exception("relay: bad frame; connection dropped")
    finally:
        mux.shutdown(reason)


# ---------------------------------------------------------------------- A: the replica holding the tunnel

class RelayServer:
    """Answers other replicas' relay connections: `open_local(host, kind, params)` opens the
    stream on a tunnel this replica holds (or raises OpenFailed)."""

    def __init__(self, secret: bytes, open_local: OpenLocal) -> None:
        self.secret = secret
        self.open_local = open_local
        self.refused = 0  # connections that failed the handshake
        self.relayed = 0  # streams opened for another replica
        self.connections: set[asyncio.Task[Any]] = set()

    def shutdown(self) -> None:
        for task in list(self.connections):
            task.cancel()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self.connections.add(task)
        peer = writer.get_extra_info("peername") or ("?", 0)
        _keepalive(writer)
        try:
            nonce_a = os.urandom(NONCE)
            writer.write(MAGIC + nonce_a)
            hello = await asyncio.wait_for(reader.readexactly(len(MAGIC) + NONCE + MAC), HANDSHAKE_TIMEOUT_S)
            nonce_b, proof = hello[len(MAGIC):len(MAGIC) + NONCE], hello[len(MAGIC) + NONCE:]
            if hello[:len(MAGIC)] != MAGIC or not hmac.compare_digest(
                    proof, _proof(self.secret, b"client", nonce_a, nonce_b)):
                self.refused += 1
                logger.warning("relay: refused %s:%s (it does not know the relay secret)", peer[0], peer[1])
                return
            writer.write(_proof(self.secret, b"server", nonce_a, nonce_b))
            mux = m.Mux(_sender(writer), on_open=self._open)
            await _pump(reader, mux, "the relaying replica went away")
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError):
            self.refused += 1
        finally:
            self.connections.discard(task)  # type: ignore[arg-type]
            writer.close()

    async def _open(self, rs: m.Stream) -> None:
        params = dict(rs.params)
        host = str(params.pop("host", ""))
        rs.inline_resize = True  # before OPEN_OK: resizes then come in order with the data
        try:
            ts = await self.open_local(host, rs.kind, params)
        except (m.OpenFailed, ConnectionError) as e:
            await rs.close(str(e))
            return
        self.relayed += 1
        try:
            await rs.mux.accept(rs)
            await splice(rs, ts)
        except ConnectionError:
            pass
        finally:
            await ts.close(rs.close_reason or "the relaying replica closed the stream")
            await rs.close(ts.close_reason)


async def splice(rs: m.Stream, ts: m.Stream) -> None:
    """Copy one stream both ways between the relay (`rs`) and the tunnel (`ts`): data, resizes,
    half closes, the exit status; done when the tunnel's stream closes or the relay's does."""

    async def up() -> None:  # the user's side → the agent
        while (item := await rs.read_frame()) is not None:
            kind, data = item
            if kind == m.RESIZE:
                size = json.loads(data)
                await ts.resize(int(size["cols"]), int(size["rows"]))
            else:
                await ts.write(data)
        if not rs.closed.is_set():
            await ts.write_eof()

    async def down() -> None:  # the agent → the user's side
        while (item := await ts.read_frame()) is not None:
            await rs.write(item[1], item[0])
        await rs.write_eof()
        await _first(ts.exited.wait(), ts.closed.wait())
        if ts.exit_status is not None:
            await rs.send_exit(ts.exit_status)
        await ts.closed.wait()

    up_task = asyncio.ensure_future(up())
    up_task.add_done_callback(_retrieve)  # a stream closed under a writer: nothing to report
    down_task = asyncio.ensure_future(down())
    gone = asyncio.ensure_future(rs.closed.wait())
    try:
        await asyncio.wait({down_task, gone}, return_when=asyncio.FIRST_COMPLETED)
        if down_task.done() and not down_task.cancelled() and down_task.exception() is not None:
            exc = down_task.exception()
            if not isinstance(exc, ConnectionError):
                raise exc  # type: ignore[misc]
    finally:
        for t in (up_task, down_task, gone):
            t.cancel()


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


async def _first(*aws: Awaitable[Any]) -> None:
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()


# ---------------------------------------------------------------------- B: the replica the user reached

_lingering: set[asyncio.Task[None]] = set()


async def open_remote(address: str, secret: bytes, kind: int, params: dict[str, Any], *,
                      timeout: float = 10.0) -> m.Stream:
    """Open a stream through the replica at `address` (`host:port`): `params` carry `host`
    (whose tunnel) and `instance`, as a tunnel's OPEN does. Raises OpenFailed."""
    host, _, port = address.rpartition(":")
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host.strip("[]"), int(port)),
                                                HANDSHAKE_TIMEOUT_S)
    except (OSError, ValueError, TimeoutError) as e:
        raise m.OpenFailed(f"the gateway replica holding the tunnel did not answer ({e})") from None
    _keepalive(writer)
    try:
        hello = await asyncio.wait_for(reader.readexactly(len(MAGIC) + NONCE), HANDSHAKE_TIMEOUT_S)
        if hello[:len(MAGIC)] != MAGIC:
            raise ConnectionError("not a gateway relay")
        nonce_a, nonce_b = hello[len(MAGIC):], os.urandom(NONCE)
        writer.write(MAGIC + nonce_b + _proof(secret, b"client", nonce_a, nonce_b))
        proof = await asyncio.wait_for(reader.readexactly(MAC), HANDSHAKE_TIMEOUT_S)
        if not hmac.compare_digest(proof, _proof(secret, b"server", nonce_a, nonce_b)):
            raise ConnectionError("it does not know the relay secret")
    except (asyncio.IncompleteReadError, ConnectionError, TimeoutError) as e:
        writer.close()
        logger.warning("relay to %s refused: %s", address, e or type(e).__name__)
        raise m.OpenFailed("the gateway replica holding the tunnel refused the relay (is GATEWAY_RELAY_SECRET "
                           "the same on every replica?)") from None
    mux = m.Mux(_sender(writer))
    pump = asyncio.ensure_future(_pump(reader, mux, "the gateway replica holding the tunnel went away"))
    try:
        stream = await mux.open(kind, params, timeout)
    except BaseException:
        pump.cancel()
        writer.close()
        raise

    async def linger() -> None:  # the connection lives as long as its stream
        try:
            await stream.closed.wait()
        finally:
            pump.cancel()
            writer.close()

    task = asyncio.ensure_future(linger())
    _lingering.add(task)
    task.add_done_callback(_lingering.discard)
    return stream
