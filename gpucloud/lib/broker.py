"""The demo's embedded Celery broker: kombu's SQLAlchemy transport on a SQLite file.

`CELERY_BROKER_URL=sqlite:///var/broker.sqlite3` selects it (settings set
`CELERY_BROKER_TRANSPORT` to this module's `Transport`). It replaces kombu's filesystem
transport, whose reader can take a message file the writer has created but not yet
written (it renames the file away and reads zero bytes: `JSONDecodeError`, the worker
dies). A SQLite row is never seen half-written: a message is one INSERT in one transaction.

Four changes to kombu's SQLAlchemy channel, each for a demo that stays up for days:

- SQLite is opened in WAL mode with a busy timeout, so the web, the worker and beat writing
  at once wait for each other instead of failing with "database is locked".
- The tables are created under SQLite's write lock (kombu's check-then-create races when
  the demo's processes open a new broker file together: "table kombu_message already exists"),
  and a queue two processes declare at once is created once (kombu's lets IntegrityError out).
- A message taken by a worker is deleted (kombu only marks it invisible and keeps it for
  ever: a table growing by ~150 000 rows a day that every poll scans). Nothing is lost by
  this: an invisible row was never delivered again either.
- A failed publish raises (kombu rolls back and returns as if it had been sent). The error
  is one of the transport's connection errors, so Celery's publish retry takes it.
"""
from __future__ import annotations

from json import dumps, loads
from queue import Empty
from typing import Any

from kombu.transport import sqlalchemy as sqla
from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import sessionmaker

# How long a writer waits for SQLite's write lock before the statement fails.
BUSY_TIMEOUT_S = 30


def _on_connect(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")  # readers never wait for the writer
    cursor.execute("PRAGMA synchronous=NORMAL")  # safe with WAL; a power cut may lose the last ticks
    cursor.close()


class Channel(sqla.Channel):
    def _open(self) -> tuple[Engine, Any]:
        url = self.connection.client.hostname
        with sqla._MUTEX:
            if url not in self._engines:
                engine = create_engine(url, connect_args={"timeout": BUSY_TIMEOUT_S})
                event.listen(engine, "connect", _on_connect)
                # Under SQLite's write lock: the worker, beat and web open a new file at once,
                # and kombu's unguarded create_all fails in all but the first ("table exists").
                with engine.connect() as conn:
                    conn.exec_driver_sql("BEGIN IMMEDIATE")
                    sqla.metadata.create_all(conn)
                    conn.commit()
                self._engines[url] = engine, sessionmaker(bind=engine)
        return self._engines[url]

    def _get_or_create(self, queue: str) -> Any:
        model = self.queue_cls
        obj = self.session.query(model).filter(model.name == queue).first()
        if obj is None:
            self.session.add(model(queue))
            try:
                self.session.commit()
            except IntegrityError:  # another process declared it meanwhile (kombu lets this escape)
                self.session.rollback()
            obj = self.session.query(model).filter(model.name == queue).one()
        return obj

    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:
        obj = self._get_or_create(queue)
        self.session.add(self.message_cls(dumps(payload), obj))
        try:
            self.session.commit()
        except Exception:
            self.session.rollback()
            raise

    def _get(self, queue: str) -> Any:
        obj = self._get_or_create(queue)
        session = self.session
        model = self.message_cls
        # Peek without the write lock: an empty queue (most polls) costs one indexed read.
        if session.query(model.id).filter(model.queue_id == obj.id).limit(1).first() is None:
            session.commit()
            raise Empty()
        session.execute(text("BEGIN IMMEDIATE"))  # one taker at a time
        try:
            msg = session.query(model).filter(model.queue_id == obj.id).order_by(model.id).limit(1).first()
            if msg is None:
                raise Empty()
            payload = msg.payload
            session.delete(msg)
            session.commit()
        except BaseException:
            session.rollback()
            raise
        return loads(payload)


class Transport(sqla.Transport):
    Channel = Channel
    driver_name = "sqlite"
