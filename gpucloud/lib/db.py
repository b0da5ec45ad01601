"""Database and Redis plumbing shared by every app: server-side binding, COPY text,
array literals, timestamps as epoch seconds, the shared Redis client, the benchmarks' own
database.

It lives at the bottom of the layers (docs/architecture.md) so that the scheduler's
bulk writes, the agents' heartbeat flush and the snapshot use one copy of each.
"""
from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any

import psycopg
import redis
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
        connection.creation.destroy_test_db(old_name, verbosity=0)
