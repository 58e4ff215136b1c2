"""A record no consumer could read, kept with its bytes and the reason."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from schemas.events._checks import utcnow


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadLetter:
    topic: str
    partition: int
    offset: int
    reason: str
    error_type: str
    consumer: str
    key: bytes | None = None
    value: bytes | None = None
    dead_at: datetime = field(default_factory=utcnow)
