"""Password-reset mails are throttled per e-mail address and per client address (issue 27, 9).

Past either limit the page answers exactly as before and sends nothing: a mailbox cannot be
bombed with reset mails, and the answer says nothing about whether an account exists.
The counts live in the tests' own Redis (gpucloud.lib.ratelimit), cleared before each test.
"""
from __future__ import annotations

import pytest
from django.core import mail
from django.test import Client

from tests.conftest import make_user

pytestmark = pytest.mark.django_db

RESET = "/console/password-reset/"
SENT = "/console/password-reset/sent/"


def _ask(email: str, ip: str = "198.51.100.7"):
    return Client().post(RESET, {"email": email}, REMOTE_ADDR=ip)


def test_fifteen_resets_in_a_row_send_a_bounded_number_of_mails_and_answer_alike(alice, settings):
    settings.PASSWORD_RESET_RATE_LIMIT_EMAIL = "3/hour"
    settings.PASSWORD_RESET_RATE_LIMIT_IP = "100/hour"
    answers = [_ask("alice@acme.test") for _ in range(15)]
    assert len(mail.outbox) == 3
    assert {(a.status_code, a["Location"]) for a in answers} == {(302, SENT)}
    # from other addresses too: the mailbox's limit is the address's, not the client's
    for n in range(5):
        _ask("alice@acme.test", ip=f"203.0.113.{n + 1}")
    assert len(mail.outbox) == 3


def test_one_client_cannot_mail_many_addresses_past_its_limit(db, settings):
    settings.PASSWORD_RESET_RATE_LIMIT_EMAIL = "3/hour"
    settings.PASSWORD_RESET_RATE_LIMIT_IP = "5/hour"
    for n in range(15):
        make_user(f"user{n}@acme.test")
    answers = [_ask(f"user{n}@acme.test") for n in range(15)]
    assert len(mail.outbox) == 5
    assert {(a.status_code, a["Location"]) for a in answers} == {(302, SENT)}
    # another client is not held back by this one
    assert _ask("user14@acme.test", ip="203.0.113.9").status_code == 302
    assert len(mail.outbox) == 6


def test_an_unknown_address_is_counted_and_answered_like_a_known_one(alice, settings):
    settings.PASSWORD_RESET_RATE_LIMIT_EMAIL = "2/hour"
    settings.PASSWORD_RESET_RATE_LIMIT_IP = "100/hour"
    unknown = [_ask("nobody@acme.test") for _ in range(4)]
    known = [_ask("alice@acme.test") for _ in range(4)]
    assert len(mail.outbox) == 2 and all(m.to == ["alice@acme.test"] for m in mail.outbox)
    assert [(a.status_code, a["Location"]) for a in unknown] == [(a.status_code, a["Location"]) for a in known]


def test_the_address_is_matched_whatever_its_case(alice, settings):
    settings.PASSWORD_RESET_RATE_LIMIT_EMAIL = "1/hour"
    settings.PASSWORD_RESET_RATE_LIMIT_IP = "100/hour"
    _ask("alice@acme.test")
    _ask("ALICE@acme.test")
    _ask(" Alice@Acme.Test")
    assert len(mail.outbox) == 1
