"""The agent's persistent state: who this host is to the control plane.

Kept in ``<state dir>/host.json`` (mode 0600, written atomically) so a restarted agent
heartbeats with its host token instead of registering again (bootstrap tokens are
single-use).

Until it holds them, ``<state dir>/register-nonce`` (mode 0600) keeps the registration
nonce of its current sequence of attempts with the bootstrap token: an attempt whose answer
was lost (a timeout after the control plane had consumed the token) is repeated with the
same nonce, and the control plane answers it with the same host again. Removed once the
host token is saved; a later registration (say after a 401) starts with a new one.
"""

from __future__ import annotations

import json
import os
import secrets
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final

STATE_FILE: Final = "host.json"
NONCE_FILE: Final = "register-nonce"
_NONCE_BYTES: Final = 32  # 256 bits: 43 URL-safe characters


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
    _write_secret(state_dir, STATE_FILE, json.dumps(asdict(state)))


def _write_secret(state_dir: Path, name: str, text: str) -> None:
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(dir=state_dir, prefix=f".{name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:  # mkstemp: mode 0600 from the start
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, state_dir / name)  # atomic: never a half-written secret
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def registration_nonce(state_dir: Path) -> str:
    """The nonce of this sequence of registration attempts: the saved one, else a new one,
    saved before it is first sent (so an agent restarted mid-sequence repeats it too)."""
    try:
        nonce = (state_dir / NONCE_FILE).read_text().strip()
    except OSError:
        nonce = ""
    if len(nonce) < 32:  # absent, unreadable or damaged: a new sequence
        nonce = secrets.token_urlsafe(_NONCE_BYTES)
        _write_secret(state_dir, NONCE_FILE, nonce)
    return nonce


def clear_registration_nonce(state_dir: Path) -> None:
    (state_dir / NONCE_FILE).unlink(missing_ok=True)


def clear_state(state_dir: Path) -> None:
    (state_dir / STATE_FILE).unlink(missing_ok=True)
