"""Profiles in ~/.config/gpucloud/config.toml (mode 0600), overridden by GPUCLOUD_URL / GPUCLOUD_API_KEY.

    default_profile = "default"

    [profiles.default]
    url = "https://gpucloud.example.com"
    api_key = "gpc_..."
"""
from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w


def config_path() -> Path:
    if os.environ.get("GPUCLOUD_CONFIG"):
        return Path(os.environ["GPUCLOUD_CONFIG"])
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "gpucloud" / "config.toml"


@dataclass(frozen=True)
class Profile:
    name: str
    url: str | None
    api_key: str | None

    def __repr__(self) -> str:  # never the key
        return f"Profile(name={self.name!r}, url={self.url!r}, api_key={'***' if self.api_key else None})"


def load() -> dict[str, Any]:
    path = config_path()
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        return {}


def save(data: dict[str, Any]) -> Path:
    """Write the file 0600 (its directory 0700), replacing it atomically: it holds API keys."""
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # also when the umask or an older file said otherwise
        with os.fdopen(fd, "wb") as f:
            tomli_w.dump(data, f)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)
    return path


def profile_name(explicit: str | None = None, data: dict[str, Any] | None = None) -> str:
    data = load() if data is None else data
    return explicit or os.environ.get("GPUCLOUD_PROFILE") or str(data.get("default_profile") or "default")


def resolve(explicit: str | None = None) -> Profile:
    """The profile in use, with the environment's overrides applied."""
    data = load()
    name = profile_name(explicit, data)
    stored = data.get("profiles", {}).get(name, {})
    return Profile(
        name=name,
        url=os.environ.get("GPUCLOUD_URL") or stored.get("url"),
        api_key=os.environ.get("GPUCLOUD_API_KEY") or stored.get("api_key"),
    )


def store(name: str, *, url: str, api_key: str, make_default: bool) -> Path:
    data = load()
    data.setdefault("profiles", {})[name] = {"url": url, "api_key": api_key}
    if make_default or "default_profile" not in data:
        data["default_profile"] = name
    return save(data)
