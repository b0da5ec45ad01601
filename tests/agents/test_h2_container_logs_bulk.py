# ruff: noqa: F811 - the agent API tests' fixtures are imported and then used as arguments
"""Container log tails from a heartbeat: stored in at most two statements on PostgreSQL,
with the outcome of the rule applied tail by tail (the reference below), in any order.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

# The agent API tests' small catalogue.
from test_agent_api import region  # noqa: F401 - a fixture, used by name

from agents.models import ContainerLog, Host
from agents.protocol import ContainerLogTail
from agents.services.logs import _container_logs_store_orm, container_logs_store
from scheduler.models import InstanceType, Workload

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
ASKED = NOW - timedelta(seconds=7)
BEFORE = NOW - timedelta(minutes=5)


FIELDS = ("host_id", "attempt_id", "requested_tail", "requested_at", "text", "captured_at")


def reference_store(rows: dict, *, host, tails, now, attempts) -> dict:
    """The rule on rows in memory (workload id -> fields), one tail at a time in the order sent:
    a tail clears the request of the rows holding its container on this host; one with text
    also replaces their text, or, where no row holds the container, becomes the log of the
    container's workload (created or taken over) if this host runs it."""
    rows = {w: dict(r) for w, r in rows.items()}
    for t in tails:
        holding = [r for r in rows.values() if r["host_id"] == host.pk and r["attempt_id"] == t.instance_id]
        for r in holding:
            r["requested_at"] = None
            if t.text:
                r.update(text=t.text, captured_at=now)
        if t.text and not holding and t.instance_id in attempts:
            r = rows.setdefault(attempts[t.instance_id].pk, {"requested_tail": 0})
            r.update(host_id=host.pk, attempt_id=t.instance_id, text=t.text, captured_at=now, requested_at=None)
    return rows


@pytest.fixture
def hosts(region):
    return [Host.objects.create(name=n, region=region, vcpus=64, memory_mib=1 << 20) for n in ("a", "b")]


@pytest.fixture
def workloads(region, alice):
    it = InstanceType.objects.get(code="h100.1x")
    return [Workload.objects.create(tenant=alice.tenant, kind="job", name=f"job-{i}", instance_type=it,
                                    region=region, image="gpucloud/test:1") for i in range(10)]


def stored() -> list[tuple]:
    return sorted(ContainerLog.objects.values_list("workload_id", *FIELDS))


def as_rows(rows: dict) -> list[tuple]:
    return sorted((w, *(r[f] for f in FIELDS)) for w, r in rows.items())


def test_six_exits_of_one_heartbeat_are_stored_in_two_statements(hosts, workloads):
    a, _ = hosts
    w = workloads[:6]
    # two of them were asked for their log (rows exist), four exit unasked (no rows yet)
    for i in (0, 1):
        ContainerLog.objects.create(workload=w[i], host=a, attempt_id=f"c{i}", requested_tail=50,
                                    requested_at=ASKED, text="earlier", captured_at=BEFORE)
    tails = [ContainerLogTail(f"c{i}", f"line {i}\nexit {i}", truncated=i == 3) for i in range(6)]
    attempts = {f"c{i}": w[i] for i in range(6)}
    with CaptureQueriesContext(connection) as q:
        container_logs_store(host=a, tails=tails, now=NOW, attempts=attempts)
    assert len(q.captured_queries) == 2
    assert stored() == sorted((w[i].pk, a.pk, f"c{i}", 50 if i < 2 else 0, None, f"line {i}\nexit {i}", NOW)
                              for i in range(6))
    # the same containers again: every row exists, so the UPDATE alone
    tails = [ContainerLogTail(f"c{i}", f"again {i}") for i in range(6)]
    with CaptureQueriesContext(connection) as q:
        container_logs_store(host=a, tails=tails, now=NOW, attempts=attempts)
    assert len(q.captured_queries) == 1
    assert [r[5] for r in stored()] == [f"again {i}" for i in sorted(range(6), key=lambda i: w[i].pk)]


def test_no_tails_no_statement(hosts, workloads):
    with CaptureQueriesContext(connection) as q:
        container_logs_store(host=hosts[0], tails=[], now=NOW, attempts={"c0": workloads[0]})
    assert q.captured_queries == []


def test_the_bulk_store_equals_the_rule_tail_by_tail_in_any_order(hosts, workloads):
    a, b = hosts
    w = workloads

    def initial() -> None:
        ContainerLog.objects.all().delete()
        ContainerLog.objects.bulk_create([
            # asked, answered
            ContainerLog(workload=w[0], host=a, attempt_id="i0", requested_tail=20, requested_at=ASKED,
                         text="old 0", captured_at=BEFORE),
            # a second row holding the same container
            ContainerLog(workload=w[8], host=a, attempt_id="i0", requested_tail=5, requested_at=ASKED),
            # the workload's previous container on this host; it runs i1 now, both send a tail
            ContainerLog(workload=w[1], host=a, attempt_id="i1-old", requested_at=ASKED, text="old 1",
                         captured_at=BEFORE),
            # stored from another host; the workload runs here now
            ContainerLog(workload=w[2], host=b, attempt_id="i2", requested_tail=9, requested_at=ASKED,
                         text="from b", captured_at=BEFORE),
            # only an empty tail comes (the container was removed): the text stays, the request clears
            ContainerLog(workload=w[4], host=a, attempt_id="i4", requested_tail=3, requested_at=ASKED,
                         text="keep me", captured_at=BEFORE),
            # one workload, three containers of it in the tails
            ContainerLog(workload=w[6], host=a, attempt_id="i6a", requested_at=ASKED, text="old 6",
                         captured_at=BEFORE),
            # another host's row for a container id this host also sends: untouched
            ContainerLog(workload=w[7], host=b, attempt_id="i0", requested_at=ASKED, text="b's",
                         captured_at=BEFORE),
            # a request this heartbeat does not answer
            ContainerLog(workload=w[9], host=a, attempt_id="i9", requested_tail=1, requested_at=ASKED),
        ])

    attempts = {"i1": w[1], "i2": w[2], "i3": w[3], "i6b": w[6], "i6c": w[6], "i1-old": w[5]}
    tails = [
        ContainerLogTail("i0", 'quote " and back\\slash, {braces}\tand\ttabs'),
        ContainerLogTail("i0", ""),
        ContainerLogTail("i0", "i0 later, ünïcode ✓"),
        ContainerLogTail("i1-old", "old container's last words"),
        ContainerLogTail("i1", "new container"),
        ContainerLogTail("i2", "now on a"),
        ContainerLogTail("i3", ""),
        ContainerLogTail("i3", "first of i3"),
        ContainerLogTail("i3", "NULL"),
        ContainerLogTail("i4", ""),
        ContainerLogTail("i5", "not this host's work"),
        ContainerLogTail("i6a", "six a"),
        ContainerLogTail("i6b", "six b"),
        ContainerLogTail("i6c", "six c"),
    ]
    rng = random.Random(14)
    orders = [list(tails), list(reversed(tails))]
    while len(orders) < 14:
        order = list(tails)
        rng.shuffle(order)
        orders.append(order)
    initial()
    before = {wid: dict(zip(FIELDS, r, strict=True)) for wid, *r in stored()}
    outcomes = set()
    for order in orders:
        expected = as_rows(reference_store(before, host=a, tails=order, now=NOW, attempts=attempts))
        statements = []
        for store in (container_logs_store, _container_logs_store_orm):  # the bulk one, the fallback
            initial()
            with CaptureQueriesContext(connection) as q:
                store(host=a, tails=order, now=NOW, attempts=attempts)
            assert stored() == expected, (store.__name__, [t.instance_id for t in order])
            statements.append(len(q.captured_queries))
        assert statements[0] <= 2 < statements[1]  # the fallback: a statement or more per tail
        outcomes.add(tuple(expected))
    assert len(outcomes) > 1  # the orderings matter to the rule, so the test sees them
