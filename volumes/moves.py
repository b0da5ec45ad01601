"""Moving a detached volume's data between hosts, through the agents (docs/volumes.md).

Hosts accept no inbound connections, so the control plane relays: the move's orders ride on
the heartbeat answers (`agents.protocol.VolumeMoveOrder`), the source's agent PUTs a tar of
the volume in chunks and says `sent` (size, SHA-256), then the target's agent GETs them,
checks size and checksum, unpacks and says `received` with what it counted. Only when both
agree does the volume's host change (and the pins of its stopped workloads); the source's
agent is then told to remove its copy. Anything else fails the move and leaves the volume
on its source host, usable. Billing and quota do not look at the host: a move changes
neither.
"""
from __future__ import annotations

from functools import cache
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, Q
from django.utils import timezone

from agents.choices import AdminState, HostState
from agents.fastpath import hosts_changed
from agents.models import Host
from agents.protocol import VolumeMoveOrder
from agents.services.heartbeat import BeatRead
from gpucloud.lib.db import model_columns, model_from_row
from gpucloud.lib.errors import Conflict, InvalidInput
from gpucloud.tenancy.audit import audit_record
from scheduler.models import Workload
from volumes.models import DOCKER_PREFIX, Volume, VolumeEvent, VolumeMove, VolumeMoveChunk
from volumes.selectors import open_move
from volumes.services import _attached_words, active_attachment

CHUNK_BYTES = 1024 * 1024  # what an agent sends per request (the last chunk may be smaller)


@transaction.atomic
def move_start(*, volume: Volume, target: Host, user=None) -> VolumeMove:
    """An operator moves `volume` to `target`. Refused unless the volume is live, has data on
    a host, is detached and not already moving, and the target is another usable host of its
    region."""
    volume = Volume.objects.select_for_update(of=("self",)).select_related("host").get(pk=volume.pk)
    if volume.deleted_at is not None:
        raise Conflict(f"Volume {volume.name!r} was deleted.", code="volume_deleted")
    if volume.host_id is None:
        raise Conflict(f"Volume {volume.name!r} has no data on any host yet: nothing to move.",
                       code="volume_not_placed")
    if target.pk == volume.host_id:
        raise InvalidInput(f"Volume {volume.name!r} already lives on {target.name}.", code="same_host",
                           fields={"target": ["Another host."]})
    if target.region_id != volume.region_id:
        raise InvalidInput(f"Host {target.name} is not in the volume's region.", code="wrong_region",
                           fields={"target": ["A host of the volume's region."]})
    if target.admin_state != AdminState.READY or target.state != HostState.READY:
        raise InvalidInput(f"Host {target.name} is {target.get_state_display().lower()}, not taking new work.",
                           code="host_unavailable", fields={"target": ["A ready host."]})
    att = active_attachment(volume)
    if att is not None:
        raise Conflict(f"Volume {volume.name!r} is attached to {_attached_words(att)}; stop it first.",
                       code="volume_attached")
    if open_move(volume.pk) is not None:
        raise Conflict(f"Volume {volume.name!r} is already moving.", code="volume_moving")
    move = VolumeMove.objects.create(volume=volume, source_id=volume.host_id, target=target, requested_by=user)
    audit_record(tenant=volume.tenant, action="volume.move", obj=volume, object_repr=volume.name,
                 data={"from": volume.host.name, "to": target.name, "move": str(move.pk)})
    hosts_changed(host_ids=[volume.host_id])
    return move


def _host_moves(host: Host, shared: dict | None) -> list[VolumeMove]:
    return _host_volume_work(host, shared)[0]


def _host_volume_work(host: Host, shared: dict | None) -> tuple[list[VolumeMove], list[str]]:
    """What a heartbeat answer needs of this host's volumes, in one query: the moves it sends
    or receives, those moved off it whose old copy is still there, and the Docker names of its
    purged volumes whose data it still holds. Read once per answer when the caller passes the
    answer's `shared` dict (agents.signals).

    Written SQL that loads what `select_related("volume")` would: every heartbeat answer
    that is not cached reads it, and the ORM's queries cost more CPU to build than to run."""
    key = _work_key(host.pk)
    if shared is not None and key in shared:
        return shared[key]
    pk = Host._meta.pk.get_db_prep_value(host.pk, connection)
    with connection.cursor() as cur:
        cur.execute(_host_volume_work_sql(),
                    [pk, VolumeMove.COPYING, pk, VolumeMove.SENT, pk, VolumeMove.DONE, pk])
        rows = cur.fetchall()
    found: list[VolumeMove] = []
    purged: list[str] = []
    vol_id = 1 + len(VolumeMove._meta.concrete_fields) + [f.attname for f in Volume._meta.concrete_fields].index("id")
    for row in rows:
        if row[0] == "p":  # a purged volume: its id, where the volume's columns start
            purged.append(f"{DOCKER_PREFIX}{row[vol_id]}")
            continue
        m, at = model_from_row(VolumeMove, row, 1)
        m.volume, _ = model_from_row(Volume, row, at)
        found.append(m)
    if shared is not None:
        shared[key] = (found, purged)
    return found, purged


def _work_key(host_id: Any) -> tuple[str, Any]:
    return ("volumes.work", host_id)


# Which moves and volumes are a host's work (`host`: its id): the moves it sends (COPYING, its
# source) or receives (SENT, its target), those moved off it whose old copy is still there (DONE,
# its source); its purged volumes whose data it holds. The moves' `%s` take `_MOVE_STATES`.
_MOVE_STATES = (VolumeMove.COPYING, VolumeMove.SENT, VolumeMove.DONE)


def _moves_where(host: str) -> str:
    return (f"((m.source_id = {host} AND m.state = %s) OR (m.target_id = {host} AND m.state = %s) "
            f"OR (m.source_id = {host} AND m.state = %s AND m.source_removed_at IS NULL))")


def _purged_where(host: str) -> str:
    return f"v.host_id = {host} AND v.purged_at IS NOT NULL"


def _has_work_sql(host: str) -> str:
    """Whether the host with id column `host` has any volume work (`_host_volume_work`)."""
    return (f"(EXISTS (SELECT 1 FROM {VolumeMove._meta.db_table} m WHERE {_moves_where(host)}) "
            f"OR EXISTS (SELECT 1 FROM {Volume._meta.db_table} v WHERE {_purged_where(host)}))")


def _seed_no_work(shared: dict, host_id: Any, has_work: bool) -> None:
    if not has_work:
        shared[_work_key(host_id)] = ([], [])


# Read with the heartbeat's host UPDATE: a host without volume work (nearly every one) needs
# no query of its own for the answer's removals and moves.
heartbeat_read = BeatRead(sql=_has_work_sql, params=_MOVE_STATES, seed=_seed_no_work)


@cache
def _host_volume_work_sql() -> str:
    move_fields = VolumeMove._meta.concrete_fields
    names = [f.attname for f in move_fields]
    # ordinals (1: the kind): UNION's ORDER BY sees output columns, and both tables name `id`
    created, ident = 2 + names.index("created_at"), 2 + names.index("id")
    vol_fields = Volume._meta.concrete_fields
    nulls = ", ".join("NULL" for _ in move_fields)
    vol_id_only = ", ".join('v."id"' if f.attname == "id" else "NULL" for f in vol_fields)
    return (
        f"SELECT 'm', {model_columns(VolumeMove, 'm')}, {model_columns(Volume, 'v')} "
        f"FROM {VolumeMove._meta.db_table} m JOIN {Volume._meta.db_table} v ON v.id = m.volume_id "
        f"WHERE {_moves_where('%s')} "
        f"UNION ALL SELECT 'p', {nulls}, {vol_id_only} FROM {Volume._meta.db_table} v "
        f"WHERE {_purged_where('%s')} "
        f"ORDER BY 1, {created}, {ident}"
    )


def to_remove(*, host: Host, shared: dict | None = None) -> list[str]:
    """Docker names of the volumes this host's agent removes: purged ones whose data it still
    holds, then those moved off it whose old copy is still there."""
    moves, purged = _host_volume_work(host, shared)
    return purged + [m.volume.docker_name for m in moves
                     if m.state == VolumeMove.DONE and m.source_id == host.pk and m.source_removed_at is None]


def orders_for(*, host: Host, shared: dict | None = None) -> list[VolumeMoveOrder]:
    """This host's part in open moves: send (the source, until it said sent), receive (the
    target, once everything was sent)."""
    out = []
    for m in _host_moves(host, shared):
        if m.state == VolumeMove.COPYING and m.source_id == host.pk:
            out.append(VolumeMoveOrder(move_id=str(m.pk), volume=m.volume.docker_name, role="send",
                                       tenant_id=str(m.volume.tenant_id)))
        elif m.state == VolumeMove.SENT and m.target_id == host.pk:
            out.append(VolumeMoveOrder(move_id=str(m.pk), volume=m.volume.docker_name, role="receive",
                                       tenant_id=str(m.volume.tenant_id), size_bytes=m.size_bytes or 0,
                                       sha256=m.sha256))
    return out


def source_reported(*, host_id: Any, present: set[str]) -> int:
    """The source host reported its volumes without a moved one: its old copy is gone."""
    gone = [m.pk for m in VolumeMove.objects.filter(source_id=host_id, state=VolumeMove.DONE,
                                                    source_removed_at__isnull=True).select_related("volume")
            if m.volume.docker_name not in present]
    if gone:
        VolumeMove.objects.filter(pk__in=gone).update(source_removed_at=timezone.now())
        transaction.on_commit(lambda: hosts_changed(host_ids=[host_id]))
    return len(gone)


def _locked(move_id: Any, host: Host, role: str, *, lock: bool = True) -> VolumeMove:
    qs = VolumeMove.objects.select_related("volume", "target")
    move = (qs.select_for_update(of=("self",)) if lock else qs).filter(pk=move_id).first()
    if move is None or (move.source_id if role == "send" else move.target_id) != host.pk:
        raise InvalidInput("No such move for this host.", code="unknown_move")
    return move


@transaction.atomic
def store_chunk(*, move_id: Any, host: Host, seq: int, data: bytes) -> None:
    move = _locked(move_id, host, "send")
    if move.state != VolumeMove.COPYING:
        raise Conflict(f"The move is {move.state}.", code="move_not_copying")
    if len(data) > CHUNK_BYTES or seq > settings.VOLUME_MOVE_MAX_BYTES // CHUNK_BYTES:
        raise InvalidInput(f"Chunks hold at most {CHUNK_BYTES} bytes, moves "
                           f"{settings.VOLUME_MOVE_MAX_BYTES} bytes.", code="move_too_large")
    VolumeMoveChunk.objects.update_or_create(move=move, seq=seq, defaults={"data": data})


def read_chunk(*, move_id: Any, host: Host, seq: int) -> bytes:
    move = _locked(move_id, host, "receive", lock=False)
    if move.state != VolumeMove.SENT:
        raise Conflict(f"The move is {move.state}.", code="move_not_sent")
    row = VolumeMoveChunk.objects.filter(move=move, seq=seq).first()
    if row is None:
        raise InvalidInput(f"No chunk {seq}.", code="unknown_chunk")
    return bytes(row.data)


def _fail(move: VolumeMove, error: str) -> None:
    now = timezone.now()
    VolumeMove.objects.filter(pk=move.pk).update(state=VolumeMove.FAILED, error=error[:500], finished_at=now)
    move.state, move.error, move.finished_at = VolumeMove.FAILED, error[:500], now
    VolumeMoveChunk.objects.filter(move=move).delete()
    VolumeEvent.objects.create(volume=move.volume, kind="move_failed", created_at=now,
                               message=f"The move to another host failed; the volume stays where it was: {error}"[:500])
    audit_record(tenant=move.volume.tenant, action="volume.move_failed", obj=move.volume,
                 object_repr=move.volume.name, data={"move": str(move.pk), "error": error[:200]})
    hosts_changed(host_ids=[move.source_id, move.target_id])


@transaction.atomic
def mark_sent(*, move_id: Any, host: Host, size_bytes: int, sha256: str, chunks: int) -> VolumeMove:
    move = _locked(move_id, host, "send")
    if move.state != VolumeMove.COPYING:
        raise Conflict(f"The move is {move.state}.", code="move_not_copying")
    rows = list(VolumeMoveChunk.objects.filter(move=move).order_by("seq").values_list("seq", "data"))
    if [s for s, _ in rows] != list(range(chunks)) or sum(len(d) for _, d in rows) != size_bytes:
        _fail(move, f"the source said {chunks} chunks, {size_bytes} bytes; the control plane holds "
                    f"{len(rows)} chunks, {sum(len(d) for _, d in rows)} bytes")
        return move
    VolumeMove.objects.filter(pk=move.pk).update(state=VolumeMove.SENT, size_bytes=size_bytes,
                                                 sha256=sha256, chunks=chunks)
    hosts_changed(host_ids=[move.source_id, move.target_id])
    move.state = VolumeMove.SENT
    return move


@transaction.atomic
def mark_received(*, move_id: Any, host: Host, size_bytes: int, sha256: str) -> VolumeMove:
    """The target unpacked what it got: the volume lives there now, if what it counted is
    what the source sent; else the move failed and the volume stays on its source."""
    move = _locked(move_id, host, "receive")
    if move.state != VolumeMove.SENT:
        raise Conflict(f"The move is {move.state}.", code="move_not_sent")
    if (size_bytes, sha256) != (move.size_bytes, move.sha256):
        _fail(move, f"the target received {size_bytes} bytes (sha256 {sha256[:12]}), the source sent "
                    f"{move.size_bytes} bytes (sha256 {move.sha256[:12]})")
        return move
    volume = Volume.objects.select_for_update().get(pk=move.volume_id)
    now = timezone.now()
    Volume.objects.filter(pk=volume.pk).update(host_id=move.target_id, updated_at=now)
    # its stopped workloads start again where the data is now
    Workload.objects.filter(volume_attachments__volume=volume, pinned_host_id=move.source_id).update(
        pinned_host_id=move.target_id)
    VolumeMove.objects.filter(pk=move.pk).update(state=VolumeMove.DONE, finished_at=now)
    VolumeMoveChunk.objects.filter(move=move).delete()
    VolumeEvent.objects.create(volume=volume, kind="moved", created_at=now,
                               message=f"Moved to host {move.target.name} ({size_bytes} bytes checked).")
    audit_record(tenant=volume.tenant, action="volume.moved", obj=volume, object_repr=volume.name,
                 data={"move": str(move.pk), "to": move.target.name, "bytes": size_bytes})
    hosts_changed(host_ids=[move.source_id, move.target_id])
    move.state = VolumeMove.DONE
    return move


@transaction.atomic
def mark_failed(*, move_id: Any, host: Host, error: str) -> VolumeMove:
    move = VolumeMove.objects.select_for_update().select_related("volume").filter(pk=move_id).first()
    if move is None or host.pk not in (move.source_id, move.target_id):
        raise InvalidInput("No such move for this host.", code="unknown_move")
    if move.state in VolumeMove.OPEN:
        _fail(move, error or "reported failed by an agent")
        move.state = VolumeMove.FAILED
    return move


def pick_target(volume: Volume) -> Host | None:
    """Where to move a volume when the operator names no host: a ready host of its region
    other than its own, the one holding the fewest volumes (then by name)."""
    return (Host.objects.filter(region_id=volume.region_id, admin_state=AdminState.READY, state=HostState.READY)
            .exclude(pk=volume.host_id)
            .annotate(n=Count("volumes", filter=Q(volumes__purged_at__isnull=True))).order_by("n", "name").first())


@transaction.atomic
def move_cancel(*, move: VolumeMove) -> None:
    """An operator gives up on an open move (an agent gone quiet): the volume stays put."""
    move = VolumeMove.objects.select_for_update().select_related("volume").get(pk=move.pk)
    if move.state in VolumeMove.OPEN:
        _fail(move, "cancelled by an operator")
