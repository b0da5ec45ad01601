"""The web's connection pool (`DB_POOL_SIZE`, Django's psycopg pool): a connection closed while
serving, as a parked long poll closes its thread's, goes back to the pool and serves the next
request of another thread, instead of a new PostgreSQL session per request.

Each case runs the real settings in a process of its own, against the test database.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from django.conf import settings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Ten requests, one after another, each in a thread of its own (gunicorn's gthread), each
# closing its connection as a parked long poll does; prints the PostgreSQL backend of each.
SCRIPT = r"""
import json, threading
import django
django.setup()
from django.db import connection

pids = []

def request():
    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        pids.append(cur.fetchone()[0])
    connection.close()

for _ in range(10):
    t = threading.Thread(target=request)
    t.start()
    t.join()
print(json.dumps(pids))
"""


def _backends(pool_size: int) -> list[int]:
    db = settings.DATABASES["default"]
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "gpucloud.settings", "SECRET_KEY": "x",
           "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
           "DB_POOL_SIZE": str(pool_size), "DB_CONN_MAX_AGE": "60"}
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.django_db
def test_with_the_pool_a_closed_connection_serves_the_next_thread():
    pids = _backends(pool_size=2)
    assert len(pids) == 10
    # at most the pool's size (it may open its second while the first is being handed back)
    assert len(set(pids)) <= 2, pids


@pytest.mark.django_db
def test_without_the_pool_each_close_costs_a_new_session():
    pids = _backends(pool_size=0)
    assert len(set(pids)) == 10, pids
