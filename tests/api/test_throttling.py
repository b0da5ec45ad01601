from __future__ import annotations

import pytest
import redis
from django.conf import settings

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
