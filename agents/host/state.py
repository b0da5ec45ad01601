"""The agent's persistent state: who this host is to the control plane.

Kept in ``<state dir>/host.json`` (mode 0600, written atomically) so a restarted agent
heartbeats with its host token instead of registering again (bootstrap tokens are
single-use).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final

STATE_FILE: Final = "host.json"


@dataclass(frozen=True)
class HostState:
    server: str
    host_id: str
    host_token: str


def load_state(state_dir: Path, server: str) -> HostState | None:
    """The saved identity for ``server``; None if absent, unreadable or for another server."""
    try:
        data = json.loads((state_dir / STATE_FILE).read_text())
        state = HostState(
            server=data["server"], host_id=data["host_id"], host_token=data["host_token"]
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return state if state.server == server else None


def save_state(state_dir: Path, state: HostState) -> None:
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(dir=state_dir, prefix=".host.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(asdict(state), f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, state_dir / STATE_FILE)  # atomic: never a half-written token
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def clear_state(state_dir: Path) -> None:
    (state_dir / STATE_FILE).unlink(missing_ok=True)
