"""A changed heartbeat's GPU samples go to the fast path's buffer in the round trip that
remembers its answer: each stored once after the flush, and written by the heartbeat itself
where Redis refuses them, as before."""
from __future__ import annotations

from agents import fastpath
from agents.models import GpuSample, Host
from scheduler.choices import State
from tests.agents.test_agent_api import beat_body, place, post, region, registered, state, triggered  # noqa: F401
from tests.agents.test_fastpath import HB, beat, running, sample


def test_a_changed_heartbeats_samples_are_stored_once_after_the_flush(client, registered, alice):
    host_id, token = registered
    w = place(Host.objects.get(), alice.tenant)
    desired = beat(client, host_id, token, 1)["desired"]
    beat(client, host_id, token, 2, containers=running(desired[0]), gpus=[sample(0, 11.0), sample(1, 12.0)])
    assert state(w) == State.RUNNING
    assert GpuSample.objects.count() == 0  # buffered
    out = fastpath.heartbeats_flush()
    assert (out.heartbeats, out.samples) == (2, 4)
    assert sorted(GpuSample.objects.filter(gpu_util__in=(11.0, 12.0)).values_list("gpu_util", flat=True)) == [
        11.0, 12.0]
    assert fastpath.heartbeats_flush().heartbeats == 0


def test_samples_redis_refuses_are_written_by_the_changed_heartbeat(client, registered, alice):
    host_id, token = registered
    w = place(Host.objects.get(), alice.tenant)
    desired = beat(client, host_id, token, 1)["desired"]
    fastpath.heartbeats_flush()
    r, key = fastpath._redis(), f"{fastpath._prefix()}buf"
    r.set(key, "not a list")  # every push to the buffer is refused (WRONGTYPE)
    try:
        resp = post(client, HB, beat_body(host_id, 2, containers=running(desired[0]),
                                          gpus=[sample(0, 21.0), sample(1, 22.0)]), token=token)
        assert resp.status_code == 200, resp.content
        assert state(w) == State.RUNNING
        # written at once, by the heartbeat
        assert sorted(GpuSample.objects.filter(gpu_util__in=(21.0, 22.0)).values_list("gpu_util", flat=True)) == [
            21.0, 22.0]
    finally:
        r.delete(key)
    assert fastpath.heartbeats_flush().samples == 0  # and not again
