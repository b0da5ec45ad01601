"""The heartbeat fast path (agents/fastpath.py) against real PostgreSQL, Redis and Celery.

An unchanged heartbeat is answered from Redis with no SQL; its samples and liveness
reach the database when `heartbeats_flush` runs (the beat task, the liveness check).
Every change that could alter an answer makes the next heartbeat take the slow path.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone
from rest_framework.throttling import SimpleRateThrottle

from agents import fastpath
from agents.api.views import AgentThrottle
from agents.choices import HostState
from agents.models import Gpu, GpuSample, Host
from agents.protocol import SEQ_REORDER_WINDOW
from agents.services.heartbeat import seq_is_fresh
from agents.services.host_ops import gpu_mark_healthy
from agents.services.liveness import hosts_mark_down
from agents.services.logs import workload_logs_request
from agents.tasks import heartbeats_flush_task
from gpucloud.celery import app
from scheduler.choices import State
from scheduler.services import workload_stop
from tests.agents.test_agent_api import (  # noqa: F401 (fixtures)
    assert_error,
    beat_body,
    new_token,
    place,
    post,
    region,
    register_body,
    registered,
    state,
    triggered,
)
from volumes.models import Volume, VolumeEvent
from volumes.services import volume_resize

HB = "/agent/v1/heartbeat"


def sample(i: int, util: float = 50.0, **extra) -> dict:
    return {"uuid": f"GPU-h1-{i}", "gpu_util": util, "mem_used_mib": 1000 + i, **extra}


def beat(client, host_id, token, seq, containers=(), gpus=None):
    gpus = [sample(0), sample(1)] if gpus is None else gpus
    resp = post(client, HB, beat_body(host_id, seq, containers=containers, gpus=gpus), token=token)
    assert resp.status_code == 200, resp.content
    return resp.json()


def running(desired: dict) -> list[dict]:
    return [{"instance_id": desired["instance_id"], "container_id": "c1", "state": "running"}]


def started(client, host_id, token, tenant):
    """Work placed on the host and reported running (heartbeats 1 and 2): (workload, desired, report)."""
    w = place(Host.objects.get(), tenant)
    desired = beat(client, host_id, token, 1)["desired"]
    report = running(desired[0])
    beat(client, host_id, token, 2, containers=report)
    return w, desired, report


def test_the_fast_path_is_on_with_redis_and_postgresql():
    assert fastpath.enabled()


def test_an_unchanged_heartbeat_is_answered_without_sql(
    client, registered, django_assert_num_queries
):
    host_id, token = registered
    first = beat(client, host_id, token, 1)
    with django_assert_num_queries(0):
        again = beat(client, host_id, token, 2, gpus=[sample(0, 3.0), sample(1, 80.0)])
    assert again == first
    host = Host.objects.get()
    # buffered, not yet written: the first (slow) heartbeat's samples too, its health unchanged
    assert host.last_seq == 1 and GpuSample.objects.count() == 0
    out = fastpath.heartbeats_flush()
    assert (out.heartbeats, out.samples, out.hosts, out.gpus) == (2, 4, 1, 2)
    host.refresh_from_db()
    g0, g1 = Gpu.objects.order_by("index")
    assert host.last_seq == 2 and GpuSample.objects.count() == 4
    assert (g0.utilisation, g1.utilisation) == (0.03, 0.8)
    assert g0.idle_since is not None and g1.idle_since is None
    assert fastpath.heartbeats_flush().heartbeats == 0  # nothing twice


def test_idleness_from_buffered_samples_is_idle_since_the_first_idle_one(client, registered):
    host_id, token = registered
    beat(client, host_id, token, 1, gpus=[sample(0, 90.0), sample(1, 90.0)])
    for seq in (2, 3):
        beat(client, host_id, token, seq, gpus=[sample(0, 1.0), sample(1, 90.0)])
    fastpath.heartbeats_flush()
    g0 = Gpu.objects.get(index=0)
    first_idle = GpuSample.objects.filter(gpu=g0, gpu_util=1.0).order_by("time").first().time
    assert g0.idle_since == first_idle
    beat(client, host_id, token, 4, gpus=[sample(0, 2.0), sample(1, 90.0)])
    fastpath.heartbeats_flush()
    g0.refresh_from_db()
    assert g0.idle_since == first_idle  # still idle: since the first idle sample
    beat(client, host_id, token, 5, gpus=[sample(0, 60.0), sample(1, 90.0)])
    beat(client, host_id, token, 6, gpus=[sample(0, 4.0), sample(1, 90.0)])
    fastpath.heartbeats_flush()
    g0.refresh_from_db()
    assert g0.idle_since == GpuSample.objects.filter(gpu=g0, gpu_util=4.0).get().time


def test_a_container_state_change_takes_the_slow_path(client, registered, alice):
    host_id, token = registered
    w = place(Host.objects.get(), alice.tenant)
    desired = beat(client, host_id, token, 1)["desired"]
    beat(client, host_id, token, 2)  # fast: still not started
    assert state(w) == State.SCHEDULED
    beat(client, host_id, token, 3, containers=running(desired[0]))
    assert state(w) == State.RUNNING


def test_a_stop_leaves_the_very_next_answer(client, registered, alice):
    host_id, token = registered
    w, desired, report = started(client, host_id, token, alice.tenant)
    assert len(beat(client, host_id, token, 3, containers=report)["desired"]) == 1  # fast
    workload_stop(workload=w)
    assert state(w) == State.STOPPING
    assert beat(client, host_id, token, 4, containers=report)["desired"] == []
    beat(client, host_id, token, 5, containers=[])
    assert state(w) == State.STOPPED


def test_a_placement_reaches_the_very_next_answer(client, registered, alice):
    host_id, token = registered
    beat(client, host_id, token, 1)
    assert beat(client, host_id, token, 2)["desired"] == []  # fast
    w = place(Host.objects.get(), alice.tenant)  # what apply does: allocations, SCHEDULED
    desired = beat(client, host_id, token, 3)["desired"]
    assert [d["instance_id"].split(".")[0] for d in desired] == [str(w.pk)]


def test_a_rotated_token_is_refused_at_once(client, registered, region):
    host_id, token = registered
    beat(client, host_id, token, 1)
    beat(client, host_id, token, 2)  # the token is in Redis now
    again = {**register_body(new_token(region)), "previous_host_token": token}
    resp = post(client, "/agent/v1/register", again)
    assert resp.status_code == 200 and resp.json()["host_id"] == host_id
    assert_error(post(client, HB, beat_body(host_id, 3), token=token), 401, "authentication_failed")
    beat(client, host_id, resp.json()["host_token"], 1)


def test_a_token_of_another_host_is_refused_even_when_both_are_cached(client, registered, region):
    host_id, token = registered
    resp = post(client, "/agent/v1/register", register_body(new_token(region), hostname="h2"))
    other_id, other = resp.json()["host_id"], resp.json()["host_token"]
    for seq in (1, 2):
        beat(client, host_id, token, seq, gpus=[])
        beat(client, other_id, other, seq, gpus=[])
    for seq in (3, 2):  # fresh, and late
        resp = post(client, HB, beat_body(host_id, seq), token=other)
        assert_error(resp, 401, "authentication_failed")
    fastpath.heartbeats_flush()
    assert Host.objects.get(pk=other_id).last_seq == 2


def test_a_deleted_host_is_refused_after_the_next_flush(client, registered):
    host_id, token = registered
    beat(client, host_id, token, 1)
    beat(client, host_id, token, 2)
    fastpath.heartbeats_flush()
    Host.objects.all().delete()  # as the admin's delete does: no service is called
    beat(client, host_id, token, 3)  # answered from Redis, buffered
    out = fastpath.heartbeats_flush()
    assert (out.heartbeats, out.hosts, out.samples) == (1, 0, 0)
    assert not GpuSample.objects.exists()
    assert_error(post(client, HB, beat_body(host_id, 4), token=token), 401)


def test_a_down_host_comes_back_with_its_next_heartbeat(client, registered, triggered):
    host_id, token = registered
    beat(client, host_id, token, 1)
    beat(client, host_id, token, 2)
    later = timezone.now() + timedelta(hours=1)
    assert hosts_mark_down(now=later) == [host_id]
    beat(client, host_id, token, 3)  # the same report, but the slow path: it was DOWN
    host = Host.objects.get()
    assert host.state == HostState.READY and host.down_since is None


def test_the_liveness_check_writes_buffered_heartbeats_first(client, registered):
    host_id, token = registered
    beat(client, host_id, token, 1)
    Host.objects.update(last_heartbeat_at=timezone.now() - timedelta(minutes=10))
    beat(client, host_id, token, 2)  # fast: only in Redis
    assert hosts_mark_down() == []
    assert Host.objects.get().state == HostState.READY


def test_an_unchanged_volume_report_is_fast_and_the_flush_stamps_its_measuring_time(
    client, registered, alice, django_assert_num_queries
):
    """Each host reports its volumes every VOLUME_USAGE_EVERY_S, mostly the same set: the same
    bytes at the same version take the fast path; different bytes, or a resize (the over-size
    verdict may move), take the slow one."""
    host_id, token = registered
    host = Host.objects.get()
    vol = Volume.objects.create(tenant=alice.tenant, name="data", region=host.region, size_gib=1, host=host)

    def send(seq: int, used: int) -> None:
        body = {**beat_body(host_id, seq, gpus=[sample(0), sample(1)]),
                "volumes": [{"volume": vol.docker_name, "used_bytes": used}]}
        assert post(client, HB, body, token=token).status_code == 200

    def report(seq: int, used: int) -> Volume:
        send(seq, used)
        return Volume.objects.get(pk=vol.pk)

    def report_fast(seq: int, used: int) -> None:
        with django_assert_num_queries(0):
            send(seq, used)

    first = report(1, 2 * 1024**3)  # slow: the first report, past its size
    assert first.used_bytes == 2 * 1024**3 and first.over_size_since is not None
    report_fast(2, 2 * 1024**3)
    assert Volume.objects.get(pk=vol.pk).measured_at == first.measured_at  # buffered
    assert fastpath.heartbeats_flush().heartbeats == 2  # with the first (slow) one's samples
    again = Volume.objects.get(pk=vol.pk)
    assert again.measured_at > first.measured_at
    assert (again.used_bytes, again.over_size_since) == (first.used_bytes, first.over_size_since)
    assert VolumeEvent.objects.filter(volume=vol).count() == 1
    with transaction.atomic():
        volume_resize(volume=vol, size_gib=4)
    assert report(3, 2 * 1024**3).over_size_since is None  # slow: back under its size
    assert report(4, 5 * 1024**3).over_size_since is not None  # slow: different bytes
    assert VolumeEvent.objects.filter(volume=vol).count() == 2


def test_a_late_heartbeat_is_answered_but_not_applied(client, registered):
    host_id, token = registered
    beat(client, host_id, token, 5)
    beat(client, host_id, token, 6)
    beat(client, host_id, token, 4)  # within the reorder window: late
    fastpath.heartbeats_flush()
    assert Host.objects.get().last_seq == 6
    assert GpuSample.objects.count() == 4  # seq 5 and 6, not 4


def test_a_fatal_xid_is_handled_by_the_slow_path(client, registered, alice):
    host_id, token = registered
    w = place(Host.objects.get(), alice.tenant)
    beat(client, host_id, token, 1)
    beat(client, host_id, token, 2)
    answer = beat(client, host_id, token, 3, gpus=[sample(0, xid_events=[79]), sample(1)])
    g0 = Gpu.objects.get(index=0)
    assert not g0.healthy and g0.unhealthy_reason.startswith("XID 79")
    assert state(w) == State.FAILED and answer["desired"] == []


def test_a_gpu_marked_healthy_that_still_fails_is_caught_again(client, registered):
    host_id, token = registered
    lost = [sample(0), sample(1, healthy=False, error="GPU is lost")]
    beat(client, host_id, token, 1, gpus=lost)
    beat(client, host_id, token, 2, gpus=lost)  # fast: already out of service
    g1 = Gpu.objects.get(index=1)
    assert not g1.healthy
    gpu_mark_healthy(gpu=g1)
    beat(client, host_id, token, 3, gpus=lost)
    g1.refresh_from_db()
    assert not g1.healthy and g1.unhealthy_reason == "GPU is lost"


def test_a_log_request_rides_on_the_very_next_answer(client, registered, alice):
    host_id, token = registered
    w, desired, report = started(client, host_id, token, alice.tenant)
    assert beat(client, host_id, token, 3, containers=report)["logs_requests"] == []
    workload_logs_request(workload=w, tail=50)
    answer = beat(client, host_id, token, 4, containers=report)
    assert answer["logs_requests"] == [{"instance_id": desired[0]["instance_id"], "tail": 50}]


def test_a_nul_a_container_printed_is_stored_as_a_replacement_character(client, registered, alice):
    # PostgreSQL cannot store NUL in text: before, a container that printed one made every
    # heartbeat of its host fail (500) while its log was asked for, until the host went DOWN.
    host_id, token = registered
    w, desired, report = started(client, host_id, token, alice.tenant)
    workload_logs_request(workload=w, tail=50)
    body = beat_body(host_id, 3, containers=report, gpus=[sample(0), sample(1)])
    body["logs"] = [{"instance_id": desired[0]["instance_id"], "text": "step 1\x00\x00done\n"}]
    assert post(client, HB, body, token=token).status_code == 200
    assert workload_logs_request(workload=w, tail=50).text == "step 1\ufffd\ufffddone\n"
    exited = [{**report[0], "state": "exited", "exit_code": 1, "error": "exec: \"a\x00b\": invalid"}]
    assert post(client, HB, beat_body(host_id, 4, containers=exited), token=token).status_code == 200
    # in an id it is refused, by name
    bad = beat_body(host_id, 5, containers=[{"instance_id": "x\x00", "state": "running"}])
    err = assert_error(post(client, HB, bad, token=token), 400, "validation_error")
    assert "containers[0].instance_id" in err["fields"]


def test_a_heartbeat_the_database_refuses_is_dropped_not_retried_forever(client, registered, caplog):
    # The parser now refuses such a seq; an older server could buffer it. Retrying it kept every
    # host's buffered liveness behind it, so the whole fleet would have gone DOWN.
    import orjson

    host_id, token = registered
    beat(client, host_id, token, 1)
    beat(client, host_id, token, 2)  # fast: buffered
    poison = f"{host_id}|".encode() + orjson.dumps([time.time(), 2**63, [["GPU-h1-0", 5.0, None, 1, None, None]]])
    fastpath._redis().lpush(f"{fastpath._prefix()}buf", poison)  # at the head, before the good one
    out = fastpath.heartbeats_flush()
    assert out.dropped == 1 and out.heartbeats >= 1
    assert Host.objects.get().last_seq == 2 and GpuSample.objects.count() == 4  # the good one written
    assert fastpath.heartbeats_flush().heartbeats == 0  # and the poison is gone
    assert "dropped a buffered heartbeat" in caplog.text


def test_fast_and_slow_heartbeats_share_one_rate_limit(client, registered, settings):
    host_id, token = registered
    settings.AGENT_RATE_LIMIT = "3/min"
    beat(client, host_id, token, 1)  # slow
    beat(client, host_id, token, 2)  # fast
    beat(client, host_id, token, 3, gpus=[sample(0)])  # slow: another GPU set
    resp = post(client, HB, beat_body(host_id, 4, gpus=[sample(0)]), token=token)
    assert_error(resp, 429, "throttled")
    assert int(resp["Retry-After"]) > 0


def test_a_malformed_heartbeat_gets_the_slow_paths_error(client, registered):
    host_id, token = registered
    beat(client, host_id, token, 1)
    body = beat_body(host_id, 2, containers=[{"instance_id": "x", "state": "exploded"}])
    err = assert_error(post(client, HB, body, token=token), 400, "validation_error")
    assert "containers[0].state" in err["fields"]


def test_the_flush_runs_on_a_real_worker(worker, live_server, region, triggered):
    import requests

    token = new_token(region)
    url = live_server.url
    reg = requests.post(f"{url}/agent/v1/register", json=register_body(token), timeout=10)
    host_id, host_token = reg.json()["host_id"], reg.json()["host_token"]
    for seq in (1, 2, 3):
        resp = requests.post(
            f"{live_server.url}{HB}",
            json=beat_body(host_id, seq, gpus=[sample(0), sample(1)]),
            headers={"Authorization": f"Bearer {host_token}"},
            timeout=10,
        )
        assert resp.status_code == 200
    assert Host.objects.get().last_seq == 1  # 2 and 3 are in Redis
    heartbeats_flush_task.delay()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and Host.objects.get().last_seq != 3:
        time.sleep(0.2)
    assert Host.objects.get().last_seq == 3 and GpuSample.objects.count() == 6


def test_the_flush_is_in_the_beat_schedule_every_second():
    entry = app.conf.beat_schedule["heartbeats-flush"]
    assert entry["task"] == "agents.tasks.heartbeats_flush_task" and entry["schedule"] == 1.0


W = SEQ_REORDER_WINDOW


@pytest.mark.parametrize("seq,last", [(7, 6), (6, 6), (5, 6), (1, 500), (100 - W, 100), (99 - W, 100)])
def test_seq_claims_follow_seq_is_fresh(registered, seq, last):
    """The script's claim and the slow path's rule: one verdict, the reorder window's edges included."""
    host_id, _ = registered
    fastpath.beat(None, host_id=host_id, seq=last, count=False)
    claim = fastpath.claim_of(fastpath.beat(None, host_id=host_id, seq=seq, count=False), None)
    assert claim.fresh is seq_is_fresh(seq, last)


@pytest.mark.parametrize("rate", ["120/min", "5/s", "10/hour", "1000000/day"])
def test_the_heartbeat_script_counts_the_rate_every_throttle_counts(settings, rate):
    """One reading of AGENT_RATE_LIMIT: the script's (heartbeats), the agent throttle's (the
    slow path without Redis, registrations), and rest_framework's own."""
    settings.AGENT_RATE_LIMIT = rate
    drf = type("Drf", (SimpleRateThrottle,), {"rate": rate})()
    ours = AgentThrottle()
    assert fastpath._rate() == (drf.num_requests, drf.duration * 1000) == (ours.num_requests, ours.duration * 1000)


def test_the_fast_and_the_slow_path_store_the_same_outcome(client, registered, region, settings):
    """One home for the heartbeat rules (freshness, idleness, the utilisation clamp, samples): the same heartbeats,
    once through the slow path only (no Redis) and once through the fast path and its flush,
    leave the same rows."""
    utils = [90.0, 1.0, 1.0, 2.0, 60.0, 4.0]  # GPU 0 idles, works, idles again; GPU 1 works
    seqs = [1, 2, 3, 3, 4, 5, 6, 2]  # a duplicate and a late one among them: answered, not applied

    def run(host_id, token):
        for seq in seqs:
            u = utils[min(seq, len(utils)) - 1]
            # GPU 1's last reading is out of range: both paths clamp it (utilisation_fraction)
            beat(client, host_id, token, seq, gpus=[sample(0, u), sample(1, 130.0 if seq == 6 else 90.0)])
        fastpath.heartbeats_flush()
        host = Host.objects.get(pk=host_id)
        samples = list(GpuSample.objects.filter(gpu__host=host).order_by("gpu__index", "time", "id")
                       .values_list("gpu__index", "time", "gpu_util", "mem_used_mib"))
        times = [t for _, t, _, _ in samples]
        gpus = [(g.index, g.utilisation, g.healthy, None if g.idle_since is None else times.index(g.idle_since))
                for g in Gpu.objects.filter(host=host).order_by("index")]
        return host.last_seq, host.state, gpus, [(i, u, m) for i, _, u, m in samples]

    redis_url = settings.REDIS_URL
    settings.REDIS_URL = ""  # no shared Redis: every heartbeat takes the slow path
    assert not fastpath.enabled()
    host_id, token = registered
    slow = run(host_id, token)
    Host.objects.filter(pk=host_id).delete()
    settings.REDIS_URL = redis_url
    assert fastpath.enabled()
    resp = post(client, "/agent/v1/register", register_body(new_token(region)))
    fast = run(resp.json()["host_id"], resp.json()["host_token"])
    assert fast == slow
    assert slow[0] == 6 and slow[2][0][3] is not None and slow[2][1][3] is None  # GPU 0 idle, GPU 1 not
    assert slow[2][1][1] == 1.0


def test_a_long_poll_with_a_cached_token_is_answered_without_sql(
        client, registered, region, settings, django_assert_num_queries):  # noqa: F811
    """The wait's own fast path: the token the heartbeat cached authenticates it in Redis; a
    version that moved answers at once, with no SQL. A replaced token, or a token of another
    host, still gets the synchronous view's 401."""
    settings.AGENT_LONGPOLL_SLOTS = 2
    host_id, token = registered
    beat(client, host_id, token, 1)
    answer = beat(client, host_id, token, 2)  # the token is in Redis now
    wait = {"protocol_version": 1, "host_id": host_id, "version": "stale", "timeout_s": 1}
    with django_assert_num_queries(0):
        resp = post(client, "/agent/v1/wait", wait, token=token)
    assert resp.status_code == 200 and resp.json()["changed"] is True
    assert answer["desired_version"] != "stale"

    other = post(client, "/agent/v1/register", register_body(new_token(region), hostname="h2")).json()
    assert_error(post(client, "/agent/v1/wait", {**wait, "host_id": other["host_id"]}, token=token),
                 401, "authentication_failed")
    again = {**register_body(new_token(region)), "previous_host_token": token}
    rotated = post(client, "/agent/v1/register", again).json()["host_token"]
    assert_error(post(client, "/agent/v1/wait", wait, token=token), 401, "authentication_failed")
    assert post(client, "/agent/v1/wait", wait, token=rotated).json()["changed"] is True
