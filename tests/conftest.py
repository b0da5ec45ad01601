"""Shared fixtures: three users, as in healthchecks' hc/test.py.

alice (owner) and bob (member) share the tenant "Acme"; victor is Acme's viewer;
charlie owns "Globex". Every API test has a cross-tenant case with charlie.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

# Django is imported inside the fixtures, so the pure packages' tests (scheduler/core,
# agents/host) also run without Django: `pytest -p no:django tests/scheduler/core`.


@dataclass
class Actor:
    user: Any
    tenant: Any
    membership: Any
    key: str  # an API key's secret with the widest scopes the role allows

    def client(self, key: str | None = None):
        from rest_framework.test import APIClient

        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {key or self.key}")
        return client


def make_user(email: str):
    from django.contrib.auth import get_user_model

    return get_user_model().objects.create_user(username=email, email=email, password="correct horse battery")


def _widest_scope(role: str) -> list[str]:
    from gpucloud.tenancy.choices import Role, Scope

    return {Role.VIEWER: [Scope.READ], Role.MEMBER: [Scope.READ, Scope.WRITE]}.get(role, [Scope.ADMIN])


def make_actor(email: str, tenant: Any = None, role: str = "owner", tenant_name: str = "Tenant") -> Actor:
    from gpucloud.tenancy.models import Membership
    from gpucloud.tenancy.services import api_key_create, tenant_create

    user = make_user(email)
    if tenant is None:
        tenant = tenant_create(name=tenant_name, owner=user)
        membership = Membership.objects.get(tenant=tenant, user=user)
    else:
        membership = Membership.objects.create(tenant=tenant, user=user, role=role)
    _, secret = api_key_create(membership=membership, name=f"{email} key",
                               scopes=_widest_scope(membership.role))
    return Actor(user=user, tenant=tenant, membership=membership, key=secret)


@pytest.fixture(scope="session", autouse=True)
def _flush_by_delete(request):
    """Empty the tables after a transactional test with DELETE, not TRUNCATE.

    Django's flush truncates every table in one statement; on PostgreSQL that makes new files
    for each of the 60-odd tables and their indexes, about 2 s on this machine, after each of the
    ~100 tests that commit (live servers, workers, agents). Deleting the few rows a test made takes
    0.1 s. Both empty every table in one transaction; the foreign keys Django makes are deferrable,
    so the order does not matter. Sequences are not reset either way, unless a test asks
    (`reset_sequences`), which keeps Django's own statement.
    """
    if not request.config.pluginmanager.has_plugin("django"):  # run with -p no:django
        yield
        return
    from django.db.backends.postgresql.operations import DatabaseOperations

    truncate = DatabaseOperations.sql_flush

    def sql_flush(self, style, tables, *, reset_sequences=False, allow_cascade=False):
        if reset_sequences or not tables:
            return truncate(self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade)
        return ["SET CONSTRAINTS ALL DEFERRED;", *(f"DELETE FROM {self.quote_name(t)};" for t in tables)]

    DatabaseOperations.sql_flush = sql_flush
    yield
    DatabaseOperations.sql_flush = truncate


@pytest.fixture(autouse=True)
def _clean_cache(request):
    if not request.config.pluginmanager.has_plugin("django"):  # run with -p no:django
        yield
        return
    from django.core.cache import cache

    # Throttle counters live in Redis (a database of the tests' own); start each test at zero.
    cache.clear()
    yield


@pytest.fixture
def alice(db) -> Actor:
    return make_actor("alice@acme.test", tenant_name="Acme")


@pytest.fixture
def bob(alice) -> Actor:
    return make_actor("bob@acme.test", tenant=alice.tenant, role="member")


@pytest.fixture
def victor(alice) -> Actor:
    return make_actor("victor@acme.test", tenant=alice.tenant, role="viewer")


@pytest.fixture
def charlie(db) -> Actor:
    return make_actor("charlie@globex.test", tenant_name="Globex")


@pytest.fixture
def catalog(db):
    from django.core.management import call_command

    call_command("seed_catalog", stdout=open("/dev/null", "w"))


@pytest.fixture
def fleet(catalog):
    """One host with 8 H100 GPUs in us-east-1, so a launch there is not refused as unsatisfiable
    (no host could ever run it) for want of any fleet."""
    from tests.scheduler.fleet import make_hosts

    return make_hosts(n=1)


@pytest.fixture
def anon():
    from rest_framework.test import APIClient

    return APIClient()


def broker_clear() -> None:
    """Empty the tests' broker: the queued tasks and those a killed worker left unacknowledged.

    Tasks are acknowledged late, so Redis hands a killed worker's task again once the visibility
    timeout (an hour) has passed, to whichever worker then starts: a later test's, or a later
    run's on the same Redis. A test's solo worker busy with a stranger's task answers no ping
    (a metering run redelivered so waited on tests/billing/test_crash.py's row lock)."""
    from gpucloud.celery import app

    app.control.purge()
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        channel.client.delete(channel.unacked_key, channel.unacked_index_key)


@pytest.fixture
def worker(transactional_db):
    """A real Celery worker process on the real Redis broker, using the test database."""
    import os
    import subprocess
    import sys
    import tempfile
    import time

    from django.conf import settings

    from gpucloud.celery import app

    db = settings.DATABASES["default"]
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "gpucloud.test_settings",
           "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"}
    broker_clear()
    # Its log goes to a file: a pipe nobody reads fills up and stops the worker mid-test.
    log = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "gpucloud", "worker", "--pool=solo", "--concurrency=1",
         "--without-gossip", "--without-mingle", "--loglevel=INFO"],
        env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
    )
    try:
        deadline = time.monotonic() + 120  # a worker starting on a loaded machine
        while time.monotonic() < deadline:
            if app.control.ping(timeout=0.5):
                break
            if proc.poll() is not None:
                log.seek(0)
                pytest.fail(f"the Celery worker exited: {log.read()[-4000:]}")
        else:
            pytest.fail("the Celery worker did not start within 120 s")
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
        log.close()
