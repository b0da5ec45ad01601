"""The agent's end of the tunnel: one outbound WebSocket to a gateway, streams into containers.

The agent dials out (hosts behind NAT need no inbound port), authenticates with its host
token and keeps the connection up, reconnecting with capped, jittered backoff. The gateway
opens streams over it (agents/host/mux.py has the framing):

* exec: a process in the container, as ``docker exec`` does: the login shell, or
  ``/bin/sh -c <command>``, with or without a PTY; window resizes and the exit status pass
  through. The Docker connector uses the Engine API's exec (``exec_create``,
  ``exec_start(socket=True)``, ``exec_resize``, ``exec_inspect``), so any image with a
  ``/bin/sh`` works and no sshd is needed inside.
* tcp: a TCP connection from the agent to the container's address and port.

The simulated runtime has no processes: its connector is a built-in fake shell (echo,
``$((a*b))``, ``$?``, exit N, stty size, true, false, hostname) and an echo server for TCP,
so the whole path can be tried on a laptop without Docker.

A WAKE frame from the gateway makes the agent heartbeat at once (``on_wake``); the heartbeat
stays the source of truth.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import shlex
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any, Protocol

from agents.host.daemon import backoff
from agents.host.mux import DATA, DATA_ERR, OPEN_EXEC, OPEN_TCP, Mux, Stream
from agents.host.runtime import LABEL_INSTANCE, LABEL_MANAGED, Runtime, container_name

logger = logging.getLogger(__name__)

# Both shells in one: bash where the image has it, else sh (busybox, alpine).
LOGIN_SHELL = 'if [ -x /bin/bash ]; then exec /bin/bash -l; else exec /bin/sh -l; fi'


class Connector(Protocol):
    """Runs the two kinds of stream against one runtime's containers."""

    async def exec(self, stream: Stream) -> None: ...

    async def tcp(self, stream: Stream) -> None: ...


async def pump_to_stream(reader: asyncio.StreamReader, stream: Stream) -> None:
    while data := await reader.read(65536):
        await stream.write(data)
    await stream.write_eof()


async def pump_from_stream(stream: Stream, writer: asyncio.StreamWriter) -> None:
    while data := await stream.read():
        writer.write(data)
        await writer.drain()
    if writer.can_write_eof():
        writer.write_eof()


async def splice_tcp(stream: Stream, host: str, port: int) -> None:
    """Connect to host:port, accept the stream, copy both ways until both ends are done."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 10)
    except (OSError, TimeoutError) as e:
        await stream.close(f"connect to port {port} failed: {e}")
        return
    await stream.mux.accept(stream)
    try:
        up = asyncio.ensure_future(pump_from_stream(stream, writer))
        down = asyncio.ensure_future(pump_to_stream(reader, stream))
        closed = asyncio.ensure_future(stream.closed.wait())
        await asyncio.wait({down, closed}, return_when=asyncio.FIRST_COMPLETED)
        if not closed.done():  # the container closed: give the other way a moment to finish
            await asyncio.wait({up, closed}, timeout=5, return_when=asyncio.FIRST_COMPLETED)
        for t in (up, down, closed):
            t.cancel()
    except ConnectionError:
        pass
    finally:
        writer.close()


class DockerConnector:
    """Exec and TCP into gpucloud containers through the Docker Engine API."""

    def __init__(self, client: Any = None, scope: str = "") -> None:
        import importlib

        self._docker: Any = importlib.import_module("docker")
        self._client: Any = client if client is not None else self._docker.from_env()
        self._scope = scope

    def _container(self, instance_id: str) -> Any:
        try:
            c = self._client.containers.get(container_name(instance_id))
        except self._docker.errors.NotFound:
            return None
        labels = c.labels or {}
        if labels.get(LABEL_MANAGED) != "1" or labels.get(LABEL_INSTANCE) != instance_id:
            return None  # only gpucloud's own containers, named as ours
        if self._scope and labels.get("gpucloud.agent") != self._scope:
            return None
        return c if c.status == "running" else None

    async def exec(self, stream: Stream) -> None:
        loop = asyncio.get_running_loop()
        p = stream.params
        container = await loop.run_in_executor(None, self._container, str(p.get("instance", "")))
        if container is None:
            await stream.close("the instance has no running container on this host")
            return
        tty = bool(p.get("tty"))
        command = p.get("command")
        cmd = ["/bin/sh", "-c", command if command else LOGIN_SHELL]
        env = {"TERM": str(p.get("term") or "xterm")} if tty else {}
        api = self._client.api
        exec_id = (await loop.run_in_executor(
            None, lambda: api.exec_create(container.id, cmd, stdin=True, tty=tty, environment=env)
        ))["Id"]
        sock_io = await loop.run_in_executor(
            None, lambda: api.exec_start(exec_id, socket=True, tty=tty)
        )
        raw: socket.socket = getattr(sock_io, "_sock", sock_io)
        raw.setblocking(False)

        # Resizes are applied in order with the input: keystrokes that follow a window
        # change (`stty size`) reach the process only once the change is applied, and the
        # first size before anything is typed (fire-and-forget lost that race: 0 0).
        resizing: list[asyncio.Future[None]] = []

        def resize(cols: int, rows: int) -> None:
            resizing.append(loop.run_in_executor(
                None, lambda: _quiet(api.exec_resize, exec_id, height=rows, width=cols)))

        if tty:
            stream.on_resize = resize
            resize(int(p.get("cols") or 80), int(p.get("rows") or 24))
            await resizing.pop()
        await stream.mux.accept(stream)

        async def to_container() -> None:
            while data := await stream.read():
                while resizing:
                    await resizing.pop(0)
                await loop.sock_sendall(raw, data)
            try:
                raw.shutdown(socket.SHUT_WR)  # stdin EOF for `ssh host cmd < file`
            except OSError:
                pass

        async def from_container() -> None:
            demux = _Demux()
            while data := await loop.sock_recv(raw, 65536):
                if tty:
                    await stream.write(data)
                    continue
                for kind, chunk in demux.feed(data):
                    await stream.write(chunk, DATA_ERR if kind == 2 else DATA)

        up = asyncio.ensure_future(to_container())
        try:
            down = asyncio.ensure_future(from_container())
            closed = asyncio.ensure_future(stream.closed.wait())
            await asyncio.wait({down, closed}, return_when=asyncio.FIRST_COMPLETED)
            closed.cancel()
            if stream.closed.is_set():
                return  # the session ended (client gone, or the gateway cut it)
            await down  # surface errors
            status = await loop.run_in_executor(None, self._exit_code, exec_id)
            await stream.write_eof()
            await stream.send_exit(status)
        except ConnectionError:
            pass
        finally:
            up.cancel()
            raw.close()
            sock_io.close()

    def _exit_code(self, exec_id: str) -> int:
        """The exec's exit code; the process may outlive its output by a moment."""
        info: dict[str, Any] = {}
        done = threading.Event()
        for _ in range(100):
            info = self._client.api.exec_inspect(exec_id)
            if not info.get("Running"):
                break
            done.wait(0.05)
        code = info.get("ExitCode")
        return int(code) if code is not None else 255

    async def tcp(self, stream: Stream) -> None:
        loop = asyncio.get_running_loop()
        container = await loop.run_in_executor(None, self._container, str(stream.params.get("instance", "")))
        if container is None:
            await stream.close("the instance has no running container on this host")
            return
        networks = (container.attrs.get("NetworkSettings") or {}).get("Networks") or {}
        ips = [n.get("IPAddress") for n in networks.values() if n.get("IPAddress")]
        if not ips:
            await stream.close("the container has no network address")
            return
        await splice_tcp(stream, ips[0], int(stream.params.get("port", 0)))


def _quiet(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    try:
        fn(*args, **kwargs)
    except Exception:  # a resize racing the exec's end
        logger.debug("exec resize failed", exc_info=True)


class _Demux:
    """Docker's stdout/stderr multiplexing of a non-TTY attach: 8-byte headers."""

    HEADER = struct.Struct(">BxxxL")

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        self._buf += data
        out: list[tuple[int, bytes]] = []
        while len(self._buf) >= 8:
            kind, size = self.HEADER.unpack_from(self._buf)
            if len(self._buf) < 8 + size:
                break
            out.append((kind, self._buf[8 : 8 + size]))
            self._buf = self._buf[8 + size :]
        return out


# ------------------------------------------------------------------ the simulated runtime


_HTTP_REQUEST = re.compile(rb"^(GET|HEAD|POST|PUT|PATCH|DELETE|OPTIONS) \S+ HTTP/1\.[01]\r\n")
_ARITH = re.compile(r"\$\(\(([-+*/%() 0-9]+)\)\)")


class FakeShell:
    """A few shell commands, enough to try connecting to a simulated instance."""

    def __init__(self, hostname: str) -> None:
        self.hostname = hostname
        self.status = 0
        self.cols, self.rows = 80, 24
        self.exited: int | None = None

    def _expand(self, word: str) -> str:
        word = word.replace("$?", str(self.status))
        return _ARITH.sub(lambda m: str(_arith(m.group(1))), word)

    def run_line(self, line: str) -> str:
        """Run one line (commands split on ';'); the output. Sets ``exited`` on exit."""
        out = []
        for part in line.split(";"):
            try:
                words = shlex.split(part)
            except ValueError:
                out.append("fakesh: syntax error\n")
                self.status = 2
                continue
            if not words:
                continue
            name, args = words[0], [self._expand(w) for w in words[1:]]
            if name == "exit":
                self.exited = int(args[0]) if args and args[0].lstrip("-").isdigit() else self.status
                break
            if name == "echo":
                out.append(" ".join(args) + "\n")
                self.status = 0
            elif name == "stty" and args == ["size"]:
                out.append(f"{self.rows} {self.cols}\n")
                self.status = 0
            elif name == "hostname":
                out.append(self.hostname + "\n")
                self.status = 0
            elif name in ("true", ":"):
                self.status = 0
            elif name == "false":
                self.status = 1
            else:
                out.append(f"fakesh: {name}: not found (a simulated instance has a fake shell)\n")
                self.status = 127
        return "".join(out)


def _arith(expr: str) -> int:
    """Integer arithmetic of + - * / % and parentheses, without eval."""
    tokens = re.findall(r"\d+|[-+*/%()]", expr)
    pos = 0

    def atom() -> int:
        nonlocal pos
        tok = tokens[pos]
        pos += 1
        if tok == "(":
            v = add()
            pos += 1
            return v
        if tok == "-":
            return -atom()
        return int(tok)

    def mul() -> int:
        nonlocal pos
        v = atom()
        while pos < len(tokens) and tokens[pos] in "*/%":
            op = tokens[pos]
            pos += 1
            r = atom()
            v = v * r if op == "*" else (int(v / r) if op == "/" else v % r)
        return v

    def add() -> int:
        nonlocal pos
        v = mul()
        while pos < len(tokens) and tokens[pos] in "+-":
            op = tokens[pos]
            pos += 1
            r = mul()
            v = v + r if op == "+" else v - r
        return v

    try:
        return add()
    except (IndexError, ValueError, ZeroDivisionError):
        return 0


class SimConnector:
    """The fake shell for exec streams and an echo server for TCP streams.

    ``forward`` points container ports at real servers (port → (host, port)), so what a
    simulated instance "serves" on a port can be any local server (a test's, the demo's).
    """

    def __init__(self, runtime: Runtime, forward: dict[int, tuple[str, int]] | None = None) -> None:
        self._runtime = runtime
        self._forward = dict(forward or {})

    def _running(self, instance_id: str) -> bool:
        for _ in range(3):
            try:
                return any(c.instance_id == instance_id and c.state == "running" for c in self._runtime.list())
            except RuntimeError:  # the agent's thread changed the dict mid-iteration
                continue
        return False

    async def exec(self, stream: Stream) -> None:
        p = stream.params
        instance_id = str(p.get("instance", ""))
        if not await asyncio.get_running_loop().run_in_executor(None, self._running, instance_id):
            await stream.close("the instance has no running container on this host")
            return
        shell = FakeShell(hostname=instance_id[:12])
        shell.cols, shell.rows = int(p.get("cols") or 80), int(p.get("rows") or 24)

        def resize(cols: int, rows: int) -> None:
            shell.cols, shell.rows = cols, rows

        stream.on_resize = resize
        await stream.mux.accept(stream)
        if p.get("command"):
            await stream.write(shell.run_line(str(p["command"])).encode())
            await stream.write_eof()
            await stream.send_exit(shell.exited if shell.exited is not None else shell.status)
            return
        tty = bool(p.get("tty"))
        newline = "\r\n" if tty else "\n"
        prompt = "$ " if tty else ""
        await stream.write(prompt.encode())
        line = ""
        while shell.exited is None:
            data = await stream.read()
            if not data:
                break
            for ch in data.decode(errors="replace"):
                if ch in "\r\n":
                    if tty:
                        await stream.write(b"\r\n")
                    out = shell.run_line(line).replace("\n", newline)
                    line = ""
                    await stream.write(out.encode())
                    if shell.exited is not None:
                        break
                    await stream.write(prompt.encode())
                elif ch in "\x7f\b":
                    if line:
                        line = line[:-1]
                        if tty:
                            await stream.write(b"\b \b")
                elif ch == "\x04" and not line:  # ^D on an empty line
                    shell.exited = shell.status
                    break
                else:
                    line += ch
                    if tty:
                        await stream.write(ch.encode())
        await stream.write_eof()
        await stream.send_exit(shell.exited if shell.exited is not None else shell.status)

    async def tcp(self, stream: Stream) -> None:
        if not await asyncio.get_running_loop().run_in_executor(
            None, self._running, str(stream.params.get("instance", ""))
        ):
            await stream.close("the instance has no running container on this host")
            return
        port = int(stream.params.get("port", 0))
        target = self._forward.get(port)
        if target is not None:
            await splice_tcp(stream, *target)
            return
        await stream.mux.accept(stream)
        first = True
        while data := await stream.read():
            if first and _HTTP_REQUEST.match(data):  # the gateway's HTTP proxy: a page, not an echo
                body = (f"<!doctype html><title>simulated instance</title><p>Port {port} of a simulated "
                        f"instance, reached through the gateway. On a Docker host the container's own "
                        f"server answers here.</p>\n").encode()
                await stream.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\n"
                                   b"Connection: close\r\nContent-Length: " + str(len(body)).encode()
                                   + b"\r\n\r\n" + body)
                break
            first = False
            await stream.write(data)
        await stream.write_eof()


# ------------------------------------------------------------------ the connection


class AgentTunnel:
    """Keeps one WebSocket to ``url`` open in a thread of its own; serves streams over it.

    ``token`` returns the current host token (None before registration: no dial). Given
    several URLs (gateway replicas), it moves to the next one whenever a connection fails or
    drops, so a dead replica costs one failed dial, not a backoff series.
    """

    def __init__(
        self,
        url: str | list[str],
        *,
        token: Callable[[], str | None],
        connector: Connector,
        on_wake: Callable[[], None] | None = None,
        backoff_base_s: float = 0.5,
        backoff_cap_s: float = 10.0,
        rng: random.Random | None = None,
    ) -> None:
        self.urls = [url] if isinstance(url, str) else list(url)
        self._url_index = 0
        self._token = token
        self._connector = connector
        self._on_wake = on_wake
        self._base, self._cap = backoff_base_s, backoff_cap_s
        self._rng = rng or random.Random()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self.connected = threading.Event()
        self.connections = 0  # how many times it connected (reconnects visible in tests)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._main, name="agent-tunnel", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            loop.call_soon_threadsafe(stop.set)
        if self._thread is not None:
            self._thread.join(timeout)

    def _main(self) -> None:
        asyncio.run(self.run())

    async def run(self) -> None:
        """Connect, serve, reconnect with capped backoff, until stop()."""
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        attempt = 0
        while not self._stop.is_set():
            token = self._token()
            served = False
            if token:
                try:
                    served = await self._serve(token)
                except Exception as e:  # refused, unreachable, dropped: all retried
                    logger.warning("tunnel to %s failed: %s", self.url, e)
            self.connected.clear()
            attempt = 0 if served else attempt + 1
            if token:
                self._url_index = (self._url_index + 1) % len(self.urls)
            # A fresh replica is tried at once; the backoff grows once every one has failed.
            delay = backoff(attempt // len(self.urls), self._base, self._cap, self._rng)
            try:
                await asyncio.wait_for(self._stop.wait(), delay)
            except TimeoutError:
                pass

    @property
    def url(self) -> str:
        return self.urls[self._url_index]

    async def _serve(self, token: str) -> bool:
        from websockets.asyncio.client import connect

        assert self._stop is not None
        async with connect(
            self.url,
            additional_headers={"Authorization": f"Bearer {token}"},
            open_timeout=10,
            ping_interval=10,
            ping_timeout=20,
            max_size=2**20,
        ) as ws:

            async def send(frame: bytes) -> None:
                await ws.send(frame)

            mux = Mux(send, on_open=self._open, on_wake=self._on_wake)
            self.connections += 1
            self.connected.set()
            logger.info("tunnel connected to %s", self.url)
            stop = asyncio.ensure_future(self._stop.wait())
            try:
                reader = asyncio.ensure_future(self._read(ws, mux))
                await asyncio.wait({reader, stop}, return_when=asyncio.FIRST_COMPLETED)
                reader.cancel()
            finally:
                stop.cancel()
                mux.shutdown()
        return True

    @staticmethod
    async def _read(ws: Any, mux: Mux) -> None:
        async for message in ws:
            if isinstance(message, bytes):
                await mux.feed(message)

    async def _open(self, stream: Stream) -> None:
        if stream.kind == OPEN_EXEC:
            await self._connector.exec(stream)
        elif stream.kind == OPEN_TCP:
            await self._connector.tcp(stream)
        else:
            await stream.close("unknown stream kind")
