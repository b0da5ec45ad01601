"""Container logs: a tenant asks for a workload's log tail, the host's agent sends it with its
next heartbeat (and sends the last output of a container that exited unasked).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.utils import timezone

from agents import fastpath
from agents.models import ContainerLog, Host
from agents.protocol import ContainerLogTail
from agents.selectors import workload_attempt
from scheduler.choices import HOLDING
from scheduler.models import Workload


@dataclass(frozen=True)
class LogTail:
    text: str
    captured_at: datetime | None
    pending: bool  # a fresh tail was asked for and arrives with the agent's next heartbeat


def workload_logs_request(
    *, workload: Workload, tail: int, now: datetime | None = None
) -> LogTail:
    """Ask the agent running `workload` for the last `tail` lines of its container's log.

    Returns the latest stored tail (maybe none yet). Only work holding GPUs has a
    container to ask about; for other work the stored tail is all there is.
    """
    now = now or timezone.now()
    log, _ = ContainerLog.objects.get_or_create(workload=workload)
    where = workload_attempt(workload=workload) if workload.state in HOLDING else None
    # `pending` while nothing answered yet: no text at all, or the last request still unanswered.
    # Once a tail arrived (the agent clears the request it answers) the text is current, though
    # every call asks again for a fresher one.
    waiting = where is not None and (log.captured_at is None or log.requested_at is not None)
    if where is not None:
        host_id, attempt = where
        ContainerLog.objects.filter(pk=log.pk).update(
            host_id=host_id, attempt_id=attempt, requested_tail=tail, requested_at=now
        )
        fastpath.hosts_changed(host_ids=[host_id])  # the request rides on the next answer
        log.refresh_from_db()
    return LogTail(text=log.text, captured_at=log.captured_at, pending=waiting)


def container_logs_store(*, host: Host, tails: list[ContainerLogTail], now: datetime,
                         attempts: dict[str, Workload]) -> None:
    """Log tails from `host`: answers to log requests, and the last output of containers
    that exited, which the agent sends unasked with the exit (`attempts`: the work this
    host runs, by container instance id; a tail of anything else is not stored).

    Each clears the request it answers. An empty one (the container was removed
    meanwhile) keeps the tail stored before.
    """
    for t in tails:
        rows = ContainerLog.objects.filter(host=host, attempt_id=t.instance_id)
        if not t.text:
            rows.update(requested_at=None)
        elif not rows.update(text=t.text, captured_at=now, requested_at=None):
            w = attempts.get(t.instance_id)
            if w is not None:
                ContainerLog.objects.update_or_create(workload=w, defaults={
                    "host": host, "attempt_id": t.instance_id, "text": t.text, "captured_at": now,
                    "requested_at": None})
