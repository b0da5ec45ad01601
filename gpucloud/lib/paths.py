"""Paths a tenant gives for inside a container (a volume's mount path): one check for all of them.

The rule is written once here and used by the API's `ContainerPathField`, the console's form
field and the volumes service. Order matters, and is the point of this module: the path is
first required to be *already normal* (absolute, no `.` or `..` segment, no segment of dots
only, no repeated or trailing slash once one trailing slash is taken off, no NUL, the plain
character set), and only then compared with the denied trees, by whole path components. A
check on the raw string alone let `/./proc`, `/.`, `/var/./run/docker.sock` and `/.../proc`
through (issue 27, finding 3): the runtime resolved them to system trees and refused to start,
over and over, while the workload held its GPUs.
"""
from __future__ import annotations

import posixpath
import re

MAX_LENGTH = 200
# one path segment: letters, digits, . _ - (no spaces, no shell or glob characters)
_SEGMENT = re.compile(r"^[A-Za-z0-9._-]+$")
# The container's own system trees: a volume over one of them breaks the container or the
# runtime refuses it. Compared by whole components: /proc and /proc/x are refused, /procs is not.
DENIED_TREES: tuple[str, ...] = (
    "/proc", "/sys", "/dev", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/usr",
    "/run", "/tmp", "/var/run", "/var/lock", "/boot",
)


class PathError(ValueError):
    """The path is refused; the message says why, in words for the user."""


def _parts(path: str) -> tuple[str, ...]:
    return tuple(p for p in path.split("/") if p)


def is_denied(path: str) -> bool:
    """Is `path` (normal, absolute) the root, or one of the denied trees or inside one?"""
    parts = _parts(path)
    return not parts or any(parts[:len(d)] == d for d in map(_parts, DENIED_TREES))


def container_path(value: str) -> str:
    """`value` as a normal absolute path outside the system trees, or PathError.

    Accepted values come back normal (`posixpath.normpath(result) == result`); a single trailing
    slash is the only thing taken off, everything else that is not normal is refused rather
    than repaired, so what the user sees stored is what they typed."""
    if not isinstance(value, str) or not value:
        raise PathError("Give an absolute path such as /workspace.")
    if "\x00" in value:
        raise PathError("A path cannot contain a NUL character.")
    if len(value) > MAX_LENGTH:
        raise PathError(f"At most {MAX_LENGTH} characters.")
    if not value.startswith("/"):
        raise PathError("An absolute path such as /workspace (it starts with /).")
    path = value[:-1] if len(value) > 1 and value.endswith("/") else value
    segments = path.split("/")[1:]
    if any(s == "" for s in segments) and path != "/":
        raise PathError("No empty segments: one slash between names (/data/x, not /data//x).")
    if any(set(s) == {"."} for s in segments):
        raise PathError("No . or .. segments (nor names of dots only): give the path itself, e.g. /data/x.")
    if path != "/" and not all(_SEGMENT.match(s) for s in segments):
        raise PathError("An absolute path such as /workspace (letters, digits, . _ -).")
    if posixpath.normpath(path) != path:  # the rules above make it so; this keeps it so
        raise PathError("Give the path in its plain form, e.g. /data/x.")
    if is_denied(path):
        raise PathError("Not the root nor a system directory; use e.g. /workspace or /data.")
    return path
