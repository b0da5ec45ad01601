"""The tunnel routing table: which gateway replica holds each host's tunnel.

In Redis (`gateway:route:<host id>` → replica name) with an expiry, refreshed while the
tunnel is up, so a replica that dies stops being named within `ttl_s`. Without Redis (the
demo's single gateway) the table is this process's own dict.
"""
from __future__ import annotations

import redis.asyncio as aioredis


class Routes:
    ttl_s = 30.0

    def __init__(self, redis_url: str, *, replica: str) -> None:
        self.replica = replica
        self._redis = aioredis.from_url(redis_url) if redis_url else None
        self._local: dict[str, str] = {}

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

    async def close(self) -> None:
        if self._redis is not None:
            await self._redis.aclose()
