"""Rollout tokens: the API key a harness gets, binding every call it makes to its own rollout.

A token is `tr2.<rollout id, base64url>.<issued at, unix seconds>.<HMAC-SHA256 of both with the gateway
secret, base64url>`. The controller mints it, the gateway verifies it; neither needs to remember it. The
issue time bounds where a gateway that does not hold the rollout starts reading its history in the log.
A rollout whose sampling temperature the controller pins (a validation rollout, greedy) gets
`tr3.<id>.<issued at>.<temperature in thousandths>.<HMAC of all three>`: every gateway replica applies it to
every call of the rollout, after a restart too, and the harness cannot change it. A rollout with a seed
(`schemas.seeds`) gets `tr4.<id>.<issued at>.<temperature in thousandths, or empty>.<seed>.<HMAC of all
four>`: every replica derives the seeds of the rollout's unseeded calls from it. Tokens of the first form,
`tr1.<id>.<HMAC of the id>`, still verify (with no issue time).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import time
from dataclasses import dataclass

from schemas.seeds import MAX_SEED

PREFIX = "tr2"
_PINNED = "tr3"
_SEEDED = "tr4"
_V1 = "tr1"
MAX_TEMPERATURE = 2.0  # the most any API the gateway serves accepts
_MAX_ISSUED = 2**63 - 1  # unix seconds, as a long holds them
_MILLI = 1000  # a pinned temperature is written in thousandths: digits only, no dot in a dotted token

#: Built-in so that tests and `tether up` on one machine need no set-up; anyone can read them here. The gateway
#: refuses to listen beyond loopback while either is in use (`GatewaySettings.check_exposure`). Kept here, where
#: the gateway (which verifies tokens and guards /admin) and the controller (which mints them) already meet.
DEVELOPMENT_SECRET = "tether-dev-secret"
DEVELOPMENT_ADMIN_KEY = "tether-dev-admin"


@dataclass(frozen=True, slots=True)
class Claims:
    rollout_id: str
    issued_at: int | None  # unix seconds; None for a tr1 token
    temperature: float | None = None  # pinned for every call of the rollout; None: the harness's own
    seed: int | None = None  # the rollout's: unseeded calls' seeds are derived from it; None: none


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


#: A secret holds no NUL: HMAC pads its key with zero bytes, so `k` and `k` + NUL would be one key (settings that
#: take a secret use this pattern; a token is neither minted nor verified with such a secret).
SECRET_PATTERN = "^[^\\x00]+$"


def usable_secret(secret: str) -> bool:
    return bool(secret) and "\x00" not in secret


def _signature(message: str, secret: str) -> bytes:
    return hmac.new(secret.encode(), message.encode(), hashlib.sha256).digest()


def pinned(temperature: float) -> float:
    """The temperature a token pins for `temperature`: to the thousandth."""
    if not 0.0 <= temperature <= MAX_TEMPERATURE:  # NaN fails too
        raise ValueError(f"a pinned temperature is a number from 0 to {MAX_TEMPERATURE}, not {temperature!r}")
    return round(temperature * _MILLI) / _MILLI


def _temperature(text: str) -> float | None:
    """A pinned temperature as a token writes it (thousandths, canonical digits), or None if it is not one."""
    if not (text.isascii() and text.isdigit()) or (len(text) > 1 and text[0] == "0") or len(text) > 4:
        return None
    value = int(text)
    return value / _MILLI if value <= MAX_TEMPERATURE * _MILLI else None


def _number(text: str, most: int) -> int | None:
    """A number as a token writes it (canonical ASCII decimal digits, at most `most`), or None if it is not one:
    never int() of a string longer than `most` could be (thousands of digits raise instead of returning)."""
    if not (text.isascii() and text.isdigit()) or (len(text) > 1 and text[0] == "0") or len(text) > len(str(most)):
        return None
    value = int(text)
    return value if value <= most else None


def mint(rollout_id: str, secret: str, issued_at: int | None = None, temperature: float | None = None,
         seed: int | None = None) -> str:
    if not rollout_id or not secret:
        raise ValueError("rollout_id and secret must not be empty")
    if not usable_secret(secret):
        raise ValueError("a secret must not contain NUL (HMAC would take it for a shorter one)")
    issued = int(time.time()) if issued_at is None else issued_at
    if seed is not None:
        if not 0 <= seed <= MAX_SEED:
            raise ValueError(f"a rollout's seed is from 0 to {MAX_SEED}, not {seed!r}")
        milli = str(round(pinned(temperature) * _MILLI)) if temperature is not None else ""
        signature = _signature(f"{_SEEDED}|{issued}|{milli}|{seed}|{rollout_id}", secret)
        return f"{_SEEDED}.{_b64(rollout_id.encode())}.{issued}.{milli}.{seed}.{_b64(signature)}"
    if temperature is not None:
        milli = str(round(pinned(temperature) * _MILLI))
        signature = _signature(f"{_PINNED}|{issued}|{milli}|{rollout_id}", secret)
        return f"{_PINNED}.{_b64(rollout_id.encode())}.{issued}.{milli}.{_b64(signature)}"
    signature = _signature(f"{PREFIX}|{issued}|{rollout_id}", secret)
    return f"{PREFIX}.{_b64(rollout_id.encode())}.{issued}.{_b64(signature)}"


def claims(token: str, secret: str) -> Claims | None:
    """What a valid token says, or None if it is not a valid token for this secret."""
    if not usable_secret(secret):
        return None
    parts = token.split(".")
    try:
        rollout_id = _unb64(parts[1]).decode() if len(parts) in (3, 4, 5, 6) else ""
        signature = _unb64(parts[-1])
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    if not rollout_id:
        return None
    temperature: float | None = None
    seed: int | None = None
    if len(parts) == 3 and parts[0] == _V1:
        message, issued = rollout_id, None
    elif len(parts) == 4 and parts[0] == PREFIX and (issued := _number(parts[2], _MAX_ISSUED)) is not None:
        message = f"{PREFIX}|{issued}|{rollout_id}"
    elif (len(parts) == 5 and parts[0] == _PINNED and (issued := _number(parts[2], _MAX_ISSUED)) is not None
          and (temperature := _temperature(parts[3])) is not None):
        message = f"{_PINNED}|{issued}|{parts[3]}|{rollout_id}"
    elif (len(parts) == 6 and parts[0] == _SEEDED and (issued := _number(parts[2], _MAX_ISSUED)) is not None
          and (parts[3] == "" or (temperature := _temperature(parts[3])) is not None)
          and (seed := _number(parts[4], MAX_SEED)) is not None):
        message = f"{_SEEDED}|{issued}|{parts[3]}|{seed}|{rollout_id}"
    else:
        return None
    if not hmac.compare_digest(signature, _signature(message, secret)):
        return None
    return Claims(rollout_id, issued, temperature, seed)


def verify(token: str, secret: str) -> str | None:
    """The rollout id the token was minted for, or None if it is not a valid token for this secret."""
    found = claims(token, secret)
    return found.rollout_id if found is not None else None
