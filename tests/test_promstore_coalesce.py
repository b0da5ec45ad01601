"""Coalesced platform metrics (gpucloud.lib.promstore): heartbeats are counted per process and
sent to Redis together, at most `COALESCE_S` later; a scrape of the same process sends its own
pending counts first, and nothing is counted twice."""
from __future__ import annotations

import time

import pytest
from django.conf import settings

from gpucloud.lib import promstore
from gpucloud.lib.db import redis_client

pytestmark = pytest.mark.django_db


def _stored(path: str) -> dict[str, float]:
    raw = redis_client(settings.REDIS_URL).hgetall(promstore._prefix() + "gpucloud_heartbeats")
    return {k.decode(): float(v) for k, v in raw.items() if k.decode().startswith(path)}


def _exported(path: str) -> float:
    for fam in promstore.collect():
        if fam.name == "gpucloud_heartbeats":
            return sum(s.value for s in fam.samples if s.name.endswith("_total") and s.labels["path"] == path)
    raise AssertionError("no gpucloud_heartbeats family")


def test_coalesced_counts_reach_redis_once_summed_and_the_scrape_sees_them():
    promstore.flush()
    before = _exported("probe")
    for _ in range(5):
        promstore.Batch().inc("gpucloud_heartbeats", ("probe",)).observe(
            "gpucloud_heartbeat_seconds", ("probe",), 0.002).send(coalesce=True)
    assert _exported("probe") == before + 5  # the scrape sent this process's pending counts
    promstore.flush()
    assert _exported("probe") == before + 5  # and nothing twice


def test_the_flusher_sends_pending_counts_without_a_scrape():
    promstore.flush()
    start = _stored("probe2").get("probe2|c", 0.0)
    promstore.Batch().inc("gpucloud_heartbeats", ("probe2",)).send(coalesce=True)
    deadline = time.monotonic() + 30
    while _stored("probe2").get("probe2|c", 0.0) != start + 1:
        assert time.monotonic() < deadline, "the flusher never sent the pending count"
        time.sleep(0.05)
