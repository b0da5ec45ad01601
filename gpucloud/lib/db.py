"""Database and Redis plumbing shared by every app: server-side binding, COPY text,
array literals, timestamps as epoch seconds, the shared Redis client, the benchmarks' own
database, the spare connections a request leaves to the process's next one.

It lives at the bottom of the layers (docs/architecture.md) so that the scheduler's
bulk writes, the agents' heartbeat flush and the snapshot use one copy of each.
"""
from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any

import psycopg
import redis
from django.core.signals import request_finished, request_started
from django.db import connection, connections
from django.db.models import FloatField, Func


def pg_cursor() -> psycopg.Cursor:
    """A cursor on Django's psycopg connection (inside its transaction) that binds on the server.

    Django's own cursors bind on the client: a list of 10,000 ids becomes 10,000 quoted
    literals spliced into the SQL text, which psycopg then has to scan. Here an array is
    one parameter sent beside the statement, so a bulk statement costs the same to send
    whatever its size.
    """
    connection.ensure_connection()
    return psycopg.Cursor(connection.connection)


# COPY's text format: a backslash, tab or line break inside a value is written as an escape.
_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})
_COPY_SPECIAL = re.compile(r"[\\\t\n\r]").search
# An array literal's quoted element: backslash and double quote are escaped.
_ARRAY_ESCAPES = str.maketrans({"\\": "\\\\", '"': '\\"'})


def pg_array(values: Iterable[object]) -> str:
    """One PostgreSQL array literal for a `%s::type[]` parameter, every element quoted.

    psycopg's array dumper costs about 5 µs per element in Python; at 40,000 GPU ids a
    cycle spent a quarter of a second on it. The literal is one string, parsed by the
    server's own array input, so any text (quotes, backslashes, commas) round-trips.
    """
    vals = list(values)
    if any(v is None for v in vals):  # NULL elements: unquoted, the rest escaped
        return "{" + ",".join(["NULL" if v is None else '"' + str(v).translate(_ARRAY_ESCAPES) + '"'
                               for v in vals]) + "}"
    items = [str(v) for v in vals]
    body = '","'.join(items)
    if '"' in body or "\\" in body:  # rare: escape element by element
        body = '","'.join([v.translate(_ARRAY_ESCAPES) for v in items])
    return '{"' + body + '"}' if items else "{}"


def copy_text(v: str) -> str:
    """A free-text value for COPY's text format, its backslashes, tabs and line breaks escaped."""
    return v.translate(_COPY_ESCAPES) if _COPY_SPECIAL(v) else v


class Epoch(Func):
    """A timestamp as float seconds since 1970, computed by the database.

    At 100,000 GPUs the snapshot reads tens of thousands of timestamps; turning
    each into a Python datetime and back cost about a second per cycle.
    """

    template = "EXTRACT(EPOCH FROM %(expressions)s)::float8"
    output_field = FloatField()

    def as_sqlite(self, compiler, connection, **extra_context):
        return self.as_sql(compiler, connection, template="((julianday(%(expressions)s) - 2440587.5) * 86400.0)",
                           **extra_context)


@cache
def redis_client(url: str) -> redis.Redis:
    """One client (and connection pool) per URL for the process: the agents' fast path,
    the wake-ups and the /metrics event counters share it."""
    return redis.Redis.from_url(url)


# --- written SQL that still yields model instances (hot paths: the launch, docs/benchmarks.md)


def model_columns(model: type, alias: str) -> str:
    """`alias."col", …` for every concrete field of `model`, in `_meta.concrete_fields` order."""
    return ", ".join(f'{alias}."{f.column}"' for f in model._meta.concrete_fields)  # type: ignore[attr-defined]


def model_from_row(model: type, row: tuple[Any, ...], start: int = 0) -> tuple[Any, int]:
    """The instance of `model` whose columns (as `model_columns` selects them) start at
    `row[start]`, loaded as the ORM loads a row (the backend's and the fields' converters);
    and the index after its columns."""
    fields = model._meta.concrete_fields  # type: ignore[attr-defined]
    end = start + len(fields)
    values = list(row[start:end])
    for i, convs in _converters(model):
        col = convs[0]
        for conv in convs[1]:
            values[i] = conv(values[i], col, connection)
    return model.from_db(connection.alias, [f.attname for f in fields], values), end  # type: ignore[attr-defined]


_per_thread = threading.local()


def _converters(model: type) -> list[tuple[int, tuple[Any, list[Any]]]]:
    """[(field index, (its column expression, converters))] for the fields that have any, as
    the ORM's compiler finds them; made once per thread (whose connection they are bound to)."""
    made: dict[type, Any] = _per_thread.__dict__.setdefault("converters", {})
    if model not in made:
        table = model._meta.db_table  # type: ignore[attr-defined]
        out = []
        for i, f in enumerate(model._meta.concrete_fields):  # type: ignore[attr-defined]
            col = f.get_col(table)
            convs = connection.ops.get_db_converters(col) + f.get_db_converters(connection)
            if convs:
                out.append((i, (col, convs)))
        made[model] = out
    return made[model]


@contextmanager
def bench_database() -> Iterator[None]:
    """A database of the benchmark's own for the block: created with every migration under
    the test name Django derives from the settings (``TEST.NAME``, else ``test_`` + the
    name), and dropped on the way out whatever happens, every connection to it closed first.
    The benchmark commands use it, so none of them writes into the operator's database."""
    old_name = connection.settings_dict["NAME"]
    connection.creation.create_test_db(verbosity=0, autoclobber=True, keepdb=False)
    try:
        yield
    finally:
        connections.close_all()
        spares_close()
        connection.creation.destroy_test_db(old_name, verbosity=0)


# --- spare connections: what a request closes, the process's next request takes (gpucloud.lib.postgresql)
#
# A parked long poll closes its thread's connection (agents/api/views.py: a fleet of waits
# must not hold a connection each). With gunicorn's threads that meant a new connection for the
# thread's next request: in bench_e2e (64 hosts, 2,000 jobs) 570-750 of them in a run, 3 ms of
# the web's CPU each, and a fresh PostgreSQL backend with cold caches. A connection closed while
# serving a request, healthy and idle, is now kept here instead (up to DB_SPARE_CONNECTIONS), and
# the next thread of the process that needs one takes it: 50-70 new ones in that run. A thread
# that parks still holds none; the process opens a connection only when no spare is left, so it
# never holds more than the most threads that held one at once. `DB_CONN_MAX_AGE` counts from
# when each was opened. Outside requests (management commands, Celery, `connections.close_all()`
# before a fork or a DROP DATABASE) a close closes.

_spares: list[tuple[str, psycopg.Connection]] = []  # (alias, connection), the freshest last
_spares_lock = threading.Lock()
_serving = threading.local()
_forked_away: list[tuple[str, psycopg.Connection]] = []  # a parent's, inherited by a fork: never touched


def _request_started(**kwargs: Any) -> None:
    _serving.on = True


def _request_finished(**kwargs: Any) -> None:
    _serving.on = False


def _after_fork_in_child() -> None:
    # The parent's sockets: closing one here would end the parent's session, and the garbage
    # collector closes what it frees, so they are kept out of reach for good.
    _forked_away.extend(_spares)
    _spares.clear()


request_started.connect(_request_started, dispatch_uid="gpucloud.lib.db.spares")
request_finished.connect(_request_finished, dispatch_uid="gpucloud.lib.db.spares")
os.register_at_fork(after_in_child=_after_fork_in_child)


def spare_give(wrapper: Any) -> bool:
    """Keep `wrapper`'s connection as a spare instead of closing it, when it is closed while
    serving a request, healthy, idle (no transaction, nothing failed) and not past its age,
    and the process keeps fewer than DB_SPARE_CONNECTIONS. True: kept (the caller forgets it)."""
    from django.conf import settings

    raw = wrapper.connection
    if (
        not getattr(_serving, "on", False)
        or raw is None
        or raw.closed
        or raw.broken
        or wrapper.in_atomic_block
        or wrapper.errors_occurred
        or raw.autocommit != wrapper.settings_dict["AUTOCOMMIT"]
        or raw.info.transaction_status != psycopg.pq.TransactionStatus.IDLE
        or wrapper.close_at is not None and time.monotonic() >= wrapper.close_at
    ):
        return False
    raw._gpucloud_close_at = wrapper.close_at  # type: ignore[attr-defined]  # its age goes with it
    with _spares_lock:
        if len(_spares) >= settings.DB_SPARE_CONNECTIONS:
            return False
        _spares.append((wrapper.alias, raw))
    return True


def spare_take(wrapper: Any) -> psycopg.Connection | None:
    """A spare connection of `wrapper`'s database, or None; the ones past their age are closed.
    With CONN_HEALTH_CHECKS, one that fails the check is closed too (a new connection is healthy,
    a spare may have lost its server meanwhile)."""
    while True:
        with _spares_lock:
            i = next((i for i in range(len(_spares) - 1, -1, -1) if _spares[i][0] == wrapper.alias), None)
            if i is None:
                return None
            raw = _spares.pop(i)[1]
        close_at = getattr(raw, "_gpucloud_close_at", None)
        if (close_at is not None and time.monotonic() >= close_at) or raw.closed or raw.broken or (
            wrapper.settings_dict["CONN_HEALTH_CHECKS"] and not _usable(raw)
        ):
            _close_quietly(raw)
            continue
        return raw


def spares_close() -> None:
    """Close this process's spare connections (before a DROP DATABASE, or to let them go)."""
    with _spares_lock:
        spares = list(_spares)
        _spares.clear()
    for _, raw in spares:
        _close_quietly(raw)


def _usable(raw: psycopg.Connection) -> bool:
    try:
        raw.execute("SELECT 1")
    except psycopg.Error:
        return False
    return True


def _close_quietly(raw: psycopg.Connection) -> None:
    try:
        raw.close()
    except psycopg.Error:
        pass
