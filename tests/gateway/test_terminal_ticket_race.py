"""A terminal ticket is used once even when upgrades race for it (gateway/services.py).

Separate from test_gateway_terminal_tickets.py, which runs against the old code too (it goes
through the console page and the gateway only); this one calls the ticket service itself.
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection

from gateway.services import Redeemed, terminal_ticket_issue, terminal_ticket_redeem
from tests.agents.test_agent_api import region  # noqa: F401
from tests.gateway.test_gateway_http import CONSOLE_ORIGIN

pytestmark = pytest.mark.django_db(transaction=True)


def test_of_many_upgrades_racing_with_one_ticket_exactly_one_gets_it(alice, region):  # noqa: F811
    """The use is one DELETE: of eight threads (eight database connections) redeeming one ticket
    at once, one gets the user, seven nothing (PostgreSQL; SQLite serialises writes anyway)."""
    from gpucloud.catalogue.models import InstanceType
    from scheduler.models import Workload

    w = Workload.objects.create(tenant=alice.tenant, kind="instance", name="nb", image="img:1", region=region,
                                instance_type=InstanceType.objects.get(code="h100.1x"))
    ticket = terminal_ticket_issue(user_id=alice.user.pk, workload_id=w.pk, session_key="s" * 32,
                                   origin=CONSOLE_ORIGIN)
    start = threading.Barrier(8)

    def redeem() -> object:
        try:
            start.wait(timeout=30)
            return terminal_ticket_redeem(ticket=ticket, workload_id=str(w.pk), origin=CONSOLE_ORIGIN)
        finally:
            connection.close()

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: redeem(), range(8)))
    assert [r for r in results if r is not None] == [Redeemed(user_id=alice.user.pk, session_key="s" * 32)]
