"""The heartbeat fast path: answer an unchanged heartbeat from Redis, write its samples later.

Most heartbeats say "nothing changed": the same containers in the same states, the same
GPU health, new utilisation numbers. Such a heartbeat needs no lifecycle work and its
answer (the desired set) is the previous one. One Lua script call decides and does it:

    POST /agent/v1/heartbeat
      parse + digest (containers, agent version, per-GPU health) ─┐
      BEAT script, one Redis round trip:                          │
        tok:<sha256>        -> "<host id>|<version>"  (token known and not invalidated?)
        rl:<host>           sliding-window rate limit (AGENT_RATE_LIMIT), as DRF's
        s:<host>            seq claim (agents.services.heartbeat.seq_is_fresh, atomically)
        h:<cfg>:<host>      {ver, digest, ans}: the last slow answer, at which version
        vol:<host>          "<ver>|<digest>" of the last volume report applied (a report
                            every VOLUME_USAGE_EVERY_S; an unchanged one is fast too)
        v:<host>            the host's version, bumped after every change of its work
      fast  -> RPUSH buf "<host>|[ts, seq, samples]", answer `ans`          (no SQL at all)
      slow  -> the synchronous path (services.host_heartbeat, as before), then
               `remember()` stores the digest and answer for the next one.

Invalidation is by version, never by deleting an answer: whoever changes what a host's
answer or its container handling depends on calls `hosts_changed` / `workloads_changed`
(after commit). A slow path reads the version *before* its database reads and stores
its answer under that version, so a change committed meanwhile can never be hidden by
a stale answer. Callers: scheduler.services workload_transition / workloads_transition
(any move of work that holds GPUs: placement, start, stop, release), host registration
(token rotation, inventory), going DOWN, a GPU marked healthy, a log request. Entries
also expire after FASTPATH_MAX_AGE_S, a backstop for a change made behind these hooks.
After commit the same hook publishes a wake-up per host (`gateway:wake:<host>`), which the
gateway replica holding the host's tunnel forwards as a WAKE frame (docs/connect.md).

Buffered heartbeats (`buf`) are written to PostgreSQL by `heartbeats_flush` (the beat
task `agents.tasks.heartbeats_flush_task`, every second, and before the liveness check
and the minute rollup): the samples in one INSERT, each GPU's last measurement and each
host's `last_heartbeat_at` / `last_seq` in one UPDATE each; an unchanged volume report's
measuring time through `agents.signals.volumes_measured`. Readers of samples therefore
see them up to about a second late.

Enabled when REDIS_URL is set and the database is PostgreSQL; otherwise every heartbeat
takes the synchronous path, as it always did.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from typing import Any, Final
from uuid import UUID

import orjson
import psycopg
import redis
from django.conf import settings
from django.db import DataError, IntegrityError, connection, transaction

from agents.models import Gpu, GpuSample, Host
from agents.protocol import (
    FATAL_XIDS,
    IDLE_BELOW,
    SEQ_REORDER_WINDOW,
    Heartbeat,
    ProtocolError,
    utilisation_fraction,
    wake_channel,
)
from agents.protocol import GpuSample as GpuSampleMsg
from agents.signals import volumes_measured
from gpucloud.api.parsers import json_depth_ok
from gpucloud.lib.db import copy_text, pg_cursor, redis_client
from gpucloud.lib.ratelimit import parse_rate
from scheduler.models import Allocation

logger = logging.getLogger(__name__)

FASTPATH_MAX_AGE_S: Final = 900  # a cached answer or token is re-checked at least this often
SEQ_TTL_S: Final = 86400
FLUSH_BATCH: Final = 20000  # buffered heartbeats per flush transaction
_FLUSH_LOCK: Final = 0x6770_6862  # pg advisory lock: flushes run one at a time ("gphb")
_SCHEMA: Final = 1  # bump when the cached answer's shape changes: old entries are ignored

# Replies of the BEAT script.
MISS, THROTTLED, FAST, SLOW = 0, 1, 2, 3

_BEAT: Final = """
local p = ARGV[1]
local host = ARGV[3]
local cur
if host == '' then
  local t = redis.call('GET', p .. 'tok:' .. ARGV[2])
  if not t then return {0} end
  local sep = string.find(t, '|', 1, true)
  host = string.sub(t, 1, sep - 1)
  cur = redis.call('GET', p .. 'v:' .. host) or '0'
  if string.sub(t, sep + 1) ~= cur then return {0} end
else
  cur = redis.call('GET', p .. 'v:' .. host) or '0'
end
-- the rate limit: a sliding log, as rest_framework's SimpleRateThrottle
local now = tonumber(ARGV[7])
local limit = tonumber(ARGV[8])
local window = tonumber(ARGV[9])
if limit >= 0 then  -- (negative: already counted for this request)
  local rl = p .. 'rl:' .. host
  redis.call('ZREMRANGEBYSCORE', rl, '-inf', now - window)
  local n = redis.call('ZCARD', rl)
  if n >= limit then
    if limit - n + 1 <= 0 then return {1, ''} end
    local oldest = redis.call('ZRANGE', rl, 0, 0, 'WITHSCORES')
    local wait = window - (now - tonumber(oldest[2]))
    return {1, tostring(wait / (limit - n + 1) / 1000)}
  end
  redis.call('ZADD', rl, now, ARGV[10])
  redis.call('PEXPIRE', rl, window)
end
if ARGV[4] == '' then return {3, host, 0, cur} end  -- throttle only
-- a body naming another host: the slow path refuses it (401), claiming nothing
if ARGV[15] ~= host then return {3, host, 0, cur} end
-- the seq claim (agents.services.heartbeat.seq_is_fresh); no stored seq: fresh
local seq = tonumber(ARGV[4])
local sk = p .. 's:' .. host
local last = tonumber(redis.call('GET', sk) or '-1')
local fresh = last < 0 or seq > last or seq == 1 or seq < last - tonumber(ARGV[13])
if fresh then redis.call('SET', sk, ARGV[4], 'EX', tonumber(ARGV[14])) end
if ARGV[5] ~= '' then
  local hk = p .. 'h:' .. ARGV[11] .. ':' .. host
  local h = redis.call('HMGET', hk, 'ver', 'digest', 'ans')
  if h[1] == cur and h[3] and ((not fresh) or h[2] == ARGV[5]) then
    local rec = ARGV[6]
    if not fresh then
      rec = ARGV[12]
    elseif ARGV[16] ~= '' and redis.call('GET', p .. 'vol:' .. host) ~= cur .. '|' .. ARGV[16] then
      return {3, host, 1, cur}  -- a volume report unlike the last one applied at this version
    end
    redis.call('RPUSH', p .. 'buf', host .. '|' .. rec)
    return {2, h[3]}
  end
end
return {3, host, fresh and 1 or 0, cur}
"""


@dataclass
class Claim:
    """What the BEAT script decided for one heartbeat that the fast path could not answer.

    Carried on the Django request to the synchronous view, which then neither counts the
    request against the rate limit nor claims its seq a second time."""

    kind: int
    host_id: str = ""
    host: Host | None = None
    fresh: bool = True
    version: str = "0"
    wait: float | None = None
    hb: Heartbeat | None = None
    token_hash: str = ""
    digest: str = ""
    volumes_digest: str = ""


@dataclass
class Parsed:
    hb: Heartbeat
    token_hash: str
    digest: str  # "" when this heartbeat must take the slow path whatever the cache holds
    record: bytes
    late_record: bytes
    volumes_digest: str = ""  # "" when it reports no volumes (or digest is "")


# --- plumbing -------------------------------------------------------------------------


def enabled() -> bool:
    """The fast path needs a shared Redis (all web processes see one cache) and PostgreSQL."""
    return bool(settings.REDIS_URL) and connection.vendor == "postgresql"


_client = redis_client


def _redis() -> redis.Redis:
    return _client(settings.REDIS_URL)


@cache
def _script(url: str) -> Any:
    return _client(url).register_script(_BEAT)


def _prefix() -> str:
    base = settings.CACHES.get("default", {}).get("KEY_PREFIX") or "gpucloud"
    return f"{base}:agent:"


def _cfg() -> str:
    """Part of every cached answer's key: settings that shape the answer."""
    return (f"{_SCHEMA}.{settings.AGENT_PIDS_LIMIT}.{float(settings.AGENT_HEARTBEAT_INTERVAL_S)}"
            f".{int(settings.AGENT_LONGPOLL_SLOTS > 0)}")


def _rate() -> tuple[int, int]:
    """AGENT_RATE_LIMIT as (requests, window in ms), parsed as every throttle parses a rate."""
    limit, window_s = parse_rate(settings.AGENT_RATE_LIMIT)
    return limit, window_s * 1000


# --- invalidation ---------------------------------------------------------------------


def hosts_changed(*, host_ids: Iterable[UUID | str]) -> None:
    """The answer or the container handling of these hosts may differ now: bump their
    versions, so their next heartbeat takes the slow path and reads the database again.

    Bumped twice: now, so that no heartbeat is answered from the old state from here on,
    and after the current transaction commits, so that nothing a slow path read before
    the commit (under the first bump) is trusted. Outside a transaction, once each.

    With the last bump (after commit), in the same round trip, a wake-up per host: the
    gateway replica holding a host's tunnel sends its agent a WAKE frame, and the agent
    heartbeats at once instead of at its next interval (placements start, stops stop, log
    requests are answered sooner). Best effort: a host without a tunnel, or a lost
    message, waits for its interval.
    """
    if not enabled():
        return
    hosts = sorted({str(h) for h in host_ids})
    keys = [f"{_prefix()}v:{h}" for h in hosts]
    if not keys:
        return

    def bump(wake: bool = False) -> None:
        try:
            pipe = _redis().pipeline(transaction=False)
            for k in keys:
                pipe.incr(k)
            if wake:  # the wake-ups in the same round trip, after the bumps
                for h in hosts:
                    pipe.publish(wake_channel(h), b"1")
            _own_record(keys, pipe.execute())
        except redis.RedisError:
            # Entries expire after FASTPATH_MAX_AGE_S: stale at worst until then; a host
            # not woken heartbeats at its interval.
            logger.exception("heartbeat cache invalidation failed keys=%s", keys)

    if transaction.get_connection().in_atomic_block:
        bump()
        transaction.on_commit(lambda: bump(wake=True))
    else:
        bump(wake=True)


_own = threading.local()


@contextmanager
def own_bumps(*, host_id: UUID | str) -> Iterator[list[int]]:
    """Collect the versions that this thread's own bumps of `host_id` (`hosts_changed`, now
    and after commit) give it within the block: `only_own` then says whether anybody else
    changed the host meanwhile."""
    got: list[int] = []
    outer = getattr(_own, "watch", None)
    _own.watch = (f"{_prefix()}v:{host_id}", got)
    try:
        yield got
    finally:
        _own.watch = outer


def _own_record(keys: list[str], versions: list[Any]) -> None:
    watch = getattr(_own, "watch", None)
    if watch is not None and watch[0] in keys:
        watch[1].append(int(versions[keys.index(watch[0])]))


def only_own(*, before: str, after: str, own: list[int]) -> bool:
    """Were the host's version moves from `before` to `after` all the caller's own (`own`,
    from `own_bumps`)? Then whatever a heartbeat read after `before` is still true at
    `after` but for its own writes: every change of what a host's answer depends on bumps
    its version (the invalidation rule above)."""
    try:
        return sorted(own) == list(range(int(before) + 1, int(after) + 1))
    except ValueError:
        return False


def workloads_changed(*, workload_ids: Iterable[UUID | str], hosts: Iterable[UUID | str] | None = None) -> None:
    """`hosts_changed` for the hosts where these workloads hold active allocations (one
    query, unless the caller knows them: `hosts`). Call before the allocations are released."""
    if not enabled():
        return

    ids = [str(i) for i in workload_ids]
    if not ids:
        return
    if hosts is not None:
        hosts_changed(host_ids=hosts)
        return
    # One array parameter bound on the server: a cycle placing 13,000 workloads sends one
    # value, not 13,000 quoted literals (gpucloud.lib.db.pg_cursor).
    with pg_cursor() as cur:
        cur.execute(f"SELECT DISTINCT host_id FROM {Allocation._meta.db_table} "
                    "WHERE workload_id = ANY(%s::uuid[]) AND active", [ids])
        hosts_changed(host_ids=[r[0] for r in cur.fetchall()])


def version(*, host_id: UUID | str) -> str:
    """The host's current version (read it before reading what an answer is made of)."""
    v = _redis().get(f"{_prefix()}v:{host_id}")
    return "0" if v is None else v.decode()


# --- the request side -------------------------------------------------------------------


def parse(request) -> Parsed | None:
    """The bearer token and the heartbeat of `request`, or None where only the
    synchronous view may answer (no bearer token, not JSON, malformed: it says why)."""
    parts = request.META.get("HTTP_AUTHORIZATION", "").split()
    if len(parts) != 2 or parts[0].lower() != "bearer":
        return None
    if not request.META.get("CONTENT_TYPE", "").startswith("application/json"):
        return None
    try:
        data = orjson.loads(request.body)
        if not json_depth_ok(data):
            return None  # the synchronous view's parser refuses it (400)
        hb = Heartbeat.from_dict(data)
    except (orjson.JSONDecodeError, ProtocolError):
        return None
    now = time.time()
    samples = [
        [s.uuid, s.gpu_util, s.mem_util, s.mem_used_mib, s.temperature_c, s.power_w]
        for s in hb.gpus
    ]
    # A volume report also carries the names measured: the flush stamps their measuring time.
    volumes = [] if hb.volumes is None else [[v.volume, v.used_bytes] for v in hb.volumes]
    record = orjson.dumps([now, hb.seq, samples, [n for n, _ in volumes]] if hb.volumes is not None
                          else [now, hb.seq, samples])
    late = orjson.dumps([now, None, []])
    token_hash = hashlib.sha256(parts[1].encode()).hexdigest()
    volumes_digest = ""
    if hb.logs or any(x in FATAL_XIDS for s in hb.gpus for x in s.xid_events):
        digest = ""  # log tails to store, a GPU to take out of service: the slow path
    else:
        digest = heartbeat_digest(hb, data.get("containers"))
        if hb.volumes is not None:
            volumes_digest = hashlib.blake2b(orjson.dumps(sorted(volumes)), digest_size=16).hexdigest()
    return Parsed(hb, token_hash, digest, record, late, volumes_digest)


def samples_record(*, host_id: UUID | str, when: datetime, samples: list[GpuSampleMsg]) -> bytes:
    """A slow heartbeat's GPU samples as the buffer holds an unchanged one's (no seq: the slow
    path applied that), for the flush to write (`samples_push`, or with `remember`)."""
    return f"{host_id}|".encode() + orjson.dumps([when.timestamp(), None, [
        [s.uuid, s.gpu_util, s.mem_util, s.mem_used_mib, s.temperature_c, s.power_w] for s in samples]])


def samples_push(records: list[bytes]) -> bool:
    """Buffer `samples_record`s. False when Redis refused: write them yourself."""
    try:
        _redis().rpush(f"{_prefix()}buf", *records)
    except redis.RedisError:
        logger.exception("heartbeat samples buffer failed records=%d", len(records))
        return False
    return True


def samples_buffer(*, host_id: UUID | str, when: datetime, samples: list[GpuSampleMsg]) -> bool:
    """`samples_push` of one heartbeat's samples."""
    return samples_push([samples_record(host_id=host_id, when=when, samples=samples)])


def heartbeat_digest(hb: Heartbeat, containers: Any) -> str:
    """What must be equal to the last applied heartbeat for this one to change nothing:
    the container report, the agent's version, and per GPU its health inputs (a GPU set,
    health flag or uncorrectable ECC count that moved is work for the slow path)."""
    health = [[s.uuid, s.healthy, s.ecc_uncorrected] for s in hb.gpus]
    blob = orjson.dumps([containers, hb.agent_version, health], option=orjson.OPT_SORT_KEYS)
    return hashlib.blake2b(blob, digest_size=16).hexdigest()


def beat(parsed: Parsed | None, *, host_id: str = "", seq: int | None = None,
         count: bool = True) -> list:
    """Run the BEAT script. With `host_id` the token was checked in the database already.
    Without a heartbeat (`parsed` None) it counts the rate limit (`count`) and, given a
    `seq`, claims it; it never answers then."""
    limit, window = _rate()
    if not count:
        limit = -1
    p = parsed
    args = [
        _prefix(),
        p.token_hash if p else "",
        host_id,
        "" if (p is None and seq is None) else str(p.hb.seq if p else seq),
        p.digest if p else "",
        p.record if p else b"",
        int(time.time() * 1000),
        limit,
        window,
        secrets.token_hex(8),
        _cfg(),
        p.late_record if p else b"",
        SEQ_REORDER_WINDOW,
        SEQ_TTL_S,
        p.hb.host_id if p else host_id,
        p.volumes_digest if p else "",
    ]
    return _script(settings.REDIS_URL)(args=args)


def authenticate(*, raw_token: str) -> tuple[int, str]:
    """The host of a host token known to Redis and still current, for requests other than
    heartbeats (the long poll), with the request counted against the host's rate limit, as
    the heartbeat's: (SLOW, host id), or (THROTTLED, "") or (MISS, "") when only the
    database can say (the caller then takes the synchronous view, which answers properly)."""
    limit, window = _rate()
    token_hash = hashlib.sha256(raw_token.encode()).hexdigest()
    reply = _script(settings.REDIS_URL)(args=[
        _prefix(), token_hash, "", "", "", b"", int(time.time() * 1000), limit, window,
        secrets.token_hex(8), _cfg(), b"", 16, SEQ_TTL_S, "", "",
    ])
    kind = int(reply[0])
    return (kind, reply[1].decode()) if kind == SLOW else (kind, "")


def claim_of(reply: list, parsed: Parsed | None) -> Claim:
    kind = int(reply[0])
    if kind == THROTTLED:
        return Claim(kind, wait=float(reply[1]) if reply[1] else None)
    if kind == SLOW:
        return Claim(
            kind, host_id=reply[1].decode(), fresh=bool(int(reply[2])),
            version=reply[3].decode(), hb=parsed.hb if parsed else None,
            token_hash=parsed.token_hash if parsed else "",
            digest=parsed.digest if parsed else "",
            volumes_digest=parsed.volumes_digest if parsed else "",
        )
    return Claim(kind)


def remember(*, claim: Claim, answer_version: str, answer: bytes, token_ok: bool, alone: bool = False,
             samples: list[bytes] | None = None) -> None:
    """After a slow heartbeat: the next one with the same digest may be answered `answer`
    while the host's version is still `answer_version`; the token, while it is still
    `claim.version` (read before the host row that proved the token current); the volume
    report, while it is still `claim.version` too (read before the volumes' rows were).
    `alone`: the moves from `claim.version` to `answer_version` were the heartbeat's own
    (`only_own`), which leave the token as it was: it stays known while the version is
    still `answer_version`, and the next heartbeat is known by its token without the
    database. `samples`: `samples_record`s to buffer in the same round trip (first, so they
    are in the buffer before an answer could be given from this one); emptied once Redis took
    them, left as they are where it refused them (the caller writes them, as `samples_push`'s)."""
    p = _prefix()
    current = answer_version if alone else claim.version
    pipe = _redis().pipeline(transaction=False)
    if samples:
        pipe.rpush(f"{p}buf", *samples)
    if claim.digest:
        hk = f"{p}h:{_cfg()}:{claim.host_id}"
        pipe.hset(hk, mapping={"ver": answer_version, "digest": claim.digest, "ans": answer})
        pipe.expire(hk, FASTPATH_MAX_AGE_S)
        if claim.volumes_digest:
            pipe.set(f"{p}vol:{claim.host_id}", f"{claim.version}|{claim.volumes_digest}",
                     ex=FASTPATH_MAX_AGE_S)
    if token_ok and claim.token_hash:
        pipe.set(f"{p}tok:{claim.token_hash}", f"{claim.host_id}|{current}",
                 ex=FASTPATH_MAX_AGE_S)
    results = pipe.execute(raise_on_error=False)
    if samples:
        took, results = results[0], results[1:]
        if isinstance(took, Exception):
            logger.error("heartbeat samples buffer failed host=%s: %s", claim.host_id, took)
        else:
            samples.clear()
    for r in results:
        if isinstance(r, Exception):
            raise r


# --- the flush: buffered heartbeats -> PostgreSQL ------------------------------------------


@dataclass
class FlushOutcome:
    heartbeats: int = 0
    samples: int = 0
    hosts: int = 0
    gpus: int = 0
    batches: int = 0
    dropped: int = 0  # buffered heartbeats the database refused (logged), written one by one


def heartbeats_flush() -> FlushOutcome:
    """Write every buffered fast-path heartbeat: samples, GPUs' last measurements, hosts'
    liveness. Safe to run concurrently (one at a time in the database, guarded updates).

    On a database error the batch goes back to the buffer and the error is raised: the next
    flush retries it. Except when the database refuses the *data* (a value out of range, say):
    then retrying would refuse it forever and keep every host's liveness behind it, until the
    whole fleet went DOWN. The batch is written heartbeat by heartbeat instead, and those
    refused are logged and dropped."""
    out = FlushOutcome()
    if not enabled():
        return out
    r, key = _redis(), f"{_prefix()}buf"
    while True:
        pipe = r.pipeline(transaction=True)
        pipe.lrange(key, 0, FLUSH_BATCH - 1)
        pipe.ltrim(key, FLUSH_BATCH, -1)
        raw, _ = pipe.execute()
        if not raw:
            break
        try:
            _write(raw, out)
        except Exception as exc:
            if not _refused(exc):
                r.lpush(key, *reversed(raw))  # back to the head, in order: the next flush retries
                raise
            _write_one_by_one(r, key, raw, out)
        out.batches += 1
        if len(raw) < FLUSH_BATCH:
            break
    return out


def _refused(exc: BaseException) -> bool:
    """Did the database refuse the data itself (class 22 or 23), as opposed to failing?"""
    return isinstance(exc, DataError | IntegrityError | psycopg.DataError | psycopg.IntegrityError)


def _write_one_by_one(r: redis.Redis, key: str, raw: list[bytes], out: FlushOutcome) -> None:
    for i, item in enumerate(raw):
        try:
            _write([item], out)
        except Exception as exc:
            if not _refused(exc):
                r.lpush(key, *reversed(raw[i:]))  # the rest waits for the next flush
                raise
            out.dropped += 1
            logger.error("heartbeat flush: dropped a buffered heartbeat the database refuses (%s): %.200r",
                         exc, item)


def _ts(t: float) -> datetime:
    return datetime.fromtimestamp(t, tz=UTC)


def _f(v: Any) -> float | None:
    return None if v is None else float(v)


def _copy_text(rows: list[tuple]) -> bytes:
    """Sample rows (uuid, ISO time, then numbers or None) in COPY's text format, built in
    one pass: psycopg's write_row per row cost more than the rest of the flush."""
    def n(v: float | int | None) -> str:
        return "\\N" if v is None else repr(v)

    lines = [
        f"{copy_text(uuid)}\t{iso}\t{n(u)}\t{n(mu)}\t{n(m)}\t{n(t)}\t{n(p)}\n"
        for uuid, iso, u, mu, m, t, p in rows
    ]
    return "".join(lines).encode()


def _write(raw: list[bytes], out: FlushOutcome) -> None:
    records = []
    for item in raw:
        host, _, body = item.partition(b"|")
        t, seq, samples, *volumes = orjson.loads(body)
        records.append((t, host.decode(), seq, samples, volumes))
    records.sort(key=lambda r: r[0])
    hosts: dict[str, list] = {}  # host -> [last seen, seq, time of that seq]
    measured: dict[str, tuple[datetime, list[str]]] = {}  # host -> its last volume report
    gpus: dict[str, list] = {}  # uuid -> [sampled_at, util, mem, idle mode, idle t, temp, power]
    rows: list[tuple] = []
    for t, host, seq, samples, volumes in records:
        when = _ts(t)
        iso = when.isoformat()
        h = hosts.setdefault(host, [when, None, None])
        h[0] = when
        if seq is not None:
            h[1], h[2] = seq, when
        if volumes:
            measured[host] = (when, volumes[0])
        for uuid, util, mem_util, mem, temp, power in samples:
            util, mem = _f(util), None if mem is None else max(0, int(mem))
            rows.append((uuid, iso, util, _f(mem_util), mem, _f(temp), _f(power)))
            g = gpus.setdefault(uuid, [when, None, None, "k", None, None, None])
            g[0] = when
            if mem is not None:
                g[2] = mem
            if temp is not None:
                g[5] = _f(temp)
            if power is not None:
                g[6] = _f(power)
            if util is not None:
                u = utilisation_fraction(util)
                g[1] = u
                # idle_since, as agents.services.gpus.gpu_samples_apply sample by sample: "k" keeps
                # the stored one (or takes t), "s" sets t, "c" clears it.
                if u < IDLE_BELOW:
                    if g[3] == "k":
                        g[4] = g[4] or when
                    elif g[3] == "c":
                        g[3], g[4] = "s", when
                else:
                    g[3], g[4] = "c", None
    order = sorted(gpus)
    g_cols = [order, *([gpus[u][i] for u in order] for i in range(7))]
    h_order = sorted(hosts)
    h_cols = [h_order, *([hosts[h][i] for h in h_order] for i in range(3))]
    gt, st, ht = Gpu._meta.db_table, GpuSample._meta.db_table, Host._meta.db_table
    with transaction.atomic():
        # Binding on the server (gpucloud.lib.db.pg_cursor): an array is one parameter, not
        # thousands of literals spliced into the SQL text.
        connection.ensure_connection()
        with psycopg.Cursor(connection.connection) as cur:
            # Telemetry, as the slow path's: no WAL flush wait (see agents.services.gpus.async_commit).
            cur.execute("SET LOCAL synchronous_commit TO OFF")
            cur.execute("SELECT pg_advisory_xact_lock(%s)", [_FLUSH_LOCK])
            cur.execute(
                f"UPDATE {ht} AS h SET last_heartbeat_at = GREATEST(h.last_heartbeat_at, v.t), "
                "last_seq = CASE WHEN v.seq IS NOT NULL AND (h.last_heartbeat_at IS NULL "
                "OR v.seq_t >= h.last_heartbeat_at) THEN v.seq ELSE h.last_seq END "
                "FROM unnest(%s::uuid[], %s::timestamptz[], %s::int8[], %s::timestamptz[]) "
                "AS v(id, t, seq, seq_t) WHERE h.id = v.id RETURNING h.id::text",
                h_cols,
            )
            found = {r[0] for r in cur.fetchall()}
            out.hosts += len(found)
            gone = set(h_order) - found
            if gone:
                # Deleted meanwhile: their tokens must stop working (the slow path says 401),
                # and their samples are dropped, not stored under GPUs that no longer exist.
                hosts_changed(host_ids=gone)
                cur.execute(f"SELECT uuid FROM {gt} WHERE uuid = ANY(%s)", [order])
                known = {r[0] for r in cur.fetchall()}
                rows = [r for r in rows if r[0] in known]
            if rows:
                with cur.copy(
                    f"COPY {st} (gpu_id, time, gpu_util, mem_util, mem_used_mib, "
                    "temperature_c, power_w) FROM STDIN"
                ) as copy:
                    copy.write(_copy_text(rows))
                out.samples += len(rows)
            if order:
                # Guarded on sampled_at: a slow heartbeat written meanwhile is newer and wins.
                cur.execute(
                    f"UPDATE {gt} AS g SET sampled_at = v.t, "
                    "utilisation = COALESCE(v.util, g.utilisation), "
                    "memory_used_mib = COALESCE(v.mem, g.memory_used_mib), "
                    "idle_since = CASE v.mode WHEN 'k' THEN COALESCE(g.idle_since, v.idle) "
                    "WHEN 's' THEN v.idle ELSE NULL END, "
                    "temperature_c = COALESCE(v.temp, g.temperature_c), power_w = COALESCE(v.power, g.power_w) "
                    "FROM unnest(%s::text[], %s::timestamptz[], %s::float8[], %s::int8[], "
                    "%s::text[], %s::timestamptz[], %s::float8[], %s::float8[]) "
                    "AS v(uuid, t, util, mem, mode, idle, temp, power) "
                    "WHERE g.uuid = v.uuid AND (g.sampled_at IS NULL OR g.sampled_at <= v.t)",
                    g_cols,
                )
                out.gpus += cur.rowcount
        measured = {h: m for h, m in measured.items() if h in found}
        if measured:
            volumes_measured.send(sender=Host, measured=measured)
    out.heartbeats += len(records)
