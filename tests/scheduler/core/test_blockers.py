"""The admission rule's order and the catalogue's word, as tables (scheduler/core/blockers.py)."""
from __future__ import annotations

import pytest

from scheduler.core import blockers as b
from scheduler.core.model import QuotaRule
from scheduler.core.quota import quota_blocker

BILLING = b.billing_blocker(blocked=True, code=b.BUDGET_EXCEEDED, budget="lab-cap")
NEVER_QUOTA = b.quota_exceeded(need_milli=8000, limit=4, gpu_model="H100", region=None)
FULL = b.quota_full(used=2250, need=8000, limit=8, unit="gpus", gpu_model=None, region=None)
NEVER = b.unsatisfiable(instance_type="h100.2x", region="ap-northeast-1", why="the fleet has no H100 GPUs")
BUSY = b.no_capacity(region="us-east-1", gpu_model="H100", gpus=2)


@pytest.mark.parametrize("facts, first", [
    ({}, None),
    ({"available_now": 3, "capacity": BUSY}, None),
    ({"available_now": 0, "capacity": BUSY}, b.NO_CAPACITY),
    ({"available_now": None, "capacity": BUSY}, None),  # not counted: the scheduler decides
    ({"quota": FULL, "available_now": 0, "capacity": BUSY}, b.QUOTA_FULL),
    ({"never": NEVER, "quota": FULL}, b.UNSATISFIABLE),
    ({"billing": BILLING, "never": NEVER, "quota": FULL}, b.BUDGET_EXCEEDED),
    ({"quota": NEVER_QUOTA, "billing": BILLING, "never": NEVER}, b.QUOTA_EXCEEDED),
])
def test_the_first_cause_in_the_rules_order_is_named(facts, first):
    got = b.admission(**facts)
    assert (got.code if got else None) == first


@pytest.mark.parametrize("blocker, status, refused", [
    (b.billing_blocker(blocked=True, code=b.EMAIL_UNCONFIRMED), 402, True),
    (b.billing_blocker(blocked=True, code=""), 402, True),  # a flag without its reason: the balance
    (BILLING, 402, True), (NEVER_QUOTA, 400, True), (NEVER, 409, True), (FULL, 201, False), (BUSY, 201, False),
])
def test_each_cause_has_its_answer(blocker, status, refused):
    assert (blocker.status, blocker.refused) == (status, refused)
    assert b.sentence(blocker).endswith(".") and b.words(blocker) in b.sentence(blocker)


def test_billing_admits_when_not_blocked_and_names_the_budget():
    assert b.billing_blocker(blocked=False, code=b.BUDGET_EXCEEDED, budget="x") is None
    assert b.words(BILLING).startswith('The hard-stop budget "lab-cap" is spent this month')
    assert b.words(b.billing_blocker(blocked=True, code="")).startswith("Your balance is used up")


@pytest.mark.parametrize("rule, used, n, need, words", [
    (QuotaRule(max_gpus=8), 2250, 1, 8000, "quota: 2.25 of 8 GPUs in use and this needs 8 more"),
    (QuotaRule(max_gpus=8, gpu_model="H100", region="eu-west"), 8000, 1, 1000,
     "quota: 8 of 8 H100 GPUs in eu-west in use and this needs 1 more"),
    (QuotaRule(max_gpus=4, gpu_model="H100"), 0, 0, 8000, "quota: this asks for 8 H100 GPUs but the quota allows 4"),
    (QuotaRule(max_instances=3), 0, 3, 1000, "quota: 3 of 3 instances running and this needs 1 more"),
    (QuotaRule(max_instances=0), 0, 0, 1000, "quota: no instances allowed"),
    (QuotaRule(max_gpus=8, max_instances=3), 2000, 2, 1000, None),
])
def test_quota_blocker_says_how_much_more_it_needs(rule, used, n, need, words):
    got = quota_blocker(rule, used, n, need)
    assert (b.words(got) if got else None) == words


@pytest.mark.parametrize("can_host, available_now, word", [
    (True, 2, "available"), (True, 0, "busy"), (False, 0, "never"),
])
def test_an_offer_is_available_busy_or_never(can_host, available_now, word):
    assert b.availability(can_host=can_host, available_now=available_now) == word
