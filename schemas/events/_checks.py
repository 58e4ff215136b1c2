"""What every event checks at construction: an invalid event can be neither produced nor decoded."""

from __future__ import annotations

from datetime import UTC, datetime

from schemas.errors import InvalidEvent

ROLLOUT_STATUSES = frozenset({"succeeded", "failed", "timeout", "cancelled", "lost"})
CALL_STATUSES = frozenset({"ok", "error"})
ROLLOUT_STATUS_RULE = f"status must be one of {sorted(ROLLOUT_STATUSES)}"
CALL_STATUS_RULE = f"status must be one of {sorted(CALL_STATUSES)}"


def utcnow() -> datetime:
    return datetime.now(UTC)


def require(ok: bool, event: object, message: str) -> None:
    if not ok:
        raise InvalidEvent(f"{type(event).__name__}: {message}")


def require_ids(event: object, *names: str) -> None:
    for name in names:
        if not getattr(event, name):  # the message is built only for a failure: events are built by the thousand
            require(False, event, f"{name} must not be empty")


def require_aware(event: object, *names: str) -> None:
    for name in names:
        if getattr(event, name).tzinfo is None:
            require(False, event, f"{name} must be timezone-aware")
