"""Per-key rate limits, counted atomically in Redis (gpucloud.lib.ratelimit).

A request with an API key is counted against that key (a key may carry its own
limit); a browser session against its user; anonymous requests (sign-up, the catalogue)
against the client's address as `gpucloud.lib.http.client_ip` finds it: REMOTE_ADDR, or
the address the trusted proxies saw (TRUSTED_PROXY_HOPS), never a header the client wrote.
"""
from __future__ import annotations

from rest_framework.settings import api_settings
from rest_framework.throttling import SimpleRateThrottle

from gpucloud.lib import ratelimit
from gpucloud.lib.http import client_ip


class AtomicRateThrottle(SimpleRateThrottle):
    """rest_framework's sliding log (`scope`'s rate, "N/period"), checked and counted in one
    atomic step, so concurrent requests cannot pass the limit between a read and a write."""

    def get_rate(self) -> str | None:
        # Read when the request comes, not at import (DRF keeps the dict of its first import).
        return api_settings.DEFAULT_THROTTLE_RATES.get(self.scope)

    def parse_rate(self, rate: str | None) -> tuple[int | None, int | None]:
        return (None, None) if rate is None else ratelimit.parse_rate(rate)

    def get_ident(self, request) -> str:
        return client_ip(request) or "unknown"

    def allow_request(self, request, view) -> bool:
        if self.rate is None:
            return True
        self.key = self.get_cache_key(request, view)
        if self.key is None:
            return True
        decision = ratelimit.hit(key=self.key, limit=self.num_requests, window_s=self.duration)
        self.retry_after_s = decision.retry_after_s
        return decision.allowed

    def wait(self) -> float | None:
        return getattr(self, "retry_after_s", None)


class PerKeyThrottle(AtomicRateThrottle):
    scope = "per_key"

    def get_cache_key(self, request, view):
        key = getattr(request, "api_key", None)
        if key is not None:
            ident = f"key:{key.pk}"
        elif request.user and request.user.is_authenticated:
            ident = f"user:{request.user.pk}"
        else:
            ident = f"ip:{self.get_ident(request)}"
        return self.cache_format % {"scope": self.scope, "ident": ident}

    def allow_request(self, request, view):
        key = getattr(request, "api_key", None)
        if key is not None and key.rate_limit_per_min:
            self.num_requests, self.duration = key.rate_limit_per_min, 60
        return super().allow_request(request, view)


class SignupThrottle(PerKeyThrottle):
    """Sign-ups per client address (`SIGNUP_RATE_LIMIT`), for the API and the console alike.

    Counted in the same shared cache and by the same address rule as `PerKeyThrottle`'s
    anonymous requests; a request without a session or key is all a sign-up ever is.
    """

    scope = "signup"

    def get_cache_key(self, request, view):
        return self.cache_format % {"scope": self.scope, "ident": f"ip:{self.get_ident(request)}"}
