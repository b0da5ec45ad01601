"""Signals for the apps built on the scheduler (volumes/), which the scheduler must not import.

Each is sent inside the transaction of the write it describes, so a receiver's writes commit
or roll back with it, and an exception a receiver raises (a ``gpucloud.lib.errors`` error)
refuses the whole action.

* ``workload_launching(workload, spec)``: a workload was created by ``workload_launch`` and
  is about to be queued; ``spec.volumes`` carries the volumes asked for.
* ``workloads_placed(hosts)``: the scheduling cycle placed workloads; ``hosts`` maps each
  workload id (str) to the id (str) of the host its first node went to.
* ``workload_starting(workload)``: a stopped workload is about to go back to the queue
  (``POST …/start``): a receiver refuses it when what it needs (a volume) is in use elsewhere.
"""
from __future__ import annotations

from django.dispatch import Signal

workload_launching = Signal()
workloads_placed = Signal()
workload_starting = Signal()
