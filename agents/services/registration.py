"""A host joins: bootstrap tokens, registration (and its retry), the GPU inventory it reports.

A bootstrap token admits one new host; a host token (minted here, rotated by every
re-registration) authenticates its heartbeats (`agents.services.heartbeat`).
"""

from __future__ import annotations

import logging
import re
import secrets
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Final

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone

from agents import fastpath
from agents.choices import HostState
from agents.models import BootstrapToken, Gpu, Host
from agents.protocol import GpuInfo, RegisterRequest
from agents.selectors import hash_token
from gpucloud.catalogue.models import GpuModel, Region
from gpucloud.lib.errors import Conflict, InvalidInput, ServiceError
from gpucloud.tenancy.audit import audit_record
from scheduler.hooks import cycle_wanted

logger = logging.getLogger(__name__)

BOOTSTRAP_PREFIX: Final = "gpb_"
HOST_TOKEN_PREFIX: Final = "gph_"
_SECRET_BYTES: Final = 32  # 256 bits


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
    # A GPU belongs to the host that first registered it. Idle or not, another host's GPU
    # is never moved by a registration: anyone holding an unused bootstrap token could
    # otherwise list the UUIDs tenants see (`gpus`, NVIDIA_VISIBLE_DEVICES) and take a host's
    # idle GPUs. A machine that takes over a host's GPUs takes over the host itself, under
    # its name, after the operator's "Replace host" (`host_replace_allow`).
    owned = (
        Gpu.objects.filter(uuid__in=uuids).exclude(host=host)
        .select_related("host").order_by("uuid").first()
    )
    if owned is not None:
        at = uuids.index(owned.uuid)
        raise _gpu_owned(owned, at)
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
    try:
        with transaction.atomic():
            Gpu.objects.bulk_create(new)
    except IntegrityError:
        # Another registration listing the same new GPU committed first (the UUID is the
        # key): its GPU now, and this registration's retry is refused as above.
        raise Conflict(
            "A GPU of this inventory was registered by another host meanwhile; retry.",
            code="gpu_owned_by_another_host",
        ) from None


class HostExists(Conflict):
    """A registration names a host that exists, without proof that it is that machine."""

    code = "host_exists"
    host_id: str = ""  # for the audit record; never in the answer
    owner_name: str = ""  # the host the refused registration collided with (audit, log)


class GpuOwned(HostExists):
    """A registration lists a GPU another host registered first."""

    code = "gpu_owned_by_another_host"


def _gpu_owned(gpu: Gpu, at: int) -> GpuOwned:
    message = (
        f"GPU {gpu.uuid} is registered to another host. A GPU stays with the host that "
        "registered it first; a machine that replaces that host registers under its name "
        "once an operator allows it (admin: Hosts → Replace host)."
    )
    e = GpuOwned(message, fields={f"gpus[{at}].uuid": [message]})
    e.host_id, e.owner_name = str(gpu.host_id), gpu.host.name
    return e


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
            data={
                "bootstrap": req.bootstrap_token[:12],
                "reason": e.message,
                "code": e.code,
                "hostname": req.hostname,
                "owner": e.owner_name,
            },
        )
        logger.warning(
            "registration refused host=%s owner=%s name=%s bootstrap=%s: %s",
            e.host_id, e.owner_name, req.hostname, req.bootstrap_token[:12], e.message,
        )
        raise


def _host_exists(host: Host, message: str) -> HostExists:
    e = HostExists(message, fields={"hostname": [message]})
    e.host_id, e.owner_name = str(host.pk), host.name
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
    cycle_wanted(host.region_id)  # new or returning capacity
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
