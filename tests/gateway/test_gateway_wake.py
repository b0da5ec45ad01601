"""Wake-ups: a change of a host's desired state reaches its agent through the gateway at once.

The control plane publishes on `gateway:wake:<host>` after commit (agents.fastpath.
hosts_changed, called by every workload transition that moves GPUs); the gateway replica
holding the host's tunnel forwards a WAKE frame; the agent heartbeats now. The heartbeat
interval here is an hour, so anything that happens within the bounded waits below
happened because of a wake-up. Real PostgreSQL, Redis, gateway, agent loop; loopback only.
"""
from __future__ import annotations

import threading
import time

import pytest
import redis
from django.conf import settings as django_settings

from agents.host.tunnel import AgentTunnel, SimConnector
from gateway.routes import wake_channel
from scheduler.choices import State
from tests.agents.test_agent_api import make_sim_host, place, region, state, triggered  # noqa: F401
from tests.gateway.test_gateway_ssh import GatewayThread

pytestmark = pytest.mark.django_db(transaction=True)


def wait_until(predicate, what: str, timeout: float = 10.0) -> None:
    tick = threading.Event()
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        tick.wait(0.05)


def test_a_placement_and_a_stop_reach_a_tunnelled_agent_without_waiting_for_its_heartbeat(
        make_sim_host, alice, settings, tmp_path):
    settings.AGENT_HEARTBEAT_INTERVAL_S = 3600
    sim = make_sim_host()
    sim.beat()
    host_id = str(sim.host.pk)
    gw = GatewayThread(tmp_path, redis_url=django_settings.REDIS_URL)
    tunnel = AgentTunnel(f"ws://127.0.0.1:{gw.gw.tunnel_port}/tunnel", token=lambda: sim.agent.state.host_token,
                         connector=SimConnector(sim.runtime), on_wake=sim.agent.wake,
                         backoff_base_s=0.05, backoff_cap_s=0.2)
    tunnel.start()
    r = redis.Redis.from_url(django_settings.REDIS_URL)
    loop = threading.Thread(target=sim.agent.run, daemon=True)
    try:
        # The gateway listens for this host's wake-ups once its tunnel is up.
        wait_until(lambda: dict(r.pubsub_numsub(wake_channel(host_id))).get(wake_channel(host_id).encode()),
                   "the gateway's subscription")
        seq = sim.agent.seq
        loop.start()
        wait_until(lambda: sim.agent.seq > seq, "the agent's first heartbeat of its loop")
        assert sim.agent.interval_s == 3600  # from here on it sleeps an hour unless woken

        w = place(sim.host, alice.tenant)  # SCHEDULED: the host's desired set changed
        running = lambda: {c.instance_id.split(".")[0] for c in sim.runtime.list() if c.state == "running"}  # noqa: E731
        wait_until(lambda: str(w.pk) in running(), "the woken agent to start the container")
        assert gw.gw.wakes_sent >= 1
        # having started it, the agent reports it at once, not at its next interval
        wait_until(lambda: state(w) == State.RUNNING, "the agent to report the container running")

        r = alice.client().post(f"/api/v1/instances/{w.pk}/stop")  # not desired any more
        assert r.status_code == 200
        wait_until(lambda: str(w.pk) not in running(), "the woken agent to stop the container")
    finally:
        sim.agent.request_stop()
        if loop.ident is not None:
            loop.join(10)
        tunnel.stop()
        gw.stop()
        r.close()
