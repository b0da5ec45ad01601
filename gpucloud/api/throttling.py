"""Per-key rate limits, counted in the shared cache (Redis in production).

A request with an API key is counted against that key (a key may carry its own
limit); a browser session against its user; anonymous reads against the address.
"""
from __future__ import annotations

from rest_framework.throttling import SimpleRateThrottle


class PerKeyThrottle(SimpleRateThrottle):
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
