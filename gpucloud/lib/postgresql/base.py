"""Django's PostgreSQL backend; a connection closed while serving a request is kept as a spare
for the process's next connect (`gpucloud.lib.db.spare_give` says when)."""
from __future__ import annotations

from typing import Any

from django.db.backends.postgresql import base
from psycopg import IsolationLevel

from gpucloud.lib.db import spare_give, spare_take


class DatabaseWrapper(base.DatabaseWrapper):
    def get_new_connection(self, conn_params: dict[str, Any]) -> Any:
        if not self.pool:  # Django's own pool, if configured, does this itself
            raw = spare_take(self)
            if raw is not None:
                # what Django's get_new_connection records beside the connection (the spare
                # was opened with the same OPTIONS, so it is set on the connection already)
                level = self.settings_dict["OPTIONS"].get("isolation_level")
                self.isolation_level = IsolationLevel.READ_COMMITTED if level is None else IsolationLevel(level)
                return raw
        return super().get_new_connection(conn_params)

    def connect(self) -> None:
        super().connect()
        # A spare keeps the deadline of its first opening: DB_CONN_MAX_AGE counts from there.
        raw = self.connection
        if raw is not None and hasattr(raw, "_gpucloud_close_at"):
            self.close_at = raw._gpucloud_close_at

    def _close(self) -> Any:
        if not self.pool and spare_give(self):
            return None
        return super()._close()
