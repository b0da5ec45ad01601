"""Django's Redis cache, with one Redis client per connection pool instead of one per call.

Django's `RedisCacheClient.get_client` makes a new `redis.Redis` for every cache operation,
and building one (its table of response callbacks) cost more CPU than the operation: three of
them per API launch (the rate limit's and the cycle trigger's calls). A `redis.Redis` is safe
to share (it takes a connection from its pool per command), so it is made once per pool.
Everything else (keys, serialisation, timeouts) is Django's.
"""
from __future__ import annotations

from typing import Any

from django.core.cache.backends.redis import RedisCache as DjangoRedisCache
from django.core.cache.backends.redis import RedisCacheClient as DjangoRedisCacheClient


class RedisCacheClient(DjangoRedisCacheClient):
    def get_client(self, key: Any = None, *, write: bool = False) -> Any:
        pool = self._get_connection_pool(write)
        clients: dict[int, Any] = self.__dict__.setdefault("_clients", {})
        client = clients.get(id(pool))
        if client is None:
            client = clients[id(pool)] = self._client(connection_pool=pool)
        return client


class RedisCache(DjangoRedisCache):
    def __init__(self, server: Any, params: dict[str, Any]) -> None:
        super().__init__(server, params)
        self._class = RedisCacheClient
