"""When is a host lost? One pure predicate, no Django (AWX's `is_lost`).

A host is expected to heartbeat every `interval` seconds; it is lost once it has been
silent for more than `tolerance` intervals. The liveness task calls this with
`interval = AGENT_HEARTBEAT_INTERVAL_S` and `tolerance = HOST_DOWN_AFTER_S / interval`.
"""

from __future__ import annotations

from datetime import datetime


def is_lost(last_seen: datetime | None, now: datetime, interval: float, tolerance: float) -> bool:
    """True when nothing was heard since more than `interval * tolerance` seconds before `now`.

    A host never heard from (`last_seen` None) is lost. A `last_seen` in the future (a
    clock step on the control plane) is not: absence of evidence, not evidence of death.
    """
    if last_seen is None:
        return True
    return (now - last_seen).total_seconds() > interval * tolerance
