"""Writes of the agent protocol's control-plane side: bootstrap tokens, registration,
heartbeats (GPU samples and container states -> lifecycle transitions), host liveness.

Workload states change only through `scheduler.services` (`workload_transition`,
`workload_requeue_or_end`); GPU booking counters are the scheduler's and never written
here. How a container's state moves its workload:

    observed container         workload                 becomes
    ------------------         --------                 -------
    created                    SCHEDULED                STARTING
    running                    SCHEDULED, STARTING      RUNNING
    exited 0, job              SCHEDULED..RUNNING       (RUNNING ->) SUCCEEDED
    exited N, job              SCHEDULED..RUNNING       (RUNNING ->) FAILED, requeued if retries
    exited N, instance         SCHEDULED..RUNNING       (RUNNING ->) FAILED "container exited ..."
    missing + error            SCHEDULED..RUNNING       FAILED "could not start: <error>"
    exited / missing / absent  STOPPING                 STOPPED
    host silent > HOST_DOWN_AFTER_S                     host DOWN (no new work)
    host DOWN > HOST_LOST_GRACE_S  any holding state    LOST, jobs requeued
    GPU fatal XID / new uncorrectable ECC / lost        GPU unhealthy (sticky); its work
                               SCHEDULED..RUNNING       FAILED "GPU <uuid> failed: ...", jobs
                                                        requeued if retries are left
    operator drains the host   job SCHEDULED..RUNNING   PREEMPTED -> PENDING (no retry spent)
    any report of a part of a multi-host job (nodes > 1): the gang rule, scheduler/gang.py

An exited container passes through RUNNING first, so billing and
the event log see that it started even when it ended between two heartbeats.
"""

from __future__ import annotations

import logging
import re
import secrets
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Final

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Avg, Count, F, Max, Min, Q
from django.db.models.functions import TruncMinute
from django.utils import timezone

from agents import fastpath
from agents.choices import AdminState, HostState
from agents.gangs import gang_report
from agents.liveness import is_lost
from agents.models import BootstrapToken, ContainerLog, Gpu, GpuSample, GpuSampleMinute, Host
from agents.protocol import (
    FATAL_XIDS,
    IDLE_BELOW,
    ContainerLogTail,
    GpuInfo,
    Heartbeat,
    ObservedContainer,
    RegisterRequest,
)
from agents.protocol import GpuSample as GpuSampleMsg
from agents.selectors import hash_token, host_allocations, host_attempts, workload_attempt
from gpucloud.catalogue.models import GpuModel, Region
from gpucloud.lib.db import model_columns, model_from_row, pg_cursor
from gpucloud.lib.errors import Conflict, InvalidInput, ServiceError
from gpucloud.tenancy.audit import audit_record
from scheduler.choices import HOLDING, TERMINAL, State, WorkloadKind
from scheduler.cycle import notice_served, policy_for
from scheduler.hooks import cycle_wanted, holding_changed
from scheduler.lifecycle import can_transition
from scheduler.models import Allocation, Workload
from scheduler.services import (
    workload_requeue_or_end,
    workload_stopped,
    workload_transition,
    workloads_transition,
)

logger = logging.getLogger(__name__)

BOOTSTRAP_PREFIX: Final = "gpb_"
HOST_TOKEN_PREFIX: Final = "gph_"
_SECRET_BYTES: Final = 32  # 256 bits
# Heartbeats at most this many behind the newest applied one are late duplicates; a seq
# further back can only be an agent that restarted (seq counts from 1 per agent start).
SEQ_REORDER_WINDOW: Final = 16


class TokenRefused(ServiceError):
    """A bootstrap or host token that is unknown, used, expired or for another host."""

    status = 401
    code = "authentication_failed"


# --- bootstrap tokens ---------------------------------------------------------------


def bootstrap_token_prepare(*, token: BootstrapToken) -> str:
    """Give an unsaved token its secret; returns the secret, which is never stored."""
    secret = BOOTSTRAP_PREFIX + secrets.token_urlsafe(_SECRET_BYTES)
    token.token_hash = hash_token(secret)
    token.prefix = secret[:12]
    return secret


@transaction.atomic
def bootstrap_token_create(
    *, region: Region, note: str = "", expires_at: datetime | None = None, created_by=None
) -> tuple[BootstrapToken, str]:
    """A new one-time token for a host to join `region`. Show the secret once."""
    token = BootstrapToken(region=region, note=note, expires_at=expires_at, created_by=created_by)
    secret = bootstrap_token_prepare(token=token)
    token.save()
    bootstrap_token_record(token=token)
    return token, secret


def bootstrap_token_record(*, token: BootstrapToken) -> None:
    audit_record(
        tenant=None,
        action="bootstrap_token.create",
        obj=token,
        data={"region": token.region.code, "prefix": token.prefix},
    )


# --- GPU models -----------------------------------------------------------------------

# Product names the drivers report -> catalogue codes, most specific first. Anything not
# listed falls back to the first word of the name that is a catalogue code.
DRIVER_NAMES: Final[dict[str, tuple[str, ...]]] = {
    "nvidia h100 80gb hbm3": ("H100",),
    "nvidia h100 pcie": ("H100-PCIE", "H100"),
    "nvidia h100 nvl": ("H100-NVL", "H100"),
    "nvidia h200": ("H200",),
    "nvidia h200 nvl": ("H200-NVL", "H200"),
    "nvidia a100-sxm4-80gb": ("A100",),
    "nvidia a100-sxm4-40gb": ("A100-40GB", "A100"),
    "nvidia a100 80gb pcie": ("A100-PCIE", "A100"),
    "nvidia a100-pcie-40gb": ("A100-PCIE-40GB", "A100-PCIE", "A100"),
    "nvidia l40s": ("L40S",),
    "amd instinct mi300x": ("MI300X",),
    "amd instinct mi300x oam": ("MI300X",),
}
_VENDOR_WORDS: Final = {"NVIDIA", "AMD", "INSTINCT", "TESLA", "GEFORCE", "RADEON", "QUADRO"}


def gpu_model_code(name: str, codes: Iterable[str]) -> str | None:
    """The catalogue code for a driver's product name (pure); None if none fits.

    `H100` or `h100` -> H100; `NVIDIA H100 80GB HBM3` -> H100; `AMD Instinct MI300X` -> MI300X.
    """
    by_upper = {c.upper(): c for c in codes}
    key = name.strip()
    if key.upper() in by_upper:
        return by_upper[key.upper()]
    for candidate in DRIVER_NAMES.get(" ".join(key.lower().split()), ()):
        if candidate.upper() in by_upper:
            return by_upper[candidate.upper()]
    for word in re.split(r"[\s\-_/]+", key.upper()):
        if word and word not in _VENDOR_WORDS and word in by_upper:
            return by_upper[word]
    return None


# --- registration -----------------------------------------------------------------------


def _trigger_cycle_on_commit(region_id: int) -> None:
    """New or returning capacity: ask the scheduler to look at the queue again (after commit)."""
    cycle_wanted(region_id)


def _resolve_models(gpus: list[GpuInfo]) -> dict[str, GpuModel]:
    catalogue = {m.code: m for m in GpuModel.objects.all()}
    out: dict[str, GpuModel] = {}
    problems: dict[str, list[str]] = {}
    indexes: dict[int, str] = {}
    for i, g in enumerate(gpus):
        code = gpu_model_code(g.model, catalogue)
        if code is None:
            problems[f"gpus[{i}].model"] = [f"No GPU model in the catalogue matches {g.model!r}."]
        else:
            out[g.uuid] = catalogue[code]
        if g.index in indexes:
            problems[f"gpus[{i}].index"] = [f"Index {g.index} is also GPU {indexes[g.index]}'s."]
        indexes[g.index] = g.uuid
    if problems:
        first = next(iter(problems.values()))[0]
        raise InvalidInput(first, fields=problems)
    return out


def _island(g: GpuInfo) -> int:
    # The scheduler treats GPUs with equal islands as linked; a GPU with no NVLink gets an
    # island of its own (negative, so it never equals a driver-reported one).
    return g.nvlink_island if g.nvlink_island is not None else -1 - g.index


def _sync_gpus(host: Host, gpus: list[GpuInfo], models: dict[str, GpuModel]) -> None:
    """Make the host's Gpu rows match the inventory, never touching booking counters.

    GPUs that vanished from the inventory are kept (their allocation history stays) but
    marked unhealthy and moved to indexes >= 10000, so they take no new work.
    """
    uuids = [g.uuid for g in gpus]
    elsewhere = Gpu.objects.filter(uuid__in=uuids).exclude(host=host)
    busy = elsewhere.filter(allocations__active=True).values_list("uuid", flat=True).first()
    if busy:
        raise Conflict(
            f"GPU {busy} is in use on another host.",
            code="gpu_in_use",
            fields={"gpus": [f"GPU {busy} is booked on another host."]},
        )
    # (host, index) is unique and checked row by row: first move every row of this host
    # out of the way (all current indexes are < 20000), then write the final ones.
    Gpu.objects.filter(host=host).update(index=F("index") + 20000)
    existing = {g.uuid: g for g in Gpu.objects.filter(uuid__in=uuids)}
    vanished = list(Gpu.objects.filter(host=host).exclude(uuid__in=uuids).order_by("index"))
    changed: list[Gpu] = []
    now = timezone.now()
    for n, row in enumerate(vanished):
        row.index = 10000 + n
        if row.healthy:
            row.healthy, row.unhealthy_reason, row.unhealthy_since = (
                False, "vanished from the host's inventory", now,
            )
        changed.append(row)
        logger.warning("gpu vanished from inventory host=%s gpu=%s", host.pk, row.uuid)
    new: list[Gpu] = []
    for g in gpus:
        values = {
            "host": host,
            "index": g.index,
            "gpu_model": models[g.uuid],
            "memory_mib": g.memory_mib,
            "pci_bus_id": g.pci_bus_id or "",
            "numa_node": g.numa_node or 0,
            "nvlink_island": _island(g),
            "mig_enabled": g.mig_mode is True,
        }
        row = existing.get(g.uuid)
        if row is None:
            new.append(Gpu(uuid=g.uuid, **values))
            continue
        for k, v in values.items():
            setattr(row, k, v)
        changed.append(row)
    if changed:
        Gpu.objects.bulk_update(
            changed,
            [
                "host",
                "index",
                "gpu_model",
                "memory_mib",
                "pci_bus_id",
                "numa_node",
                "nvlink_island",
                "mig_enabled",
                "healthy",
                "unhealthy_reason",
                "unhealthy_since",
            ],
        )
    Gpu.objects.bulk_create(new)


class HostExists(Conflict):
    """A registration names a host that exists, without proof that it is that machine."""

    code = "host_exists"
    host_id: str = ""  # for the audit record; never in the answer


def host_register(*, req: RegisterRequest, now: datetime | None = None) -> tuple[Host, str]:
    """Consume a bootstrap token; create or refresh the host and its GPUs; a new host token.

    A bootstrap token admits one host: a new name creates it. A name that exists is never
    handed to a token alone (anyone holding an unused token of the region could otherwise
    take the host over, its tenants' containers and `env` secrets included). Re-registering
    an existing host needs proof that it is that machine: its current host token in
    `previous_host_token`, or the operator's "Replace host" action (`host_replace_allow`),
    which lets one registration take it over. Then the token rotates (the old one is
    refused from now on) and the inventory is refreshed; bookings and work stay.
    A refusal (409 `host_exists`) changes nothing and is audited.
    """
    try:
        return _host_register(req=req, now=now or timezone.now())
    except HostExists as e:
        # Recorded after the rollback of the refused registration, in a transaction of its own.
        audit_record(
            tenant=None,
            action="host.register_refused",
            object_type="host",
            object_id=e.host_id,
            object_repr=req.hostname[:200],
            data={"bootstrap": req.bootstrap_token[:12], "reason": e.message},
        )
        logger.warning(
            "registration refused host=%s name=%s bootstrap=%s: %s",
            e.host_id, req.hostname, req.bootstrap_token[:12], e.message,
        )
        raise


def _host_exists(host: Host, message: str) -> HostExists:
    e = HostExists(message, fields={"hostname": [message]})
    e.host_id = str(host.pk)
    return e


@transaction.atomic
def _host_register(*, req: RegisterRequest, now: datetime) -> tuple[Host, str]:
    boot = (
        BootstrapToken.objects.select_for_update()
        .select_related("region")
        .filter(token_hash=hash_token(req.bootstrap_token))
        .first()
    )
    if boot is not None and boot.used_at is not None and _is_retry(boot, req, now):
        return _register_retry(boot=boot, req=req, now=now)
    if boot is None or boot.used_at is not None or (boot.expires_at and boot.expires_at <= now):
        logger.warning(
            "registration refused host=%s token=%s",
            req.hostname,
            "unknown"
            if boot is None
            else f"{boot.prefix} used={boot.used_at} expires={boot.expires_at}",
        )
        raise TokenRefused("The bootstrap token is unknown, already used or expired.")
    models = _resolve_models(req.gpus)
    token = HOST_TOKEN_PREFIX + secrets.token_urlsafe(_SECRET_BYTES)
    # Lock order as in the scheduler's apply (GPU rows, then the host row), so a placement
    # on this host at the same moment cannot deadlock with us.
    host = Host.objects.select_related("region").filter(name=req.hostname).first()
    if host is None:
        try:
            with transaction.atomic():
                host = Host.objects.create(
                    name=req.hostname,
                    region=boot.region,
                    state=HostState.READY,
                    vcpus=req.cpu_count,
                    memory_mib=req.memory_mib,
                    token_hash=hash_token(token),
                    agent_version=req.agent_version[:50],
                    last_heartbeat_at=now,
                    created_at=now,
                )
        except IntegrityError:
            raise Conflict(f"Host {req.hostname!r} is registering concurrently; retry.") from None
        _sync_gpus(host, req.gpus, models)
        action = "host.register"
        proof = ""
    else:
        if host.region_id != boot.region_id:
            raise Conflict(
                f"Host {host.name!r} is registered in {host.region}; "
                f"this token is for {boot.region}.",
                code="host_in_other_region",
                fields={"hostname": ["Registered in another region."]},
            )
        # The proof, compared on hashes in constant time (the hash of a 256-bit secret).
        proven = bool(req.previous_host_token) and bool(host.token_hash) and secrets.compare_digest(
            hash_token(req.previous_host_token or ""), host.token_hash
        )
        if proven:
            proof, action = "previous_host_token", "host.reregister"
            guard = Q(token_hash=host.token_hash)
        elif host.replace_allowed_at is not None:
            proof, action = "replace_allowed", "host.replace"
            guard = Q(replace_allowed_at=host.replace_allowed_at)
        else:
            raise _host_exists(
                host,
                f"Host {host.name!r} is already registered. A re-installed agent proves it is "
                "that machine with its previous host token; otherwise an operator must allow "
                "the replacement (admin: Hosts → Replace host).",
            )
        _sync_gpus(host, req.gpus, models)
        # Guarded: capacity may not drop below what running work has booked, and the proof
        # must still hold (another registration may have taken the host meanwhile).
        updated = Host.objects.filter(
            guard, pk=host.pk, used_vcpus__lte=req.cpu_count, used_memory_mib__lte=req.memory_mib
        ).update(
            vcpus=req.cpu_count,
            memory_mib=req.memory_mib,
            token_hash=hash_token(token),  # the old token is refused from now on
            replace_allowed_at=None,  # one replacement per operator's action
            agent_version=req.agent_version[:50],
            last_heartbeat_at=now,
            last_seq=0,  # a new agent process: its seq starts again at 1
            # A DOWN host is back as what the operator wants (READY, CORDONED or DRAINING).
            state=F("admin_state"),
            down_since=None,
        )
        if not updated:
            current = Host.objects.get(pk=host.pk)
            if current.used_vcpus > req.cpu_count or current.used_memory_mib > req.memory_mib:
                raise Conflict(
                    f"Host {host.name!r} reports less CPU or memory than its running work has booked.",
                    code="host_shrunk",
                )
            raise _host_exists(host, f"Host {host.name!r} was re-registered meanwhile.")
        host.refresh_from_db()
    BootstrapToken.objects.filter(pk=boot.pk, used_at__isnull=True).update(
        used_at=now,
        host=host,
        # kept hashed (a 256-bit random secret), so a retry of this very registration can be
        # recognised; never the nonce itself
        nonce_hash=hash_token(req.registration_nonce) if req.registration_nonce else "",
    )
    fastpath.hosts_changed(host_ids=[host.pk])  # the old token, inventory, seq: all re-read
    audit_record(
        tenant=None,
        action=action,
        obj=host,
        data={
            "region": boot.region.code,
            "gpus": len(req.gpus),
            "bootstrap": boot.prefix,
            **({"proof": proof} if proof else {}),
        },
    )
    _trigger_cycle_on_commit(host.region_id)
    logger.info(
        "%s host=%s name=%s region=%s gpus=%d",
        action,
        host.pk,
        host.name,
        boot.region.code,
        len(req.gpus),
    )
    return host, token


def _is_retry(boot: BootstrapToken, req: RegisterRequest, now: datetime) -> bool:
    """Is this the repeat of the registration that consumed `boot` (its answer lost)?

    The same bootstrap token, the same registration nonce (compared on hashes in constant
    time), the same host name, within REGISTER_RETRY_WINDOW_S of the first, and the host
    is still there. Anything else is refused as a used token.
    """
    if not (req.registration_nonce and boot.nonce_hash and boot.host_id and boot.used_at):
        return False
    if now - boot.used_at > timedelta(seconds=settings.REGISTER_RETRY_WINDOW_S):
        return False
    if not secrets.compare_digest(hash_token(req.registration_nonce), boot.nonce_hash):
        return False
    return bool(Host.objects.filter(pk=boot.host_id, name=req.hostname, region_id=boot.region_id).exists())


def _register_retry(*, boot: BootstrapToken, req: RegisterRequest, now: datetime) -> tuple[Host, str]:
    """The repeat of a registration whose answer was lost: the same host, a fresh host token
    (the one in the lost answer is refused from now on), no new row. Audited. Runs in the
    caller's transaction, with `boot` locked, so two repeats at once are one after the other.
    The inventory stays as the first attempt stored it; the agent's heartbeats keep it fresh."""
    token = HOST_TOKEN_PREFIX + secrets.token_urlsafe(_SECRET_BYTES)
    Host.objects.filter(pk=boot.host_id).update(
        token_hash=hash_token(token),
        agent_version=req.agent_version[:50],
        last_heartbeat_at=now,
        last_seq=0,  # the repeat may come from a restarted agent: its seq starts again at 1
        state=F("admin_state"),  # gone DOWN while the agent retried: back as the operator wants
        down_since=None,
    )
    host = Host.objects.select_related("region").get(pk=boot.host_id)
    fastpath.hosts_changed(host_ids=[host.pk])  # the revoked token: re-read
    audit_record(
        tenant=None,
        action="host.register_retry",
        obj=host,
        data={
            "region": boot.region.code,
            "bootstrap": boot.prefix,
            "first_at": boot.used_at.isoformat() if boot.used_at else None,
        },
    )
    logger.info(
        "host.register_retry host=%s name=%s region=%s", host.pk, host.name, boot.region.code
    )
    return host, token


def host_replace_allow(*, host: Host, now: datetime | None = None) -> Host:
    """The operator's "Replace host": the next registration of `host`'s name with a valid
    bootstrap token of its region takes it over (a re-installed machine that lost its
    state dir). Its current agent keeps working until then; the takeover revokes its token.
    Audited with the current actor."""
    now = now or timezone.now()
    with transaction.atomic():
        updated = Host.objects.filter(pk=host.pk).update(replace_allowed_at=now)
        if not updated:
            raise Conflict(f"Host {host.name!r} no longer exists.")
        audit_record(tenant=None, action="host.replace_allow", obj=host, data={"name": host.name})
    host.replace_allowed_at = now
    logger.info("host replace allowed host=%s name=%s", host.pk, host.name)
    return host


# --- heartbeats ---------------------------------------------------------------------


@dataclass
class HeartbeatOutcome:
    applied: bool  # False: a late, reordered heartbeat; only liveness was taken from it
    transitions: list[tuple[str, str]] = field(default_factory=list)  # (workload id, new state)
    # The host's active allocations as read after the last write of this heartbeat (None:
    # something moved since; read them again for the answer).
    allocations: list | None = None
    # The token hash on the host row as locked here (the fast path caches a token only
    # when it was still the host's after the cache version was read).
    token_hash: str = ""
    unknown_gpus: bool = False  # a sample named a GPU this host does not have


def _host_for_update(pk) -> Host:
    """`Host.objects.select_for_update().get(pk=pk)`; in written SQL on PostgreSQL, where every
    heartbeat that changes something takes it and building the ORM's query cost more CPU than
    running it."""
    if connection.vendor != "postgresql":
        return Host.objects.select_for_update().get(pk=pk)
    with connection.cursor() as cur:
        cur.execute(f"SELECT {model_columns(Host, 'h')} FROM {Host._meta.db_table} h WHERE h.id = %s FOR UPDATE",
                    [pk])
        row = cur.fetchone()
    if row is None:
        raise Host.DoesNotExist
    return model_from_row(Host, row)[0]


def _host_save(host: Host, fields: list[str]) -> None:
    """`host.save(update_fields=fields)`, in written SQL on PostgreSQL (as `_host_for_update`)."""
    if connection.vendor != "postgresql":
        host.save(update_fields=fields)
        return
    cols = [Host._meta.get_field(f) for f in fields]
    with connection.cursor() as cur:
        cur.execute(f"UPDATE {Host._meta.db_table} SET {', '.join(f'{c.column} = %s' for c in cols)} WHERE id = %s",
                    [*(c.get_db_prep_save(getattr(host, c.attname), connection) for c in cols), host.pk])


def _async_commit() -> None:
    """Let this transaction commit without waiting for the WAL flush (PostgreSQL).

    For heartbeat telemetry only (liveness time, samples): a crash may lose the last
    moment of them, which the next heartbeat rewrites, and a flush per heartbeat was the
    largest cost of the path. Lifecycle transitions commit in their own, synchronous,
    transactions; a later synchronous commit also makes every earlier one durable.
    """
    if connection.vendor == "postgresql":
        with connection.cursor() as cur:
            cur.execute("SET LOCAL synchronous_commit TO OFF")


def seq_is_fresh(seq: int, last_seq: int) -> bool:
    """Apply heartbeat `seq` after `last_seq`? (pure)

    Newer: yes. A 1, or a seq far behind: the agent restarted and counts again from 1,
    yes. Slightly behind or equal: a late or repeated request, no.
    """
    return seq > last_seq or seq == 1 or seq < last_seq - SEQ_REORDER_WINDOW


def gpu_fault(sample: GpuSampleMsg, ecc_before: int | None) -> str | None:
    """Why this sample takes its GPU out of service, or None (pure).

    A lost GPU (the agent says unhealthy), a fatal XID (agents.protocol.FATAL_XIDS: the
    GPU needs a reset; application XIDs such as 13 or 43 are the program's fault), or an
    uncorrectable ECC count above the last one seen (counts are volatile: they reset with
    the driver, which is also what repairs the GPU).
    """
    fatal = [x for x in sample.xid_events if x in FATAL_XIDS]
    if fatal:
        return f"XID {fatal[-1]}" + (f" ({sample.error})" if sample.error else "")
    if sample.ecc_uncorrected is not None and sample.ecc_uncorrected > (ecc_before or 0):
        return f"uncorrectable ECC errors: {sample.ecc_uncorrected}"
    if not sample.healthy:
        return sample.error or "reported unhealthy by the agent"
    return None


def _apply_samples(
    host: Host, samples: list[GpuSampleMsg], now: datetime, outcome: HeartbeatOutcome | None = None
) -> list[Gpu]:
    """Store the samples (one INSERT), update each GPU's last measurement (one UPDATE).

    Returns the GPUs that became unhealthy now; their work is failed by the caller.
    """
    if not samples:
        return []
    rows = {g.uuid: g for g in _host_gpus(host)}
    changed, failed, history = [], [], []
    for s in samples:
        g = rows.get(s.uuid)
        if g is None:
            logger.warning("sample of an unknown gpu host=%s gpu=%s", host.pk, s.uuid)
            if outcome is not None:
                outcome.unknown_gpus = True
            continue
        g.sampled_at = now
        if s.gpu_util is not None:
            g.utilisation = min(1.0, max(0.0, s.gpu_util / 100))
            g.idle_since = (g.idle_since or now) if g.utilisation < IDLE_BELOW else None
        if s.mem_used_mib is not None:
            g.memory_used_mib = max(0, s.mem_used_mib)
        if s.temperature_c is not None:
            g.temperature_c = s.temperature_c
        if s.power_w is not None:
            g.power_w = s.power_w
        fault = gpu_fault(s, g.ecc_uncorrected)
        if s.ecc_uncorrected is not None:
            g.ecc_uncorrected = max(0, s.ecc_uncorrected)
        # Health is sticky: a sample can take a GPU out, only an operator puts it back.
        if fault and g.healthy:
            g.healthy, g.unhealthy_reason, g.unhealthy_since = False, fault[:300], now
            failed.append(g)
            logger.warning("gpu unhealthy host=%s gpu=%s reason=%s", host.pk, s.uuid, fault)
        changed.append(g)
        history.append(
            GpuSample(
                gpu_id=g.uuid,
                time=now,
                gpu_util=s.gpu_util,
                mem_util=s.mem_util,
                mem_used_mib=None if s.mem_used_mib is None else max(0, s.mem_used_mib),
                temperature_c=s.temperature_c,
                power_w=s.power_w,
            )
        )
    _write_measurements(changed)
    _insert_samples(history)
    return failed


def _host_gpus(host: Host) -> list[Gpu]:
    """`Gpu.objects.filter(host=host)`, in written SQL on PostgreSQL: every heartbeat that
    changes something reads them, and building the ORM's query cost more than running it."""
    if connection.vendor != "postgresql":
        return list(Gpu.objects.filter(host=host))
    with connection.cursor() as cur:
        cur.execute(f"SELECT {model_columns(Gpu, 'g')} FROM {Gpu._meta.db_table} g WHERE g.host_id = %s",
                    [host.pk])
        return [model_from_row(Gpu, row)[0] for row in cur.fetchall()]


def _insert_samples(history: list[GpuSample]) -> None:
    """The samples in one INSERT from arrays on PostgreSQL (bulk_create built a row of
    placeholders per sample)."""
    if not history:
        return
    if connection.vendor != "postgresql":
        GpuSample.objects.bulk_create(history)
        return
    cols = ("gpu_id", "time", "gpu_util", "mem_util", "mem_used_mib", "temperature_c", "power_w")
    types = ("text", "timestamptz", "float8", "float8", "int8", "float8", "float8")
    with connection.cursor() as cur:
        cur.execute(
            f"INSERT INTO {connection.ops.quote_name(GpuSample._meta.db_table)} ({', '.join(cols)}) "
            f"SELECT * FROM unnest({', '.join(f'%s::{t}[]' for t in types)})",
            [[_as(t, getattr(h, c)) for h in history] for c, t in zip(cols, types, strict=True)],
        )


def _as(pg_type: str, v):
    """One array element as its column's type (an agent may send 7 or 7.0 for a float)."""
    if v is None or pg_type in ("text", "timestamptz"):
        return v
    return float(v) if pg_type == "float8" else int(v)


_MEASURED: Final = (
    # column, PostgreSQL array type
    ("healthy", "bool"),
    ("unhealthy_reason", "text"),
    ("unhealthy_since", "timestamptz"),
    ("ecc_uncorrected", "int8"),
    ("sampled_at", "timestamptz"),
    ("utilisation", "float8"),
    ("idle_since", "timestamptz"),
    ("memory_used_mib", "int8"),
    ("temperature_c", "float8"),
    ("power_w", "float8"),
)


def _write_measurements(gpus: list[Gpu]) -> None:
    """Write only the measured fields of `gpus` (the booking counters may change under us:
    they are the scheduler's). On PostgreSQL one `UPDATE ... FROM unnest(...)`: Django's
    bulk_update builds a CASE expression per row and field, which was most of a heartbeat's
    time (see docs/benchmarks.md)."""
    if not gpus:
        return
    if connection.vendor != "postgresql":
        Gpu.objects.bulk_update(gpus, [f for f, _ in _MEASURED])
        return
    sets = ", ".join(f"{f} = v.{f}" for f, _ in _MEASURED)
    arrays = ", ".join(f"%s::{t}[]" for _, t in _MEASURED)
    names = ", ".join(f for f, _ in _MEASURED)
    with connection.cursor() as cur:
        cur.execute(
            f"UPDATE {Gpu._meta.db_table} AS g SET {sets} "
            f"FROM unnest(%s::text[], {arrays}) AS v(uuid, {names}) WHERE g.uuid = v.uuid",
            [[g.uuid for g in gpus], *([getattr(g, f) for g in gpus] for f, _ in _MEASURED)],
        )


def _fail_work_on(gpus: list[Gpu], outcome: HeartbeatOutcome) -> None:
    """Fail the work holding a GPU that just became unhealthy (jobs retry if they may)."""
    reasons = {g.uuid: f"GPU {g.uuid} failed: {g.unhealthy_reason}" for g in gpus}
    victims = (
        Allocation.objects.filter(
            gpu__in=list(reasons),
            active=True,
            workload__state__in=(State.SCHEDULED, State.STARTING, State.RUNNING),
        )
        .select_related("workload")
        .order_by("workload_id", "id")
    )
    seen = set()
    for a in victims:
        w = a.workload
        if w.pk in seen:
            continue
        seen.add(w.pk)
        old = w.state
        workload_requeue_or_end(workload=w, ended=State.FAILED, reason=reasons[a.gpu_id])
        if w.state != old:
            outcome.transitions.append((str(w.pk), State.FAILED))
            logger.warning("workload failed with its gpu workload=%s gpu=%s", w.pk, a.gpu_id)


def _store_logs(host: Host, tails: list[ContainerLogTail], now: datetime,
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


class _Mover:
    """Applies transitions for one heartbeat; each is a guarded update in its own savepoint."""

    def __init__(self, host: Host, now: datetime, outcome: HeartbeatOutcome) -> None:
        self.host, self.now, self.outcome = host, now, outcome

    def to(self, w: Workload, state: str, reason: str, **extra) -> bool:
        if not can_transition(w.state, state):
            return False
        moved = workload_transition(workload=w, to=state, reason=reason, now=self.now, **extra)
        if moved:
            self.outcome.transitions.append((str(w.pk), state))
        return moved

    def end(self, w: Workload, reason: str, exit_code: int | None = None) -> None:
        """FAILED, requeued when a job has retries left (scheduler.services decides)."""
        if not can_transition(w.state, State.FAILED):
            return
        old = w.state
        with transaction.atomic():
            if exit_code is not None:
                # Not a state: the exit code is a fact reported alongside it.
                Workload.objects.filter(pk=w.pk, state=old).update(exit_code=exit_code)
            workload_requeue_or_end(workload=w, ended=State.FAILED, reason=reason)
        if w.state != old:
            self.outcome.transitions.append((str(w.pk), State.FAILED))

    def preempted(self, w: Workload, exit_code: int | None) -> None:
        """A job under a preemption notice exited (the agent stopped it after its checkpoint
        grace, or it saved and exited): PREEMPTED and requeued, as when the notice runs out,
        without spending a retry."""
        old = w.state
        with transaction.atomic():
            if exit_code is not None:
                Workload.objects.filter(pk=w.pk, state=old).update(exit_code=exit_code)
            workload_requeue_or_end(workload=w, ended=State.PREEMPTED, reason=notice_served(w.reason))
        if w.state != old:
            self.outcome.transitions.append((str(w.pk), State.PREEMPTED))

    def stopped(self, w: Workload, reason: str, **extra) -> None:
        """A STOPPING workload's container is gone; scheduler.services says what it ends as."""
        if workload_stopped(workload=w, reason=reason, now=self.now, **extra):
            self.outcome.transitions.append((str(w.pk), w.state))

    def ran(self, w: Workload) -> None:
        """An exited container did run: record RUNNING first if no heartbeat saw it running."""
        if w.state in (State.SCHEDULED, State.STARTING):
            self.to(w, State.RUNNING, "container running")

    def part(self, w: Workload, iid: str, state: str, exit_code: int | None = None, error: str = "") -> None:
        """A report about one part of a multi-host job: the gang rule decides (agents.gangs)."""
        self.outcome.transitions += gang_report(host=self.host, workload=w, attempt=iid, state=state,
                                                exit_code=exit_code, error=error or "", now=self.now)

    def observe(self, w: Workload, o: ObservedContainer) -> None:
        if w.nodes > 1:
            if w.state in (State.SCHEDULED, State.STARTING, State.RUNNING, State.STOPPING):
                self.part(w, o.instance_id, o.state, o.exit_code, o.error or "")
            return
        if w.state == State.STOPPING:
            if o.state in ("exited", "missing"):
                self.stopped(w, "container stopped", exit_code=o.exit_code)
            return
        if w.state not in (State.SCHEDULED, State.STARTING, State.RUNNING):
            return
        if o.state == "created":
            self.to(w, State.STARTING, "container created")
        elif o.state == "running":
            self.to(w, State.RUNNING, "container running")
        elif o.state == "missing":
            if o.error:
                self.end(w, f"could not start: {o.error}")
        elif o.state == "exited":
            self.ran(w)
            code = o.exit_code
            if w.kind == WorkloadKind.JOB and code == 0:
                self.to(w, State.SUCCEEDED, "exited with code 0", exit_code=0)
            elif w.kind == WorkloadKind.JOB and w.stop_by is not None:
                self.preempted(w, code)
            else:
                self.end(w, f"container exited with code {code}", exit_code=code)


def _parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        t = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo is not None else None


def _observed_times(containers: list[ObservedContainer], attempts: dict[str, Workload],
                    outcome: HeartbeatOutcome, now: datetime) -> None:
    """Run time as the agent saw it: a workload that started or ended in this heartbeat gets
    the container's own start and finish (a job that ran 20 s shows 20 s, not the span
    between two heartbeats). Trusted only between its queueing (or start) and now: a host
    clock off by more keeps the control plane's times.

    In bulk, whatever the number of containers: one read of the moved workloads, and one
    guarded UPDATE per set of columns written (it was a read and an update per workload)."""
    terminal = {str(s) for s in TERMINAL}
    moved: dict[str, set[str]] = defaultdict(set)
    for wid, state in outcome.transitions:
        moved[wid].add(str(state))
    seen = {}
    for o in containers:
        w = attempts.get(o.instance_id)
        if w is not None and w.nodes == 1 and str(w.pk) in moved:
            seen[w.pk] = o
    if not seen:
        return
    rows = Workload.objects.filter(pk__in=list(seen)).values("pk", "state", "queued_at", "started_at", "ended_at")
    updates: dict[tuple[str, ...], list[tuple]] = defaultdict(list)
    for row in rows:
        o, states = seen[row["pk"]], moved[str(row["pk"])]
        fields: dict[str, datetime] = {}
        started, finished = _parse_time(o.started_at), _parse_time(o.finished_at)
        floor = row["queued_at"]
        if (str(State.RUNNING) in states and row["started_at"] is not None and started is not None
                and (floor is None or started >= floor) and started <= now):
            fields["started_at"] = started
        begun = fields.get("started_at", row["started_at"])
        if (str(row["state"]) in terminal and states & terminal and row["ended_at"] is not None
                and finished is not None and begun is not None and begun <= finished <= now):
            fields["ended_at"] = finished
        if fields:
            cols = tuple(sorted(fields))
            updates[cols].append((row["pk"], row["state"], *(fields[c] for c in cols)))
    for cols, values in updates.items():
        _set_times(cols, values)


def _set_times(cols: tuple[str, ...], values: list[tuple]) -> None:
    """`cols` of each (workload id, state it was read in, *values), guarded on that state."""
    if connection.vendor != "postgresql":
        for pk, state, *times in values:
            Workload.objects.filter(pk=pk, state=state).update(**dict(zip(cols, times, strict=True)))
        return
    sets = ", ".join(f"{c} = v.{c}" for c in cols)
    arrays = ", ".join("%s::timestamptz[]" for _ in cols)
    with pg_cursor() as cur:
        cur.execute(
            f"UPDATE {Workload._meta.db_table} AS w SET {sets} "
            f"FROM unnest(%s::uuid[], %s::text[], {arrays}) AS v(id, state, {', '.join(cols)}) "
            "WHERE w.id = v.id AND w.state = v.state",
            [[v[0] for v in values], [str(v[1]) for v in values],
             *([v[2 + i] for v in values] for i in range(len(cols)))],
        )


def _bulk_moves(host: Host, w: Workload, o: ObservedContainer, groups: dict) -> bool:
    """Put the common transitions (a container seen running; a job that exited 0) in `groups`,
    to apply many at once (`_apply_bulk`); False for the rest, which `_Mover` handles one by
    one. Each group is what `_Mover.observe` would do, step for step. Not the parts of a gang:
    the gang rule judges each of those (agents.gangs)."""
    if w.nodes > 1:
        return False
    if w.state not in (State.SCHEDULED, State.STARTING, State.RUNNING):
        return False
    if o.state == "running" and w.state != State.RUNNING:
        groups[(w.state, State.RUNNING, "container running")].append(w)
        return True
    if o.state == "exited" and w.kind == WorkloadKind.JOB and o.exit_code == 0:
        if w.state != State.RUNNING:  # it ran between two heartbeats: RUNNING first
            groups[(w.state, State.RUNNING, "container running")].append(w)
        groups[(State.RUNNING, State.SUCCEEDED, "exited with code 0")].append(w)
        return True
    return False


def _apply_bulk(host: Host, groups: dict, now: datetime, outcome: HeartbeatOutcome) -> None:
    """The grouped transitions: per group one guarded UPDATE, one INSERT of events, one
    release of allocations (scheduler.services.workloads_transition), RUNNING before the ends."""
    order = sorted(groups, key=lambda k: k[1] != State.RUNNING)
    freed = False
    for old, to, reason in order:
        with transaction.atomic():
            moved = set(workloads_transition(ids=[w.pk for w in groups[(old, to, reason)]], old=old,
                                             to=to, reason=reason, now=now))
            if to == State.SUCCEEDED and moved:
                # Not a state: the exit code is a fact reported alongside it.
                Workload.objects.filter(pk__in=list(moved)).update(exit_code=0)
                freed = True
        for w in groups[(old, to, reason)]:
            if w.pk in moved:
                w.state = to
                outcome.transitions.append((str(w.pk), to))
    if freed:
        _trigger_cycle_on_commit(host.region_id)  # GPUs are free


def host_heartbeat(
    *, host: Host, hb: Heartbeat, now: datetime | None = None, fresh: bool | None = None,
    bulk: bool = True,
) -> HeartbeatOutcome:
    """Record a heartbeat of `host` (already authenticated): liveness, samples, container states.

    The desired set is read afterwards (`selectors.host_desired_containers`), so it
    reflects the transitions made here. `fresh`: whether to apply it, when the caller
    already decided that from the seq (the fast path claims seqs in Redis, see
    agents/fastpath.py); None: decided here from `Host.last_seq`.
    """
    if hb.host_id != str(host.pk):
        raise TokenRefused("This host token belongs to another host.")
    now = now or timezone.now()
    # Three short steps, not one long transaction: holding the host row while writing its
    # GPU rows would take locks in the opposite order to the scheduler's apply (GPUs, then
    # host) and could deadlock with a placement on this host.
    with transaction.atomic():
        _async_commit()
        # Heartbeats of one host decide their order one at a time; the liveness task's
        # DOWN update waits for this too.
        locked = _host_for_update(host.pk)
        applied = seq_is_fresh(hb.seq, locked.last_seq) if fresh is None else fresh
        outcome = HeartbeatOutcome(applied=applied, token_hash=locked.token_hash)
        fields = ["last_heartbeat_at", "agent_version"]
        locked.last_heartbeat_at = max(now, locked.last_heartbeat_at or now)
        locked.agent_version = (hb.agent_version or locked.agent_version)[:50]
        if locked.state == HostState.DOWN:
            # Back as what the operator wants: a drain or cordon survives an outage.
            locked.state, locked.down_since = locked.admin_state, None
            fields += ["state", "down_since"]
            logger.info("host back host=%s name=%s", locked.pk, locked.name)
            _trigger_cycle_on_commit(locked.region_id)
        if outcome.applied:
            locked.last_seq = hb.seq
            fields.append("last_seq")
        _host_save(locked, fields)
    if not outcome.applied:
        logger.info(
            "late heartbeat ignored host=%s seq=%d last=%d", host.pk, hb.seq, locked.last_seq
        )
        return outcome
    with transaction.atomic():
        _async_commit()
        failed_gpus = _apply_samples(locked, hb.gpus, now, outcome)
    if failed_gpus:
        _fail_work_on(failed_gpus, outcome)
    if hb.volumes is not None:
        from agents.signals import volumes_reported

        with transaction.atomic():
            volumes_reported.send(sender=Host, host=locked, usage={v.volume: v.used_bytes for v in hb.volumes})
    if hb.containers is None and not hb.logs:
        return outcome  # the agent could not list its runtime: infer nothing
    # What this host runs, by container instance id (before this heartbeat's exits free it)
    allocations = host_allocations(host=locked)
    attempts = host_attempts(host=locked, allocations=allocations)
    if hb.logs:
        _store_logs(locked, hb.logs, now, attempts)
    if hb.containers is None:
        return outcome  # the agent could not list its runtime: infer nothing
    # The common transitions in bulk (`bulk`, the default; False: one by one, as before);
    # every other one is its own guarded update and transaction (scheduler.services).
    mover = _Mover(locked, now, outcome)
    reported = set()
    groups: dict[tuple[str, str, str], list[Workload]] = defaultdict(list)
    for o in hb.containers:
        reported.add(o.instance_id)
        w = attempts.get(o.instance_id)
        if w is None:
            continue  # an earlier attempt, or work that is no longer here: the agent stops it
        if not (bulk and _bulk_moves(locked, w, o, groups)):
            mover.observe(w, o)
    if groups:
        _apply_bulk(locked, groups, now, outcome)
    for iid, w in attempts.items():
        if iid not in reported and w.state == State.STOPPING:
            if w.nodes > 1:
                mover.part(w, iid, "gone")
            else:
                mover.stopped(w, "container gone")
    if outcome.transitions:
        _observed_times(hb.containers, attempts, outcome, now)
        logger.info("heartbeat host=%s seq=%d transitions=%s", host.pk, hb.seq, outcome.transitions)
    elif not failed_gpus:
        outcome.allocations = allocations  # nothing moved: the answer can reuse them
    return outcome


# --- liveness -------------------------------------------------------------------------


@dataclass
class LivenessOutcome:
    down: list[str] = field(default_factory=list)  # host ids marked DOWN now
    lost: list[str] = field(default_factory=list)  # workload ids moved to LOST now


def hosts_mark_down(*, now: datetime | None = None) -> list[str]:
    """Hosts silent for more than HOST_DOWN_AFTER_S go DOWN: they take no new work."""
    now = now or timezone.now()
    # Heartbeats answered by the fast path are in Redis until flushed: write them first,
    # so no host is judged on a liveness time older than what it told us.
    fastpath.heartbeats_flush()
    interval = float(settings.AGENT_HEARTBEAT_INTERVAL_S)
    tolerance = settings.HOST_DOWN_AFTER_S / interval
    down = []
    for pk, name, seen in Host.objects.exclude(state=HostState.DOWN).values_list(
        "pk", "name", "last_heartbeat_at"
    ):
        if not is_lost(seen, now, interval, tolerance):
            continue
        # Guarded on the value we read: a heartbeat that landed meanwhile wins.
        if (
            Host.objects.filter(pk=pk, last_heartbeat_at=seen)
            .exclude(state=HostState.DOWN)
            .update(state=HostState.DOWN, down_since=now)
        ):
            logger.warning("host down host=%s name=%s last_heartbeat_at=%s", pk, name, seen)
            down.append(str(pk))
    # Their next heartbeat must take the slow path, which brings them back.
    fastpath.hosts_changed(host_ids=down)
    return down


def hosts_lose_workloads(*, now: datetime | None = None) -> list[str]:
    """Work on hosts DOWN for longer than HOST_LOST_GRACE_S becomes LOST.

    Their GPUs are freed; jobs go back to the queue without spending a retry.
    """
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.HOST_LOST_GRACE_S)
    hosts = {
        pk: (name, since or seen)
        for pk, name, since, seen in Host.objects.filter(state=HostState.DOWN).values_list(
            "pk", "name", "down_since", "last_heartbeat_at"
        )
        if (since or seen) is None or (since or seen) <= cutoff
    }
    if not hosts:
        return []
    lost = []
    victims = (
        Workload.objects.filter(
            state__in=HOLDING, allocations__active=True, allocations__host__in=list(hosts)
        )
        .distinct()
        .order_by("created_at")
    )
    for w in victims:
        host_id = (
            w.allocations.filter(active=True, host__in=list(hosts))
            .values_list("host_id", flat=True)
            .first()
        )
        name, since = hosts.get(host_id, ("?", None))
        when = f" since {since:%Y-%m-%d %H:%M:%S} UTC" if since else ""
        old = w.state
        workload_requeue_or_end(workload=w, ended=State.LOST, reason=f"host {name} down{when}")
        if w.state != old:
            lost.append(str(w.pk))
            logger.warning("workload lost workload=%s host=%s", w.pk, host_id)
    return lost


def hosts_check_liveness(*, now: datetime | None = None) -> LivenessOutcome:
    """The liveness tick: mark silent hosts DOWN, then lose the work of long-DOWN ones."""
    now = now or timezone.now()
    return LivenessOutcome(down=hosts_mark_down(now=now), lost=hosts_lose_workloads(now=now))


# --- operator actions: cordon, drain, uncordon, GPU health --------------------------------


def _host_set_admin_state(*, host: Host, to: str) -> Host:
    """Record the operator's choice; the host takes it now unless it is DOWN (then on return).

    Audited with the current actor (the admin sets it for its requests)."""
    with transaction.atomic():
        locked = Host.objects.select_for_update().get(pk=host.pk)
        old = locked.state
        locked.admin_state = to
        if locked.state != HostState.DOWN:
            locked.state = to
        locked.save(update_fields=["admin_state", "state"])
        verb = {AdminState.READY: "uncordon", AdminState.CORDONED: "cordon"}.get(to, "drain")
        audit_record(
            tenant=None,
            action=f"host.{verb}",
            obj=locked,
            data={"from": old, "to": locked.state, "admin_state": to},
        )
        if to == AdminState.READY and old != locked.state:
            _trigger_cycle_on_commit(locked.region_id)  # capacity is back
    logger.info("host %s host=%s name=%s state=%s", to, locked.pk, locked.name, locked.state)
    return locked


def host_cordon(*, host: Host) -> Host:
    """No new work lands on `host`; what runs there keeps running."""
    return _host_set_admin_state(host=host, to=AdminState.CORDONED)


def host_uncordon(*, host: Host) -> Host:
    """`host` takes new work again (once it heartbeats, if it is DOWN)."""
    return _host_set_admin_state(host=host, to=AdminState.READY)


def host_drain(*, host: Host, now: datetime | None = None) -> tuple[Host, list[str]]:
    """Empty `host` for maintenance: no new work lands there; batch jobs (restartable) get
    the region's preemption notice (default 30 s, time to checkpoint) and then go back to
    the queue as PREEMPTED -> PENDING without spending a retry, by the scheduler's cycle
    exactly as a preempted job; instances run until their owners stop them. The host stays
    DRAINING (also across an outage) until uncordoned.
    Returns the host and the ids of the jobs given notice now."""
    now = now or timezone.now()
    host = _host_set_admin_state(host=host, to=AdminState.DRAINING)
    notice_s = policy_for(host.region_id).notice_s
    stop_by = now + timedelta(seconds=notice_s)
    noticed = []
    jobs = (
        Workload.objects.filter(
            kind=WorkloadKind.JOB,
            state__in=(State.SCHEDULED, State.STARTING, State.RUNNING),
            allocations__active=True,
            allocations__host=host,
        )
        .distinct()
        .order_by("created_at")
    )
    for w in jobs:
        # a checkpointing job's notice lasts its grace at least, as for a preemption
        stop = now + timedelta(seconds=max(notice_s, w.checkpoint_grace_s or 0))
        # a job already on notice (preempted) keeps its earlier deadline
        if Workload.objects.filter(pk=w.pk, stop_by__isnull=True).update(
            stop_by=stop, reason=f"host {host.name} is draining; stopping at {stop:%H:%M:%S} UTC"
        ):
            noticed.append(str(w.pk))
    if noticed:
        holding_changed(noticed)  # a checkpointing job gets its signal
    logger.info("host drained host=%s noticed=%s stop_by=%s", host.pk, noticed, stop_by.isoformat())
    return host, noticed


def gpu_mark_healthy(*, gpu: Gpu) -> Gpu:
    """An operator repaired `gpu` (reset, replaced): it takes work again."""
    reason = gpu.unhealthy_reason
    Gpu.objects.filter(pk=gpu.pk).update(healthy=True, unhealthy_reason="", unhealthy_since=None)
    gpu.refresh_from_db()
    fastpath.hosts_changed(host_ids=[gpu.host_id])  # a still-failing GPU is caught again
    audit_record(tenant=None, action="gpu.mark_healthy", obj=gpu, data={"was": reason})
    _trigger_cycle_on_commit(gpu.host.region_id)
    logger.info("gpu marked healthy gpu=%s was=%s", gpu.pk, reason)
    return gpu


# --- metrics: roll raw samples up into minutes, prune both --------------------------------


@dataclass
class RollupOutcome:
    minutes: int = 0  # (gpu, minute) rows written or refreshed
    raw_pruned: int = 0
    minutes_pruned: int = 0


def gpu_samples_rollup(*, now: datetime | None = None) -> RollupOutcome:
    """Average raw samples into GpuSampleMinute for every complete minute since the last
    rolled-up one (re-doing that one: late samples), then prune both tables.

    Idempotent (an upsert per (gpu, minute)); a worker that was down catches up as far
    as the raw samples still go back.
    """
    now = now or timezone.now()
    fastpath.heartbeats_flush()  # the minute being rolled up may still be in Redis
    out = RollupOutcome()
    end = now.replace(second=0, microsecond=0)  # the current minute is not complete yet
    last = GpuSampleMinute.objects.aggregate(m=Max("minute"))["m"]
    start = last if last is not None else GpuSample.objects.aggregate(m=Min("time"))["m"]
    if start is not None and start < end:
        rows = (
            GpuSample.objects.filter(time__gte=start, time__lt=end)
            .annotate(m=TruncMinute("time"))
            .values("gpu_id", "m")
            .annotate(
                n=Count("id"),
                u=Avg("gpu_util"),
                mu=Avg("mem_util"),
                mem=Avg("mem_used_mib"),
                t=Avg("temperature_c"),
                p=Avg("power_w"),
            )
        )
        minutes = [
            GpuSampleMinute(
                gpu_id=r["gpu_id"],
                minute=r["m"],
                samples=r["n"],
                gpu_util=r["u"],
                mem_util=r["mu"],
                mem_used_mib=r["mem"],
                temperature_c=r["t"],
                power_w=r["p"],
            )
            for r in rows
        ]
        GpuSampleMinute.objects.bulk_create(
            minutes,
            batch_size=2000,
            update_conflicts=True,
            unique_fields=["gpu", "minute"],
            update_fields=["samples", "gpu_util", "mem_util", "mem_used_mib", "temperature_c",
                           "power_w"],
        )
        out.minutes = len(minutes)
    raw_cutoff = now - timedelta(seconds=settings.GPU_SAMPLE_RAW_RETENTION_S)
    out.raw_pruned = GpuSample.objects.filter(time__lt=raw_cutoff).delete()[0]
    minute_cutoff = now - timedelta(days=settings.GPU_SAMPLE_MINUTE_RETENTION_DAYS)
    out.minutes_pruned = GpuSampleMinute.objects.filter(minute__lt=minute_cutoff).delete()[0]
    return out


# --- logs -----------------------------------------------------------------------------------


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
