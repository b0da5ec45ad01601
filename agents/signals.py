"""Signals for the apps built on the agents (volumes/), which the agents app must not import.

* ``volumes_reported(host, usage)``: a heartbeat measured the host's gpucloud volumes;
  ``usage`` maps each Docker volume name to its bytes (the whole set on the host).
* ``volumes_measured(measured)``: hosts whose volume report was the same as the last one
  applied (answered by the heartbeat fast path, written by its flush): ``measured`` maps
  each host id to (when, the Docker volume names it reported); only the measuring time is new.
* ``volumes_to_remove(host)``: asked when building a heartbeat answer; each receiver returns
  the names of volumes the host's agent should delete (purged by their owner's delete).
"""
from __future__ import annotations

from django.dispatch import Signal

volumes_reported = Signal()
volumes_measured = Signal()
volumes_to_remove = Signal()
# asked when building a heartbeat answer: each receiver returns the host's part in volume
# moves (a list of agents.protocol.VolumeMoveOrder)
volume_moves_for = Signal()


def removals(*, host, shared: dict | None = None) -> list[str]:
    """`shared`: one dict passed to both this and `move_orders` while building one answer, where
    receivers keep what they read for both (one query, not two)."""
    return sorted({name for _r, names in volumes_to_remove.send(sender=None, host=host, shared=shared)
                   for name in names or ()})


def move_orders(*, host, shared: dict | None = None) -> list:
    return [o for _r, orders in volume_moves_for.send(sender=None, host=host, shared=shared) for o in orders or ()]
