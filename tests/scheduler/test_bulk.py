"""The cycle's set-based writes: values survive the trip through array literals and COPY text."""
from __future__ import annotations

import uuid

import pytest
from django.db import transaction
from django.utils import timezone

from scheduler import bulk
from scheduler.models import Workload, WorkloadEvent

AWKWARD = ["plain", 'a "quoted" word', "back\\slash", "comma, {braces}", " spaces ", "NULL", "", "tab\there",
           "line\nbreak", "ünïcode ✓"]


@pytest.mark.django_db
def test_an_array_literal_round_trips_any_text_numbers_uuids_and_nulls():
    ids = [uuid.uuid4() for _ in range(3)]
    with bulk.pg_cursor() as cur:
        cur.execute("SELECT %s::text[], %s::int[], %s::uuid[], %s::text[], %s::uuid[]",
                    [bulk.pg_array(AWKWARD), bulk.pg_array([0, -7, 2**31 - 1]), bulk.pg_array(ids),
                     bulk.pg_array(["x", None, 'y"']), bulk.pg_array([])])
        texts, ints, uuids, with_null, empty = cur.fetchone()
    assert texts == AWKWARD  # "NULL" and "" stay strings
    assert ints == [0, -7, 2**31 - 1]
    assert uuids == ids
    assert with_null == ["x", None, 'y"']
    assert empty == []


@pytest.mark.django_db
def test_events_copied_as_text_keep_tabs_line_breaks_and_backslashes(alice, fleet):
    resp = alice.client().post("/api/v1/instances", {
        "name": "nb", "instance_type": "h100.1x", "region": "us-east-1", "image": "busybox",
    }, format="json")
    assert resp.status_code == 201
    workload = Workload.objects.get(pk=resp.json()["id"])
    actor = "ops\\team\tx"
    with transaction.atomic():
        bulk.insert_events([(workload.pk, "pending", "pending", reason, actor, timezone.now()) for reason in AWKWARD])
    got = WorkloadEvent.objects.filter(workload=workload, actor=actor).order_by("id").values_list("reason", flat=True)
    assert list(got) == AWKWARD
