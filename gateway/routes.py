"""The tunnel routing table (which gateway replica holds each host's tunnel) and wake-ups.

In Redis (`gateway:route:<host id>` → replica name) with an expiry, refreshed while the
tunnel is up, so a replica that dies stops being named within `ttl_s`; beside it each
replica's relay address (`gateway:replica:<name>` → `host:port`, gateway/relay.py), the same way. Without Redis (the
demo's single gateway) the table is this process's own dict.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import redis.asyncio as aioredis

logger = logging.getLogger(__name__)

# The wake-up channel is part of the agent protocol (the control plane publishes on it).
from agents.protocol import WAKE_PREFIX, wake_channel  # noqa: E402,F401


class Routes:
    ttl_s = 30.0

    def __init__(self, redis_url: str, *, replica: str) -> None:
        self.replica = replica
        self._redis = aioredis.from_url(redis_url) if redis_url else None
        self._local: dict[str, str] = {}
        self._pubsub: aioredis.client.PubSub | None = None
        self._watched: set[str] = set()

    @staticmethod
    def key(host_id: str) -> str:
        return f"gateway:route:{host_id}"

    async def claim(self, host_id: str) -> None:
        if self._redis is None:
            self._local[host_id] = self.replica
        else:
            await self._redis.set(self.key(host_id), self.replica, ex=int(self.ttl_s))

    async def release(self, host_id: str) -> None:
        """Forget the route, unless another replica has claimed it since."""
        if self._redis is None:
            self._local.pop(host_id, None)
            return
        key = self.key(host_id)
        if (await self._redis.get(key)) == self.replica.encode():
            await self._redis.delete(key)

    async def lookup(self, host_id: str) -> str | None:
        if self._redis is None:
            return self._local.get(host_id)
        value = await self._redis.get(self.key(host_id))
        return value.decode() if value else None

    # ------------------------------------------------------------------ replicas' relay addresses

    @staticmethod
    def replica_key(replica: str) -> str:
        return f"gateway:replica:{replica}"

    async def advertise(self, address: str) -> None:
        """Where other replicas reach this one's relay port (`host:port`), with the routes' expiry."""
        if self._redis is None:
            self._local[self.replica_key(self.replica)] = address
        else:
            await self._redis.set(self.replica_key(self.replica), address, ex=int(self.ttl_s))

    async def withdraw(self) -> None:
        if self._redis is None:
            self._local.pop(self.replica_key(self.replica), None)
        else:
            await self._redis.delete(self.replica_key(self.replica))

    async def address_of(self, replica: str) -> str | None:
        if self._redis is None:
            return self._local.get(self.replica_key(replica))
        value = await self._redis.get(self.replica_key(replica))
        return value.decode() if value else None

    # ------------------------------------------------------------------ sessions per tenant

    # A tenant's open sessions across every replica: a sorted set of `<replica>/<session>`
    # scored by the time its lease ends. Admission drops the lapsed leases (a replica that
    # died stops counting within `ttl_s`) and adds the session only under the limit, in one
    # atomic step, so two replicas admitting at once cannot both take the last place.
    _ADMIT = """
    redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
    if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
    redis.call('ZADD', KEYS[1], ARGV[3], ARGV[4])
    redis.call('EXPIRE', KEYS[1], ARGV[5])
    return 1
    """

    @staticmethod
    def sessions_key(tenant_id: str) -> str:
        return f"gateway:sessions:{tenant_id}"

    async def session_admit(self, tenant_id: str, session: str, *, limit: int, now: float) -> bool | None:
        """Count `session` against its tenant's limit on every replica; None without Redis
        (the caller counts this replica's own)."""
        if self._redis is None:
            return None
        admitted = await self._redis.eval(  # type: ignore[misc]
            self._ADMIT, 1, self.sessions_key(tenant_id), now, limit, now + self.ttl_s,
            f"{self.replica}/{session}", int(self.ttl_s * 2))
        return bool(admitted)

    async def session_renew(self, held: list[tuple[str, str]], *, now: float) -> None:
        """Extend the leases of this replica's open sessions ((tenant id, session) pairs)."""
        if self._redis is None or not held:
            return
        async with self._redis.pipeline(transaction=False) as pipe:
            for tenant_id, session in held:
                pipe.zadd(self.sessions_key(tenant_id), {f"{self.replica}/{session}": now + self.ttl_s}, xx=True)
                pipe.expire(self.sessions_key(tenant_id), int(self.ttl_s * 2))
            await pipe.execute()

    async def session_release(self, tenant_id: str, session: str) -> None:
        if self._redis is not None:
            await self._redis.zrem(self.sessions_key(tenant_id), f"{self.replica}/{session}")

    async def close(self) -> None:
        pubsub, self._pubsub = self._pubsub, None  # tunnels closing after this unsubscribe nothing
        if pubsub is not None:
            await pubsub.aclose()
        if self._redis is not None:
            await self._redis.aclose()

    # ------------------------------------------------------------------ wake-ups

    async def listen_wakes(self, wake: Callable[[str], Awaitable[object]]) -> None:
        """Forward wake-ups for the hosts this replica holds (subscribed in `watch`) to
        `wake(host id)`, until cancelled. Redis errors: logged, then retried."""
        if self._redis is None:
            return
        while True:
            try:
                if self._pubsub is None:
                    self._pubsub = self._redis.pubsub()
                    # Always one subscription (the replica's own), so reading never fails
                    # for want of one; the hosts' channels come and go with their tunnels.
                    await self._pubsub.subscribe(f"{WAKE_PREFIX}replica:{self.replica}",
                                                 *(wake_channel(h) for h in self._watched))
                msg = await self._pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                if msg is not None and msg.get("type") == "message":
                    channel = msg["channel"].decode()
                    await wake(channel[len(WAKE_PREFIX):])
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("wake-up listener failed; resubscribing")
                pubsub, self._pubsub = self._pubsub, None
                if pubsub is not None:
                    await pubsub.aclose()
                await asyncio.sleep(1.0)

    async def watch(self, host_id: str, on: bool) -> None:
        """Listen (or stop listening) for `host_id`'s wake-ups: while its tunnel is here."""
        self._watched = self._watched | {host_id} if on else self._watched - {host_id}
        if self._pubsub is None:
            return  # subscribed when the listener (re)connects
        try:
            if on:
                await self._pubsub.subscribe(wake_channel(host_id))
            else:
                await self._pubsub.unsubscribe(wake_channel(host_id))
        except Exception:
            logger.exception("wake-up subscription for host %s failed", host_id)
