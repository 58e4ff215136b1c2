"""Rollout tokens: the API key a harness gets, binding every call it makes to its own rollout.

A token is `tr1.<rollout id, base64url>.<HMAC-SHA256 of the id with the gateway secret, base64url>`.
The controller mints it, the gateway verifies it; neither needs to remember it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac

PREFIX = "tr1"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _signature(rollout_id: str, secret: str) -> bytes:
    return hmac.new(secret.encode(), rollout_id.encode(), hashlib.sha256).digest()


def mint(rollout_id: str, secret: str) -> str:
    if not rollout_id or not secret:
        raise ValueError("rollout_id and secret must not be empty")
    return f"{PREFIX}.{_b64(rollout_id.encode())}.{_b64(_signature(rollout_id, secret))}"


def verify(token: str, secret: str) -> str | None:
    """The rollout id the token was minted for, or None if it is not a valid token for this secret."""
    parts = token.split(".")
    if len(parts) != 3 or parts[0] != PREFIX:
        return None
    try:
        rollout_id = _unb64(parts[1]).decode()
        signature = _unb64(parts[2])
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    return rollout_id if rollout_id and hmac.compare_digest(signature, _signature(rollout_id, secret)) else None
