from __future__ import annotations

import threading

import pytest
import redis
from django.conf import settings

from gpucloud.lib import ratelimit
from gpucloud.tenancy.models import ApiKey

pytestmark = pytest.mark.django_db


def test_each_key_has_its_own_budget_counted_in_redis(alice):
    limited = alice.client().post("/api/v1/api-keys", {"name": "slow", "scopes": ["read"]}, format="json").json()
    ApiKey.objects.filter(pk=limited["id"]).update(rate_limit_per_min=3)
    client = alice.client(limited["secret"])
    assert [client.get("/api/v1/tenant").status_code for _ in range(3)] == [200, 200, 200]
    resp = client.get("/api/v1/tenant")
    assert resp.status_code == 429
    assert resp.json()["error"]["code"] == "throttled"
    assert 0 < int(resp["Retry-After"]) <= 60
    # another key of the same user is not affected
    assert alice.client().get("/api/v1/tenant").status_code == 200
    # the counters are in the shared Redis, so every web process sees the same budget
    r = redis.Redis.from_url(settings.REDIS_URL)
    assert any(b"throttle_per_key_key:" + limited["id"].encode() in k for k in r.keys("*throttle*"))


THREADS, PER_THREAD, LIMIT = 16, 100, 100


@pytest.mark.django_db(transaction=True)
def test_16_threads_on_one_key_never_get_more_than_its_limit_through(alice):
    """The counter is one atomic step in Redis: no read-modify-write that concurrent requests
    can interleave (DRF's cache throttle let 1,431 of 600/min through with 16 threads)."""
    from django.db import connection
    from rest_framework.test import APIClient

    assert ApiKey.objects.filter(tenant=alice.tenant).update(rate_limit_per_min=LIMIT) == 1
    start = threading.Barrier(THREADS + 1)
    statuses: list[list[int]] = [[] for _ in range(THREADS)]

    def hammer(i: int) -> None:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {alice.key}")
        try:
            start.wait(timeout=30)
            for _ in range(PER_THREAD):
                statuses[i].append(client.get("/api/v1/regions").status_code)
        finally:
            connection.close()

    threads = [threading.Thread(target=hammer, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    start.wait(timeout=30)
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    flat = [s for per in statuses for s in per]
    assert len(flat) == THREADS * PER_THREAD
    assert set(flat) <= {200, 429}
    assert flat.count(200) == LIMIT


@pytest.mark.parametrize("backend", ["redis", "in-process"])
def test_the_limiter_counts_exactly_under_16_threads(backend, settings):
    """The limiter alone, on both of its stores: Redis, and the demo's in-process log."""
    if backend == "in-process":
        settings.REDIS_URL = ""
        ratelimit.reset_local()
    start = threading.Barrier(THREADS)
    allowed: list[int] = [0] * THREADS

    def hammer(i: int) -> None:
        start.wait(timeout=30)
        for _ in range(PER_THREAD):
            allowed[i] += ratelimit.hit(key=f"t:{backend}", limit=LIMIT, window_s=60).allowed

    threads = [threading.Thread(target=hammer, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert sum(allowed) == LIMIT


@pytest.mark.parametrize("backend", ["redis", "in-process"])
def test_the_window_slides_and_says_how_long_to_wait(backend, settings):
    if backend == "in-process":
        settings.REDIS_URL = ""
        ratelimit.reset_local()
    t0 = 1_800_000_000.0
    assert [ratelimit.hit(key="w", limit=2, window_s=60, now=t0 + dt).allowed for dt in (0, 10)] == [True, True]
    refused = ratelimit.hit(key="w", limit=2, window_s=60, now=t0 + 20)
    assert not refused.allowed and refused.retry_after_s == pytest.approx(40)
    assert ratelimit.hit(key="w", limit=2, window_s=60, now=t0 + 60).allowed  # the first left the window
    assert not ratelimit.hit(key="w", limit=2, window_s=60, now=t0 + 61).allowed
    assert ratelimit.hit(key="other", limit=2, window_s=60, now=t0 + 61).allowed


def _anonymous_limit(settings, rate: str) -> None:
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {"per_key": rate}}


def test_anonymous_clients_cannot_get_a_fresh_budget_from_x_forwarded_for(anon, settings, catalog):
    """No proxy configured: X-Forwarded-For is whatever the client wrote; REMOTE_ADDR counts."""
    settings.TRUST_X_FORWARDED_FOR, settings.TRUSTED_PROXY_HOPS = False, 0
    _anonymous_limit(settings, "3/min")
    codes = [anon.get("/api/v1/regions", HTTP_X_FORWARDED_FOR=f"198.51.100.{i}").status_code for i in range(5)]
    assert codes == [200, 200, 200, 429, 429]
    resp = anon.get("/api/v1/regions", REMOTE_ADDR="192.0.2.1")  # another address: its own budget
    assert resp.status_code == 200


def test_behind_one_proxy_the_address_it_saw_counts_not_the_leftmost(anon, settings, catalog):
    settings.TRUST_X_FORWARDED_FOR, settings.TRUSTED_PROXY_HOPS = True, 1
    _anonymous_limit(settings, "3/min")
    # the client prepends made-up addresses; the proxy appends the one it saw
    codes = [anon.get("/api/v1/regions", HTTP_X_FORWARDED_FOR=f"10.0.0.{i}, 203.0.113.5").status_code
             for i in range(5)]
    assert codes == [200, 200, 200, 429, 429]
    resp = anon.get("/api/v1/regions", HTTP_X_FORWARDED_FOR="10.0.0.1, 203.0.113.6")
    assert resp.status_code == 200  # another client behind the same proxy


def test_signup_is_throttled_per_address(anon, settings):
    _anonymous_limit(settings, "2/min")
    body = {"email": "x@y.test", "password": "short"}
    codes = [anon.post("/api/v1/auth/signup", body, format="json").status_code for _ in range(3)]
    assert codes == [400, 400, 429]


def test_agent_registration_is_throttled_per_address_atomically(client, settings, db):
    settings.AGENT_RATE_LIMIT = "2/min"
    codes = [client.post("/agent/v1/register", "{}", content_type="application/json",
                         HTTP_X_FORWARDED_FOR=f"198.51.100.{i}").status_code for i in range(3)]
    assert codes == [400, 400, 429]
