"""A Docker engine's error text -> a reason a person reads (pure).

An image that cannot be pulled fails its start with the engine's own words, which say the
same thing five ways (``pull access denied ... may require 'docker login'``, ``manifest
unknown``, ``dial tcp: lookup ... no such host``...). ``start_error_reason`` names the cause
and what to do, and keeps the engine's words after it (clipped) for whoever digs further:

    cause                    engine text (any of)                                 says
    -----------------------  ---------------------------------------------------  -------------------------
    disk full                no space left on device                              the host's disk is full
    unauthorized             unauthorized, authentication required, no basic auth  add registry credentials
                             credentials, denied: requested access
    not found                manifest unknown, not found: manifest, repository    check the name and tag
                             does not exist, pull access denied
    registry unreachable     no such host, connection refused, i/o timeout,       the registry cannot be
                             Client.Timeout, network is unreachable, TLS          reached from the host
                             handshake timeout, x509
    rate limited             toomanyrequests                                      try later or log in
    bad reference            invalid reference format                             the reference is malformed
    anything else            (unchanged)

Rows are tried in that order: Docker Hub answers "pull access denied ... does not exist or may
require 'docker login'" for both a missing and a private repository, so it reads as *not
found, or private*; an explicit ``unauthorized`` is a credentials problem.
"""

from __future__ import annotations

from typing import Final

# (cause, the reason's words, lower-case fragments of the engine's text), in order.
_TABLE: Final[tuple[tuple[str, str, tuple[str, ...]], ...]] = (
    ("disk_full", "the host's disk is full: the image could not be stored (the operator must free space)",
     ("no space left on device",)),
    ("unauthorized", "the registry refused access: add credentials for it, or check that the image is yours "
                     "to pull",
     ("unauthorized", "authentication required", "no basic auth credentials", "incorrect username or password")),
    ("not_found", "image not found: check the name and tag (a private image also needs credentials)",
     ("manifest unknown", "not found: manifest", "repository does not exist", "pull access denied",
      "requested access to the resource is denied", "name unknown")),
    ("unreachable", "the image's registry cannot be reached from the host (name not found, refused or timed "
                    "out): check the registry's address, or try again later",
     ("no such host", "connection refused", "i/o timeout", "client.timeout", "network is unreachable",
      "tls handshake timeout", "x509:", "connection reset by peer", "server misbehaving")),
    ("rate_limited", "the registry's pull rate limit was reached: try again later, or pull with credentials",
     ("toomanyrequests", "too many requests")),
    ("bad_reference", "the image reference is malformed", ("invalid reference format",)),
)
ENGINE_WORDS_MAX: Final = 240


def start_error_cause(text: str) -> str | None:
    """The cause of an engine error (a `_TABLE` row's name); None: none of them."""
    low = text.lower()
    for cause, _, needles in _TABLE:
        if any(n in low for n in needles):
            return cause
    return None


def start_error_reason(image: str, text: str) -> str:
    """What to tell the owner of a start of ``image`` that failed with the engine's ``text``:
    the cause in words and the engine's words after it; ``text`` itself for any other error."""
    cause = start_error_cause(text)
    if cause is None:
        return text
    words = next(w for c, w, _ in _TABLE if c == cause)
    engine = " ".join(text.split())
    if len(engine) > ENGINE_WORDS_MAX:
        engine = engine[: ENGINE_WORDS_MAX - 1] + "…"
    return f"{image}: {words} (engine: {engine})"
