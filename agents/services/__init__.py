"""Writes of the agent protocol's control-plane side, one module per concern; import from the
module (this package re-exports nothing, so each importer says which concern it uses):

    registration   bootstrap tokens, a host's registration (and its retry), its GPU inventory
    heartbeat      the slow path of a heartbeat: liveness, seq freshness, then the rest in order
    gpus           GPU samples and the health rule (a failing GPU fails its work), minute rollups
    containers     container reports -> workload transitions (scheduler.container's rule), in bulk
                   or one by one; the parts of multi-host jobs by the gang rule (agents.gangs)
    logs           log tails: a tenant's request, the agent's answer
    liveness       silent hosts go DOWN, work on long-DOWN hosts becomes LOST
    host_ops       the operators' actions: cordon, drain, uncordon, replace, a GPU back in service

How the work on a host moves, beyond its containers' reports (`scheduler.container`):

    host silent > HOST_DOWN_AFTER_S                      host DOWN (no new work)
    host DOWN > HOST_LOST_GRACE_S   any holding state    LOST, jobs requeued
    GPU fatal XID / new uncorrectable ECC / lost         GPU unhealthy (sticky); its work
                                SCHEDULED..RUNNING       FAILED "GPU <uuid> failed: ...", jobs
                                                         requeued if retries are left
    operator drains the host    job SCHEDULED..RUNNING   notice, then PREEMPTED -> PENDING
                                                         (no retry spent)

Workload states change only through `scheduler.services`; GPU booking counters are the
scheduler's and never written here.
"""
