"""Container image references: the Docker reference grammar, checked at launch (pure).

The grammar is the engine's own (github.com/distribution/reference, regexp.go):

    reference   := name [ ":" tag ] [ "@" digest ]
    name        := [ domain "/" ] path-component [ "/" path-component ]*
    domain      := host [ ":" port ]          host: DNS labels (a-z A-Z 0-9 -) joined by ".", or [IPv6]
    path-comp.  := [a-z0-9]+ ( ( "." | "_" | "__" | "-"+ ) [a-z0-9]+ )*
    tag         := [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}
    digest      := "sha256:" 64 lower-case hex         (the only digest engines pull by)

A first component is a domain when it has a "." or ":" or is "localhost" (as the engine reads
it); a name is at most 255 characters. Checked once, here: the API's instances, jobs, job arrays
and autoscaling groups (and the console, which posts through the same serializers) call
`image_reference_problem`; a reference that fails gets a 400 naming what is wrong instead of a
201 and a failure at the host minutes later.
"""
from __future__ import annotations

import re
from typing import Final

_ALNUM = r"[a-z0-9]+"
_SEP = r"(?:[._]|__|-+)"
_PATH_COMPONENT = rf"{_ALNUM}(?:{_SEP}{_ALNUM})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])"
_DOMAIN = rf"{_HOST}(?::[0-9]+)?"
_NAME: Final = re.compile(rf"(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*")
_TAG: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_DIGEST: Final = re.compile(r"sha256:[0-9a-f]{64}")
NAME_MAX: Final = 255
# (the words the API, the console and the CLI have always said for it)
NOT_A_REFERENCE: Final = "Not a container image reference."


def image_reference_problem(ref: str) -> str | None:
    """What is wrong with image reference `ref`, in a sentence; None when the engine accepts it."""
    if not ref or any(c.isspace() for c in ref):
        return NOT_A_REFERENCE
    rest, at, digest = ref.partition("@")
    if at and not _DIGEST.fullmatch(digest):
        return "A digest is sha256: followed by 64 lower-case hex digits (name@sha256:<64 hex digits>)."
    name, tag = rest, ""
    slash, colon = rest.rfind("/"), rest.rfind(":")
    if colon > slash:  # a colon after the last slash is a tag (before it, a registry's port)
        name, tag = rest[:colon], rest[colon + 1:]
        if not _TAG.fullmatch(tag):
            return "A tag is up to 128 letters, digits, _ . - (not starting with . or -)."
    if len(name) > NAME_MAX:
        return f"An image name is at most {NAME_MAX} characters."
    first, _, remainder = name.partition("/")
    has_domain = bool(remainder) and ("." in first or ":" in first or first == "localhost")
    path = remainder if has_domain else name
    if path != path.lower():
        return "A repository name is lower case."
    if not _NAME.fullmatch(name) or (not has_domain and not re.fullmatch(
            rf"{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*", name)):
        return NOT_A_REFERENCE
    return None
