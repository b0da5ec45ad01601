"""Spare connections (gpucloud.lib.db): a connection closed while serving a request, as a
parked long poll closes its thread's, serves the process's next request in another thread
instead of a new one; everywhere else a close still closes.

The test settings keep no connection (CONN_MAX_AGE 0); each thread here sets its own
connection's age, as production's DB_CONN_MAX_AGE would.
"""
from __future__ import annotations

import threading
import time

import pytest
from django.core.signals import request_finished, request_started
from django.db import connection, connections, transaction

from gpucloud.lib import db

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _no_spares():
    db.spares_close()
    yield
    db.spares_close()


def in_thread(fn):
    """Run `fn` in a thread of its own (a web thread: its own connection) and return its result."""
    out: dict = {}

    def run():
        try:
            connections["default"].settings_dict["CONN_MAX_AGE"] = 60
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test's thread
            out["error"] = e
        finally:
            connections.close_all()

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


def backend_pid() -> int:
    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        return cur.fetchone()[0]


def alive(pid: int) -> bool:
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid])
        return cur.fetchone()[0] == 1


def serving(fn):
    """`fn` as a request would run it: between request_started and request_finished."""
    def request():
        request_started.send(sender=None)
        try:
            return fn()
        finally:
            request_finished.send(sender=None)
    return request


def park_and_report() -> int:
    pid = backend_pid()
    connection.close()  # what a parked long poll does (agents/api/views.py)
    assert connection.connection is None  # the thread holds none while it waits
    return pid


def test_a_connection_a_request_closes_serves_the_next_request_of_another_thread():
    parked = in_thread(serving(park_and_report))
    assert alive(parked) and len(db._spares) == 1
    assert in_thread(serving(backend_pid)) == parked  # no new connection


def test_outside_requests_a_close_closes():
    pid = in_thread(park_and_report)  # a management command, Celery, close_all() before a fork
    assert not alive_after_close(pid)
    assert db._spares == []


def alive_after_close(pid: int) -> bool:
    deadline = time.monotonic() + 10  # the server ends the backend a moment after the client left
    while time.monotonic() < deadline:
        if not alive(pid):
            return False
        time.sleep(0.05)
    return True


def test_a_connection_inside_a_transaction_or_past_its_age_is_closed():
    def in_atomic():
        with transaction.atomic():
            pid = backend_pid()
            connection.close()
            return pid

    def old():
        pid = backend_pid()
        connection.close_at = time.monotonic() - 1  # DB_CONN_MAX_AGE ran out
        connection.close()
        return pid

    for fn in (in_atomic, old):
        pid = in_thread(serving(fn))
        assert not alive_after_close(pid), fn.__name__
    assert db._spares == []


def test_a_spare_keeps_the_age_of_its_first_opening():
    def first():
        pid = backend_pid()
        connection.close_at = deadline = time.monotonic() + 30
        connection.close()
        return pid, deadline

    pid, deadline = in_thread(serving(first))
    assert in_thread(serving(lambda: (backend_pid(), connection.close_at))) == (pid, deadline)


def test_the_spares_are_bounded(settings):
    settings.DB_SPARE_CONNECTIONS = 1
    barrier = threading.Barrier(2)

    def both_connected():
        pid = backend_pid()
        barrier.wait(timeout=30)  # both threads hold a connection at once, then both close
        connection.close()
        return pid

    pids: list[int] = []
    threads = [threading.Thread(target=lambda: pids.append(in_thread(serving(both_connected)))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(db._spares) == 1
    assert sorted(alive_after_close(p) for p in pids) == [False, True]


def test_a_forked_child_never_touches_the_parents_spares():
    parked = in_thread(serving(park_and_report))
    spares = list(db._spares)
    db._after_fork_in_child()  # what os.fork runs in the child
    try:
        assert db._spares == [] and db._forked_away[-1] == spares[0]
    finally:
        db._spares.extend(db._forked_away[-1:])
        del db._forked_away[-1:]
    assert alive(parked)
