"""Tiny helpers that read settings from the environment and fail loudly.

A typo in a boolean or a number must stop the process at start-up, not
silently fall back to a default the operator did not ask for.
"""
from __future__ import annotations

import os
from decimal import Decimal, InvalidOperation

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class EnvError(ValueError):
    pass


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise EnvError(f"{name}={raw!r} is not a boolean (use 1/0, true/false, yes/no, on/off)")


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise EnvError(f"{name}={raw!r} is not an integer") from None


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_decimal(name: str, default: str) -> Decimal:
    """A money amount or fraction, read exactly (never through float)."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        raw = default
    try:
        return Decimal(raw.strip())
    except InvalidOperation:
        raise EnvError(f"{name}={raw!r} is not a decimal number") from None
