"""The agent's tunnel: framing and flow control, the fake shell, a real WebSocket round trip.

No Django: `pytest -p no:django tests/agents/host`. Loopback only; every wait is bounded.
"""
from __future__ import annotations

import asyncio

import pytest
from websockets.asyncio.server import serve

from agents.host import mux as m
from agents.host.sim import SimRuntime
from agents.host.tunnel import AgentTunnel, FakeShell, SimConnector, _Demux
from agents.protocol import DesiredContainer
from tests.aio import run_in_own_loop


def run(coro):
    return run_in_own_loop(coro, 20)


def pair(on_open=None):
    """Two muxes wired back to back in memory: (gateway side, agent side)."""
    sides: dict[str, m.Mux] = {}

    async def to_agent(frame: bytes) -> None:
        await sides["agent"].feed(frame)

    async def to_gateway(frame: bytes) -> None:
        await sides["gateway"].feed(frame)

    sides["gateway"] = m.Mux(to_agent)
    sides["agent"] = m.Mux(to_gateway, on_open=on_open)
    return sides["gateway"], sides["agent"]


async def settle(n: int = 200) -> None:
    for _ in range(n):  # yields to the loop, no wall-clock sleeping
        await asyncio.sleep(0)


def test_a_slow_reader_stops_the_writer_at_its_window_and_credit_lets_it_go_on():
    async def main():
        opened: asyncio.Queue[m.Stream] = asyncio.Queue()

        async def on_open(stream):
            await stream.mux.accept(stream)
            await opened.put(stream)
            await stream.closed.wait()

        gateway, _agent = pair(on_open)
        client = await gateway.open(m.OPEN_TCP, {"instance": "i", "port": 80})
        server = await opened.get()
        total = 3 * m.INITIAL_WINDOW
        writer = asyncio.ensure_future(server.write(b"x" * total))
        await settle()
        assert not writer.done()
        assert server.send_credit == 0 and client._queued == m.INITIAL_WINDOW  # nothing beyond the window
        got = 0
        while got < total:
            got += len(await client.read())
        await asyncio.wait_for(writer, 5)
        assert got == total and client.bytes_in == total
        await client.close("done")
        await settle()
        assert server.closed.is_set() and server.close_reason == "done"
    run(main())


def test_a_peer_overrunning_its_credit_gets_the_stream_closed():
    async def main():
        gateway, _ = pair(None)
        stream = m.Stream(id=7, mux=gateway)
        gateway.streams[7] = stream
        await gateway.feed(m.encode(7, m.DATA, b"y" * (m.INITIAL_WINDOW + 1)))
        assert stream.closed.is_set() and stream.close_reason == "flow control violated"
    run(main())


def test_a_refused_open_raises_open_failed():
    async def main():
        async def on_open(stream):
            await stream.close("no such container")

        gateway, _ = pair(on_open)
        with pytest.raises(m.OpenFailed, match="no such container"):
            await gateway.open(m.OPEN_EXEC, {"instance": "nope"})
    run(main())


@pytest.mark.parametrize("line, out, status, exited", [
    ("echo hello-$((6*7)); exit 3", "hello-42\n", 0, 3),
    ("false; echo $?", "1\n", 0, None),
    ("echo $((2+3*(4-1)))", "11\n", 0, None),
    ("stty size", "24 80\n", 0, None),
    ("rm -rf /", "fakesh: rm: not found (a simulated instance has a fake shell)\n", 127, None),
])
def test_fake_shell(line, out, status, exited):
    shell = FakeShell("h")
    assert shell.run_line(line) == out
    assert shell.status == status and shell.exited == exited


def test_docker_stream_demux_splits_stdout_and_stderr_across_reads():
    d = _Demux()
    data = b"\x01\x00\x00\x00\x00\x00\x00\x03out" + b"\x02\x00\x00\x00\x00\x00\x00\x03err"
    assert d.feed(data[:5]) == []
    assert d.feed(data[5:]) == [(1, b"out"), (2, b"err")]


def _sim_with_container(iid: str) -> SimRuntime:
    rt = SimRuntime(seed=1)
    rt.run(DesiredContainer(instance_id=iid, tenant_id="t", kind="instance", image="img"))
    return rt


def test_exec_and_resize_over_a_real_websocket_then_reconnect_after_the_server_drops_it():
    async def main():
        tunnels: asyncio.Queue[tuple[m.Mux, object]] = asyncio.Queue()
        headers: list[str | None] = []

        async def handler(ws):
            headers.append(ws.request.headers.get("Authorization"))

            async def send(frame: bytes) -> None:
                await ws.send(frame)

            mux = m.Mux(send)
            await tunnels.put((mux, ws))
            try:
                async for msg in ws:
                    await mux.feed(msg)
            finally:
                mux.shutdown()

        async with serve(handler, "127.0.0.1", 0) as server:
            port = server.sockets[0].getsockname()[1]
            woken = asyncio.Event()
            loop = asyncio.get_running_loop()
            tunnel = AgentTunnel(f"ws://127.0.0.1:{port}/tunnel", token=lambda: "host-token",
                                 connector=SimConnector(_sim_with_container("inst-1")),
                                 on_wake=lambda: loop.call_soon_threadsafe(woken.set),
                                 backoff_base_s=0.01, backoff_cap_s=0.05)
            tunnel.start()
            try:
                mux, ws = await asyncio.wait_for(tunnels.get(), 10)
                assert headers == ["Bearer host-token"]
                s = await mux.open(m.OPEN_EXEC, {"instance": "inst-1", "command": "echo hello-$((6*7)); exit 3"})
                out = b""
                while chunk := await s.read():
                    out += chunk
                await asyncio.wait_for(s.exited.wait(), 5)
                assert out == b"hello-42\n" and s.exit_status == 3

                s = await mux.open(m.OPEN_EXEC, {"instance": "inst-1", "tty": True, "cols": 80, "rows": 24})
                await s.resize(132, 43)
                await s.write(b"stty size\r")
                out = b""
                while b"43 132" not in out:
                    out += await asyncio.wait_for(s.read(), 5)
                await s.write(b"exit 5\r")
                await asyncio.wait_for(s.exited.wait(), 5)
                assert s.exit_status == 5

                with pytest.raises(m.OpenFailed, match="no running container"):
                    await mux.open(m.OPEN_EXEC, {"instance": "other", "command": "true"})

                await mux.wake()
                await asyncio.wait_for(woken.wait(), 5)

                await ws.close()  # the gateway goes away: the agent dials again
                mux2, _ = await asyncio.wait_for(tunnels.get(), 10)
                s = await mux2.open(m.OPEN_TCP, {"instance": "inst-1", "port": 8888})
                await s.write(b"ping")
                assert await asyncio.wait_for(s.read(), 5) == b"ping"
                assert tunnel.connections == 2
            finally:
                await loop.run_in_executor(None, tunnel.stop)
    run(main())
