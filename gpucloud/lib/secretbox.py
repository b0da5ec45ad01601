"""Secrets the platform must read back (a webhook's signing key), encrypted at rest.

Fernet (AES-128-CBC + HMAC-SHA256, from `cryptography`) under a key derived from SECRET_KEY,
so a database dump alone does not give them away. Rotating SECRET_KEY makes sealed values
unreadable: `open_sealed` raises `SealedError`, and the owner creates a new secret.
Secrets are never logged; only `seal`'s output is stored.
"""
from __future__ import annotations

import base64
import hashlib

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings


class SealedError(ValueError):
    """The sealed value cannot be opened (another SECRET_KEY, or not ours)."""


def _box() -> Fernet:
    key = hashlib.sha256(b"gpucloud.secretbox\x00" + settings.SECRET_KEY.encode()).digest()
    return Fernet(base64.urlsafe_b64encode(key))


def seal(secret: str) -> str:
    return _box().encrypt(secret.encode()).decode()


def open_sealed(sealed: str) -> str:
    try:
        return _box().decrypt(sealed.encode()).decode()
    except InvalidToken:
        raise SealedError("the secret cannot be decrypted with this SECRET_KEY") from None
