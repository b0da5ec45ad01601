"""The tunnel's framing: many streams over one WebSocket, each with credit flow control.

Both ends of an agent's tunnel use this module: the agent (agents/host/tunnel.py) and the
gateway (gateway/). It imports nothing but the standard library.

A frame is one binary WebSocket message::

    +-----------------+---------+------------------+
    | stream id (u32) | type u8 | payload ...      |
    +-----------------+---------+------------------+

Only the gateway opens streams (the agent answers them); stream 0 carries tunnel-wide
frames (WAKE). Types and their payloads:

    OPEN_EXEC   JSON {"instance", "command": str|null, "tty", "cols", "rows", "term"}
    OPEN_TCP    JSON {"instance", "port"}
    OPEN_OK     empty: the stream is up (the opener may send data)
    DATA        bytes (stdout for exec; both ways)
    DATA_ERR    bytes (stderr of an exec without a PTY)
    WINDOW      u32: the sender may send that many more bytes on the stream
    RESIZE      JSON {"cols", "rows"}
    EOF         empty: the sender will send no more data (half close)
    EXIT        JSON {"status": int}
    CLOSE       JSON {"reason": str}: the stream is gone on the sender's side
    WAKE        empty, stream 0: the host's desired state changed, heartbeat now

Flow control is per stream and direction, as in SSH and HTTP/2: each side starts with
INITIAL_WINDOW bytes of credit and may send DATA/DATA_ERR only within its credit; the
receiver returns credit (WINDOW) as its consumer reads, so a slow reader stops a fast
writer on that stream only, never the tunnel. A peer that overruns its credit breaks the
protocol: the stream is closed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final

logger = logging.getLogger(__name__)

OPEN_EXEC: Final = 1
OPEN_TCP: Final = 2
OPEN_OK: Final = 3
DATA: Final = 4
DATA_ERR: Final = 5
WINDOW: Final = 6
RESIZE: Final = 7
EOF: Final = 8
EXIT: Final = 9
CLOSE: Final = 10
WAKE: Final = 11

HEADER: Final = struct.Struct("!IB")
CREDIT: Final = struct.Struct("!I")
INITIAL_WINDOW: Final = 256 * 1024
MAX_CHUNK: Final = 32 * 1024

Send = Callable[[bytes], Awaitable[None]]


class OpenFailed(Exception):
    """The agent refused or could not open the stream (no such container, port closed...)."""


def encode(stream_id: int, kind: int, payload: bytes = b"") -> bytes:
    return HEADER.pack(stream_id, kind) + payload


def encode_json(stream_id: int, kind: int, obj: dict[str, Any]) -> bytes:
    return encode(stream_id, kind, json.dumps(obj, separators=(",", ":")).encode())


def decode(frame: bytes) -> tuple[int, int, bytes]:
    if len(frame) < HEADER.size:
        raise ValueError("short frame")
    stream_id, kind = HEADER.unpack_from(frame)
    return stream_id, kind, frame[HEADER.size :]


@dataclass
class Stream:
    """One side of one stream. Read with ``read()`` (b"" at EOF), write with ``write()``."""

    id: int
    mux: Mux
    kind: int = 0
    params: dict[str, Any] = field(default_factory=dict)
    # credit we may still send, and the event that wakes a writer waiting for more
    send_credit: int = INITIAL_WINDOW
    _credit: asyncio.Event = field(default_factory=asyncio.Event)
    _inbox: asyncio.Queue[tuple[int, bytes] | None] = field(default_factory=asyncio.Queue)
    _received: int = 0  # bytes consumed by our reader, not yet returned as credit
    _queued: int = 0  # bytes received and not yet read (bounded by our window)
    opened: asyncio.Future[None] | None = None
    exit_status: int | None = None
    exited: asyncio.Event = field(default_factory=asyncio.Event)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    close_reason: str = ""
    eof_sent: bool = False
    on_resize: Callable[[int, int], None] | None = None
    # RESIZE frames queued with the data, in order, for read_frame() to return as
    # (RESIZE, payload) (the gateway's relay passes them on); else given to on_resize
    inline_resize: bool = False
    bytes_in: int = 0
    bytes_out: int = 0

    async def read_frame(self) -> tuple[int, bytes] | None:
        """The next (DATA or DATA_ERR, bytes), or (RESIZE, JSON) with ``inline_resize``;
        None at EOF or close."""
        item = await self._inbox.get()
        if item is None:
            self._inbox.put_nowait(None)  # later reads see EOF too
            return None
        kind, data = item
        if kind == RESIZE:
            return kind, data  # an inline resize: no credit
        self._queued -= len(data)
        self._received += len(data)
        if self._received >= INITIAL_WINDOW // 2 and not self.closed.is_set():
            grant, self._received = self._received, 0
            await self.mux.send_frame(encode(self.id, WINDOW, CREDIT.pack(grant)))
        return kind, data

    async def read(self) -> bytes:
        """The next bytes of either data kind; b"" at EOF or close."""
        item = await self.read_frame()
        return b"" if item is None else item[1]

    async def write(self, data: bytes, kind: int = DATA) -> None:
        """Send ``data``, waiting for credit; raises ConnectionError once the stream is closed."""
        view = memoryview(data)
        while view:
            while self.send_credit <= 0:
                if self.closed.is_set():
                    raise ConnectionError(f"stream {self.id} closed")
                self._credit.clear()
                closed = asyncio.ensure_future(self.closed.wait())
                credit = asyncio.ensure_future(self._credit.wait())
                try:
                    await asyncio.wait({closed, credit}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    closed.cancel()
                    credit.cancel()
            if self.closed.is_set():
                raise ConnectionError(f"stream {self.id} closed")
            n = min(len(view), self.send_credit, MAX_CHUNK)
            self.send_credit -= n
            self.bytes_out += n
            await self.mux.send_frame(encode(self.id, kind, bytes(view[:n])))
            view = view[n:]

    async def write_eof(self) -> None:
        if not self.eof_sent and not self.closed.is_set():
            self.eof_sent = True
            await self.mux.send_frame(encode(self.id, EOF))

    async def resize(self, cols: int, rows: int) -> None:
        if not self.closed.is_set():
            await self.mux.send_frame(encode_json(self.id, RESIZE, {"cols": cols, "rows": rows}))

    async def send_exit(self, status: int) -> None:
        if not self.closed.is_set():
            await self.mux.send_frame(encode_json(self.id, EXIT, {"status": status}))

    async def close(self, reason: str = "") -> None:
        """Close our side and forget the stream (idempotent)."""
        if self.closed.is_set():
            return
        self._mark_closed(reason)
        try:
            await self.mux.send_frame(encode_json(self.id, CLOSE, {"reason": reason}))
        except ConnectionError:
            pass

    def _mark_closed(self, reason: str) -> None:
        if self.closed.is_set():
            return
        self.close_reason = self.close_reason or reason
        self.closed.set()
        self._credit.set()
        self._inbox.put_nowait(None)
        self.mux.streams.pop(self.id, None)
        if self.opened is not None and not self.opened.done():
            self.opened.set_exception(OpenFailed(reason or "closed"))

    def _deliver(self, kind: int, data: bytes) -> bool:
        """Queue received data; False when the peer overran its credit."""
        if self.closed.is_set():
            return True
        self._queued += len(data)
        self.bytes_in += len(data)
        if self._queued > INITIAL_WINDOW:
            return False
        self._inbox.put_nowait((kind, data))
        return True


OnOpen = Callable[[Stream], Awaitable[None]]


class Mux:
    """The streams of one tunnel. ``feed()`` every received frame; ``send`` sends one.

    ``on_open`` (the agent's side) is started as a task for each OPEN_* frame; it answers
    with ``accept()`` (OPEN_OK) or ``close(reason)``. ``on_wake`` is called for WAKE.
    """

    def __init__(
        self,
        send: Send,
        *,
        on_open: OnOpen | None = None,
        on_wake: Callable[[], None] | None = None,
    ) -> None:
        self._send = send
        self._send_lock = asyncio.Lock()
        self.on_open = on_open
        self.on_wake = on_wake
        self.streams: dict[int, Stream] = {}
        self._next_id = 1
        self._tasks: set[asyncio.Task[None]] = set()
        self.closed = False

    async def send_frame(self, frame: bytes) -> None:
        if self.closed:
            raise ConnectionError("tunnel closed")
        async with self._send_lock:
            await self._send(frame)

    async def open(self, kind: int, params: dict[str, Any], timeout: float = 10.0) -> Stream:
        """Open a stream (gateway side); raises OpenFailed when the agent refuses."""
        stream = Stream(id=self._next_id, mux=self, kind=kind, params=params)
        self._next_id += 1
        stream.opened = asyncio.get_running_loop().create_future()
        self.streams[stream.id] = stream
        await self.send_frame(encode_json(stream.id, kind, params))
        try:
            await asyncio.wait_for(asyncio.shield(stream.opened), timeout)
        except TimeoutError:
            await stream.close("open timed out")
            raise OpenFailed("the agent did not answer in time") from None
        return stream

    async def accept(self, stream: Stream) -> None:
        await self.send_frame(encode(stream.id, OPEN_OK))

    async def wake(self) -> None:
        await self.send_frame(encode(0, WAKE))

    async def feed(self, frame: bytes) -> None:
        """Handle one received frame. Never blocks on a stream's reader."""
        try:
            stream_id, kind, payload = decode(frame)
        except ValueError:
            logger.warning("tunnel: bad frame dropped")
            return
        if kind == WAKE:
            if self.on_wake is not None:
                self.on_wake()
            return
        if kind in (OPEN_EXEC, OPEN_TCP):
            if self.on_open is None or stream_id in self.streams:
                await self.send_frame(encode_json(stream_id, CLOSE, {"reason": "refused"}))
                return
            stream = Stream(id=stream_id, mux=self, kind=kind, params=json.loads(payload or b"{}"))
            self.streams[stream_id] = stream
            task = asyncio.ensure_future(self._run_open(stream))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return
        found = self.streams.get(stream_id)
        if found is None:
            return  # a frame that crossed our CLOSE
        stream = found
        if kind == OPEN_OK:
            if stream.opened is not None and not stream.opened.done():
                stream.opened.set_result(None)
        elif kind in (DATA, DATA_ERR):
            if not stream._deliver(kind, payload):
                logger.warning("tunnel: stream %s overran its credit", stream_id)
                await stream.close("flow control violated")
        elif kind == WINDOW:
            (grant,) = CREDIT.unpack(payload[: CREDIT.size])
            stream.send_credit += grant
            stream._credit.set()
        elif kind == RESIZE:
            if stream.inline_resize:
                if not stream.closed.is_set():
                    stream._inbox.put_nowait((RESIZE, payload))
            elif stream.on_resize is not None:
                size = json.loads(payload)
                stream.on_resize(int(size["cols"]), int(size["rows"]))
        elif kind == EOF:
            stream._inbox.put_nowait(None)
        elif kind == EXIT:
            stream.exit_status = int(json.loads(payload)["status"])
            stream.exited.set()
        elif kind == CLOSE:
            reason = str(json.loads(payload or b"{}").get("reason", ""))
            stream._mark_closed(reason)

    async def _run_open(self, stream: Stream) -> None:
        assert self.on_open is not None
        try:
            await self.on_open(stream)
        except Exception as e:  # one stream's failure never takes the tunnel down
            logger.exception("tunnel: stream %s failed", stream.id)
            await stream.close(f"agent error: {e}")
        else:
            await stream.close()

    def shutdown(self, reason: str = "tunnel closed") -> None:
        """The connection is gone: every stream is closed, every handler cancelled."""
        self.closed = True
        for stream in list(self.streams.values()):
            stream._mark_closed(reason)
        for task in list(self._tasks):
            task.cancel()
